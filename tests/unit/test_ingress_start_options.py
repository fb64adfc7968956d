"""Ingress's start options in the orders of events an adversarial review found
(docs/configuration.md, "Where replication starts"): a `latest` start kept across restarts
and failed checkpoints and counted whole, a first-position entry that is only late.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ingress.events import SegmentEvent
from tests.unit.test_ingress_incarnations import new_key, write_new
from tests.unit.test_ingress_incarnations import topic_json as incarnations_json
from tests.unit.test_ingress_worker import Harness, key, topic_json, write


def latest(h: Harness) -> Harness:
    h.cfg = replace(h.cfg, source=h.cfg.source.model_copy(update={"start": "latest"}))
    return h


def test_latest_on_an_empty_bucket_keeps_its_choice_across_a_restart() -> None:
    h = latest(Harness())
    try:
        topic_json(h.store, {"3": 100})
        w = h.start()
        h.wait(lambda: w.replaying)               # first plan: nothing in the bucket
        time.sleep(0.3)
        # S3 replication keeps no order: the second segment arrives first and the worker
        # waits for 100-149 (lost_segment_timeout, 24h by default) with no checkpoint.
        write(h.store, key(150, 199))
        w.offer(SegmentEvent("created", key(150, 199)))
        h.wait(lambda: h.metric("replicator_ingress_segments_late") == 50)
        h.stop()                                  # a rolling update, an ingress rebalance
        w = h.start()
        h.wait(lambda: w.replaying)
        write(h.store, key(100, 149))
        w.offer(SegmentEvent("created", key(100, 149)))
        time.sleep(1.0)
        h.wait(lambda: w.checkpointed == 199, timeout=5)
        # Both segments reached the bucket after the worker first started: both replayed.
        assert h.offsets() == list(range(100, 200))
        assert h.metric("replicator_ingress_messages_skipped_total") == 0
    finally:
        h.stop()


def test_latest_logs_and_counts_every_position_of_the_history_it_skips(
        caplog: pytest.LogCaptureFixture) -> None:
    h = latest(Harness())
    try:
        topic_json(h.store, {"3": 100})           # egress's history begins at 100
        write(h.store, key(150, 199))             # 100-149 is still replicating
        with caplog.at_level(logging.WARNING, logger="ingress.worker"):
            w = h.start()
            h.wait(lambda: w.checkpointed == 199)
            write(h.store, key(100, 149))
            w.offer(SegmentEvent("created", key(100, 149)))
            write(h.store, key(200, 209))
            w.offer(SegmentEvent("created", key(200, 209)))
            h.wait(lambda: w.checkpointed == 209)
        assert h.offsets() == list(range(200, 210))
        # 100-199 were skipped by choice: every one of them logged and counted.
        assert h.metric("replicator_ingress_messages_skipped_total") == 100
        assert any("100-199" in r.getMessage() or "100-149" in r.getMessage()
                   for r in caplog.records)
    finally:
        h.stop()


@pytest.mark.parametrize("delay", ["5m", "0s"])
def test_first_position_waits_for_an_entry_that_is_only_late(delay: str) -> None:
    # With first_segment_delay = 0 (valid; earlier releases ignored it for first-position
    # when egress records entries) any reordering at all gives up at once.
    t0 = datetime.now(UTC)
    now = [t0]
    h = Harness(first_delay=delay, timeout="24h")
    try:
        # The version of _topic.json replicated so far: written when partition 0 got its
        # entry, before partition 3's first segment existed. Egress then recorded
        # {"3": 100} and published 100-149 and 150-199; only 150-199 replicated so far.
        topic_json(h.store, {"0": 0}, updated_at=t0 - timedelta(minutes=1))
        write(h.store, key(150, 199))
        w = h.start(clock=lambda: now[0])
        if delay != "0s":
            h.wait(lambda: h.metric("replicator_ingress_first_position_waiting") == 1)
        now[0] = t0 + timedelta(minutes=6)        # replication of the rest lags > 5 min
        w.offer(SegmentEvent("created", key(150, 199)))
        time.sleep(0.5)
        topic_json(h.store, {"0": 0, "3": 100}, updated_at=t0)   # the entry arrives
        write(h.store, key(100, 149))             # and the first segment
        w.offer(SegmentEvent("created", key(100, 149)))
        h.wait(lambda: w.checkpointed == 199, timeout=5)
        assert h.offsets() == list(range(100, 200))
        assert h.metric("replicator_ingress_messages_skipped_total") == 0
    finally:
        h.stop()


def test_latest_skips_the_history_of_every_incarnation_in_the_bucket() -> None:

    h = latest(Harness())
    try:
        write(h.store, key(0, 19))                # the first topic's history
        incarnations_json(h.store, 19)            # deleted, created again: ends at 19
        write_new(h.store, new_key(0, 9))         # the new topic's history
        w = h.start()
        h.wait(lambda: w.replaying)
        time.sleep(1.0)
        write_new(h.store, new_key(10, 14))       # what arrives after the start
        w.offer(SegmentEvent("created", new_key(10, 14)))
        h.wait(lambda: len(h.sink.committed) >= 5)
        time.sleep(0.5)
        assert [r[3] for r in h.sink.committed] == [b"new%d" % o for o in range(10, 15)]
    finally:
        h.stop()


def test_latest_skip_survives_a_failed_checkpoint_commit() -> None:
    h = latest(Harness())
    h.sink.fail_on_commit = 1                     # the skip's checkpoint transaction fails
    try:
        topic_json(h.store, {"3": 0})
        write(h.store, key(0, 49))
        write(h.store, key(50, 99))
        w = h.start()
        h.wait(lambda: w.checkpointed == 99)
        time.sleep(0.5)
        skipped = h.metric("replicator_ingress_messages_skipped_total")
        assert (h.offsets(), skipped) == ([], 100)  # skipped as counted, not replayed
    finally:
        h.stop()


def test_a_topic_json_written_after_the_segment_without_the_entry_gives_up(
        caplog: pytest.LogCaptureFixture) -> None:
    # The other side of the rule above: a _topic.json written after the partition's first
    # segment that still has no entry means egress did not record one (an earlier
    # release): first_segment_delay, then ERROR and the earliest segment known.
    t0 = datetime.now(UTC)
    now = [t0]
    h = Harness(first_delay="5m")
    try:
        write(h.store, key(2500, 2549))
        topic_json(h.store, {"0": 0}, updated_at=datetime.now(UTC) + timedelta(seconds=1))
        with caplog.at_level(logging.ERROR, logger="ingress.start_point"):
            w = h.start(clock=lambda: now[0])
            h.wait(lambda: h.metric("replicator_ingress_first_position_waiting") == 1)
            now[0] = t0 + timedelta(minutes=10)
            w.offer(SegmentEvent("created", key(2500, 2549)))
            h.wait(lambda: w.checkpointed == 2549, timeout=10)
        assert h.offsets() == list(range(2500, 2550))
        assert any("us-east-1/t[3]" in r.getMessage() for r in caplog.records)
    finally:
        h.stop()
