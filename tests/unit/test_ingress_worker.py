"""The replay worker against in-memory seams: order, overlap, redo, missing, corrupt, late.

Longer than 400 lines: one test per worker behaviour, sharing the in-memory harness.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO, cast

import pytest

from formats.base import TIMESTAMP_LOG_APPEND_TIME, SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from ingress.checkpoints import MemoryCheckpointStore
from ingress.delivery import PIPELINE_DEPTH, delivery_for
from ingress.events import SegmentEvent
from ingress.metrics import IngressMetrics
from ingress.permits import FifoPermits
from ingress.replay_state import ReplayState
from ingress.rows import Rows
from ingress.scheduler import Scheduler
from ingress.sink import MemorySink
from ingress.worker import ReplayWorker
from ingress.worker_config import WorkerConfig
from replicator.core.clock import utc_now
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import MemoryObjectStore, RangeReader
from replicator.core.wire import Checkpoint, rfc3339

FMT = get_format("parquet")
REF = PartitionRef("data", "us-east-1", "t", 3)
LABELS = {"region": "us-east-1", "topic": "t", "partition": "3"}


def rec(o: int) -> Record:
    headers: tuple[tuple[str, bytes | None], ...] = ()
    if o % 3 == 0:
        headers = (("h", b"1"), ("h", None), ("", b""))
    return Record(o, 1_700_000_000_000 + o, None if o % 5 == 0 else b"k%d" % o,
                  None if o % 7 == 0 else (b"" if o % 11 == 0 else b"v%d" % o), headers,
                  TIMESTAMP_LOG_APPEND_TIME if o % 2 else 1)


def key(start: int, end: int, level: int = 0) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "t", 3, level, start, end)


def write(store: MemoryObjectStore, k: SegmentKey, offsets: Sequence[int] | None = None) -> None:
    offs = list(offsets) if offsets is not None else list(range(k.start, k.end + 1))
    up = SegmentUpload(store, FMT, "temp", WriterOptions())
    up.write_batch(records_to_batch([rec(o) for o in offs]))
    temp = up.finish(SegmentMetadata.for_key(k, len(offs)))
    publish_segment(store, temp.key, k)


class Harness:
    def __init__(self, *, exactly_once: bool = True, timeout: str = "60s", retries: int = 2,
                 first_delay: str = "0s", batch_size: int = 7, dest: str = "copy",
                 meta: bool = True) -> None:
        self.store = MemoryObjectStore("dest")
        if meta:
            # An egress that records no first positions (the first_segment_delay
            # behaviour); meta=False: no _topic.json at all (still replicating).
            topic_json(self.store, None)
        self.checkpoints = MemoryCheckpointStore()
        self.sink = MemorySink(self.checkpoints, transactional=exactly_once)
        self.metrics = Metrics()
        self.m = IngressMetrics.create(self.metrics)
        src = IngressSourceSettings(region="us-east-1", topic="t",
                                    lost_segment_timeout=timeout,
                                    late_segment_retries=retries,
                                    first_segment_delay=first_delay)
        self.cfg = WorkerConfig(source=src, ref=REF, destination_topic=dest,
                                delivery=delivery_for("exactly-once" if exactly_once
                                                      else "at-least-once"),
                                batch_size=batch_size,
                                rescan_interval=timedelta(milliseconds=100))
        self.worker: ReplayWorker | None = None
        self.scheduler: Scheduler | None = None

    def start(self, clock: Callable[[], datetime] | None = None) -> ReplayWorker:
        # The worker has no thread of its own: a pool runs its steps, as in the process.
        self.scheduler = Scheduler(2, name="test-replay")
        self.scheduler.start()
        self.worker = ReplayWorker(self.cfg, store=self.store,
                                   checkpoints=self.checkpoints, make_sink=lambda: self.sink,
                                   metrics=self.m, scheduler=self.scheduler,
                                   clock=clock or utc_now)
        self.worker.start()
        return self.worker

    def offsets(self) -> list[int]:
        return [r[0] for r in self.sink.committed]

    def wait(self, cond: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out; produced {self.offsets()}"
            time.sleep(0.01)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            assert self.worker.join(5)
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None

    def metric(self, name: str) -> float:
        return self.metrics.value(name, LABELS) or 0.0


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.stop()


def test_replays_overlapping_levels_once_in_order(h: Harness) -> None:
    write(h.store, key(0, 99))
    write(h.store, key(100, 199))
    write(h.store, key(100, 250))       # overlaps [100-199]
    write(h.store, key(0, 149, level=1))  # compacted, covers the first one
    write(h.store, key(251, 260))
    h.start()
    h.wait(lambda: h.offsets()[-1:] == [260])
    assert h.offsets() == list(range(261))
    got = {r[0]: r for r in h.sink.committed}
    for o in (0, 3, 7, 11, 15, 21):
        r = rec(o)
        assert got[o][1:] == (r.timestamp_ms, r.key, r.value, list(r.headers) or None)
    cp = Checkpoint.decode(h.checkpoints.values["us-east-1:t:3:copy"][-1])
    assert cp.offset == 260 and cp.segment == key(251, 260).to_key()
    assert h.metric("replicator_ingress_messages_produced_total") == 261
    assert h.metric("replicator_ingress_checkpoint_offset") == 260


def test_starts_after_a_checkpoint_inside_a_segment(h: Harness) -> None:
    write(h.store, key(0, 99))
    h.checkpoints.append("us-east-1:t:3:copy", b"garbage")  # logged and ignored, never fatal
    h.checkpoints.append("us-east-1:t:3:copy", Checkpoint(41, key(0, 99).to_key(),
                                                     datetime.now(UTC)).encode())
    h.checkpoints.append("us-east-1:t:3:copy", b"{}")
    h.start()
    h.wait(lambda: h.offsets()[-1:] == [99])
    assert h.offsets() == list(range(42, 100))


def test_commit_failure_redoes_from_checkpoint_without_duplicates(h: Harness) -> None:
    write(h.store, key(0, 49))
    h.sink.fail_on_commit = 2
    w = h.start()
    h.wait(lambda: h.offsets()[-1:] == [49], timeout=15)
    assert h.offsets() == list(range(50))
    assert h.sink.aborted >= 2 and h.sink.started == 3
    assert w.failed is not None


def test_fenced_producer_while_owning_starts_a_new_session_not_a_stop() -> None:
    # A transaction that outlived transaction.timeout.ms is aborted by the coordinator and
    # the producer is fenced; the partition must go on (was: stopped until a rebalance).
    h = Harness()
    h.sink.fence_on_commit = 1
    try:
        write(h.store, key(0, 29))
        w = h.start()
        h.wait(lambda: w.checkpointed == 29)
        assert h.offsets() == list(range(30))      # nothing twice, nothing lost
        assert not w.stalled
        assert h.metrics.value("replicator_ingress_worker_errors_total",
                               {**LABELS, "kind": "fenced"}) == 1
    finally:
        h.stop()


def test_transaction_timeout_covers_a_flush_and_a_commit() -> None:
    from ingress.sink import transaction_timeout_ms

    # librdkafka's default (60 s) is below one flush plus one commit of 60 s each.
    assert transaction_timeout_ms(60.0) == 150_000 > 2 * 60_000


def test_repeated_fencing_is_reported_stalled_then_clears(
        caplog: pytest.LogCaptureFixture) -> None:
    import ingress.worker_config as worker_module

    h = Harness()
    h.sink.fence_on_commit = worker_module.FENCED_STALL
    try:
        write(h.store, key(0, 29))
        with caplog.at_level(logging.ERROR, logger="ingress.worker"):
            w = h.start()
            h.wait(lambda: h.metric("replicator_ingress_partition_stalled") == 1, timeout=20)
        assert any("STALLED" in r.getMessage() for r in caplog.records)
        h.wait(lambda: w.checkpointed == 29, timeout=20)
        assert h.metric("replicator_ingress_partition_stalled") == 0 and not w.stalled
        assert h.offsets() == list(range(30))
    finally:
        h.stop()


def test_at_least_once_redo_may_duplicate_but_never_loses() -> None:
    h = Harness(exactly_once=False)
    try:
        write(h.store, key(0, 49))
        h.sink.fail_on_commit = 1
        h.start()
        h.wait(lambda: h.offsets()[-1:] == [49], timeout=15)
        offs = h.offsets()
        assert sorted(set(offs)) == list(range(50))
        assert len(offs) - 50 <= 7  # at most the one batch whose checkpoint failed
    finally:
        h.stop()


class SlowAckSink(MemorySink):
    """Acknowledges a few records per poll and remembers the most ever in flight."""

    most_in_flight: int = 0

    def produce(self, rows: Rows) -> None:
        super().produce(rows)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))


def test_at_least_once_pipelines_batches_and_checkpoints_only_acknowledged_records() -> None:
    h = Harness(exactly_once=False, batch_size=5)
    h.sink = SlowAckSink(h.checkpoints, transactional=False, ack_per_poll=2)
    try:
        write(h.store, key(0, 99))
        write(h.store, key(100, 149))
        w = h.start()
        h.wait(lambda: h.offsets()[-1:] == [149] and w.checkpointed == 149, timeout=15)
        assert h.offsets() == list(range(150))
        assert h.sink.early_checkpoints == []
        # Batches overlap (the next is produced before the previous is acknowledged),
        # but never more than PIPELINE_DEPTH + 1 of them.
        assert 5 < h.sink.most_in_flight <= (PIPELINE_DEPTH + 1) * 5
        # Idle: the newest checkpoint went out although no later batch pushed it.
        cps = [Checkpoint.decode(v) for v in h.checkpoints.values["us-east-1:t:3:copy"]]
        assert cps[-1].offset == 149
        assert [c.offset for c in cps] == sorted(c.offset for c in cps)
        assert h.metric("replicator_ingress_checkpoint_offset") == 149
    finally:
        h.stop()


def test_at_least_once_stop_sends_the_last_checkpoint() -> None:
    h = Harness(exactly_once=False, batch_size=5)
    h.sink = SlowAckSink(h.checkpoints, transactional=False, ack_per_poll=1)
    try:
        write(h.store, key(0, 999))
        w = h.start()
        h.wait(lambda: len(h.offsets()) > 20)
        h.stop()
        assert h.sink.early_checkpoints == []
        last = Checkpoint.decode(h.checkpoints.values["us-east-1:t:3:copy"][-1])
        # Everything produced before the stop was acknowledged and checkpointed.
        assert last.offset == w.position == w.checkpointed == h.offsets()[-1]
    finally:
        h.stop()


def test_segment_deleted_before_read_falls_back_to_covering_one(h: Harness) -> None:
    write(h.store, key(0, 99, level=1))
    w = h.start()
    h.wait(lambda: h.offsets()[-1:] == [99])
    # An event announces a level-0 segment that compaction already removed, while a
    # compacted one covers its range.
    write(h.store, key(100, 299, level=1))
    w.offer(SegmentEvent("created", key(100, 149)))
    h.wait(lambda: h.offsets()[-1:] == [299])
    assert h.offsets() == list(range(300))
    assert h.metric("replicator_ingress_segments_missing_total") == 1


class DeletingStore(MemoryObjectStore):
    """Compaction replaces ``victim`` when its records are read (the third ranged read:
    opening reads the format's magic bytes and the footer). Reads go through a buffer
    smaller than the segment: a segment no larger than the buffer is read whole when
    opened, and a deletion can then no longer land mid-read."""

    def __init__(self) -> None:
        super().__init__("dest")
        self.victim: str | None = None
        self.on_delete: Callable[[], None] = lambda: None
        self.reads = 0

    def open_read(self, key: str, *, buffer_size: int = 8 * 1024**2) -> BinaryIO:
        return super().open_read(key, buffer_size=512)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if key == self.victim:
            self.reads += 1
            if self.reads == 3:
                self.on_delete()
                self.delete(key)
        return super().get_range(key, start, length)


def test_segment_deleted_while_read_continues_from_the_covering_one(h: Harness) -> None:
    store = DeletingStore()
    h.store = store
    topic_json(store, None)
    write(store, key(0, 99))
    store.victim = key(0, 99).to_key()
    store.on_delete = lambda: write(store, key(0, 99, level=1))
    w = h.start()
    h.wait(lambda: w.checkpointed == 99)
    assert store.reads >= 3
    assert h.offsets() == list(range(100))      # once each
    assert h.metric("replicator_ingress_segments_missing_total") == 1
    # The documented "segment gone" path, not a failed session restarted after a delay.
    assert w.failed is None


def test_corrupt_segment_is_reported_and_a_covering_one_used(h: Harness) -> None:
    h.store.put(key(0, 99).to_key(), b"not parquet at all")
    write(h.store, key(0, 99, level=1))
    write(h.store, key(100, 109))
    h.store.put(key(100, 199, level=1).to_key(), b"PAR1 broken")  # preferred, but corrupt
    h.start()
    h.wait(lambda: h.offsets()[-1:] == [109])
    assert h.offsets() == list(range(110))
    assert h.metric("replicator_ingress_segments_corrupt_total") == 1


def test_footer_not_matching_key_is_corrupt(h: Harness) -> None:
    write(h.store, key(0, 9))
    h.store.copy(key(0, 9).to_key(), key(10, 19).to_key())  # footer says 0-9
    write(h.store, key(20, 29))
    h.start()
    h.wait(lambda: h.metric("replicator_ingress_segments_corrupt_total") == 1)
    h.wait(lambda: h.metric("replicator_ingress_segments_late") == 10)
    assert h.offsets() == list(range(10))


def test_late_segment_is_waited_for_and_an_event_fills_the_gap(h: Harness) -> None:
    write(h.store, key(0, 9))
    write(h.store, key(20, 29))
    w = h.start()
    h.wait(lambda: h.metric("replicator_ingress_segments_late") == 10)
    assert h.offsets() == list(range(10))
    write(h.store, key(10, 19))
    w.offer(SegmentEvent("created", key(10, 19)))
    h.wait(lambda: h.offsets()[-1:] == [29], timeout=2)
    assert h.offsets() == list(range(30))
    assert h.metric("replicator_ingress_late_gaps_total") == 1
    assert h.metric("replicator_ingress_segments_lost_total") == 0


def test_first_segment_arriving_after_the_first_replay_is_reported_as_skipped(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()   # first_segment_delay 0s: replay starts at the earliest segment known
    try:
        write(h.store, key(100, 149))
        w = h.start()
        h.wait(lambda: w.checkpointed == 149)
        with caplog.at_level(logging.ERROR, logger="ingress.worker"):
            write(h.store, key(0, 59))
            w.offer(SegmentEvent("created", key(0, 59)))
            h.wait(lambda: h.metric("replicator_ingress_messages_skipped_total") == 100)
            # A compacted segment covering it later is not reported (or counted) again.
            write(h.store, key(0, 149, level=1))
            w.offer(SegmentEvent("created", key(0, 149, level=1)))
            write(h.store, key(150, 159))
            w.offer(SegmentEvent("created", key(150, 159)))
            h.wait(lambda: h.offsets()[-1:] == [159])
        assert h.metric("replicator_ingress_messages_skipped_total") == 100
        errors = [r.getMessage() for r in caplog.records if "NOT replayed" in r.getMessage()]
        assert len(errors) == 1 and "positions 0-99 (100)" in errors[0], errors
        assert h.offsets() == list(range(100, 160))   # replay never goes back
        # The origin travels in every checkpoint, so a restarted worker still knows it.
        cp = Checkpoint.decode(h.checkpoints.values["us-east-1:t:3:copy"][-1])
        assert (cp.offset, cp.origin) == (159, 100)
    finally:
        h.stop()


def test_replay_from_position_zero_has_nothing_to_skip(h: Harness) -> None:
    write(h.store, key(0, 49))
    w = h.start()
    h.wait(lambda: w.checkpointed == 49)
    write(h.store, key(0, 49, level=1))
    w.offer(SegmentEvent("created", key(0, 49, level=1)))
    write(h.store, key(50, 59))
    w.offer(SegmentEvent("created", key(50, 59)))
    h.wait(lambda: w.checkpointed == 59)
    assert h.metric("replicator_ingress_messages_skipped_total") == 0
    assert Checkpoint.decode(h.checkpoints.values["us-east-1:t:3:copy"][-1]).origin == 0


def test_never_arriving_segment_is_declared_lost_with_exact_range(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(timeout="600ms", retries=2)
    try:
        write(h.store, key(0, 9))
        write(h.store, key(20, 29))
        with caplog.at_level(logging.WARNING, logger="ingress.worker"):
            t0 = time.monotonic()
            h.start()
            h.wait(lambda: h.offsets()[-1:] == [29])
            assert time.monotonic() - t0 >= 0.55
        assert h.offsets() == list(range(10)) + list(range(20, 30))
        assert h.metric("replicator_ingress_segments_lost_total") == 1
        assert h.metric("replicator_ingress_messages_lost_total") == 10
        lost = [r for r in caplog.records if r.levelno == logging.ERROR and "LOST" in r.message]
        assert len(lost) == 1 and "positions 10-19 (10)" in lost[0].message
        values = [Checkpoint.decode(v) for v in h.checkpoints.values["us-east-1:t:3:copy"]]
        assert any(c.lost == (10, 19) and c.offset == 19 for c in values)
        assert [c.offset for c in values] == sorted(c.offset for c in values)  # forward only
    finally:
        h.stop()


@pytest.mark.parametrize("exactly_once", [True, False])
def test_late_gap_clock_is_kept_in_the_checkpoint_and_spans_restarts(
        exactly_once: bool) -> None:
    # Restarts more often than lost_segment_timeout must not reset the gap's clock: the
    # first session sees the gap at t0 and records it; a session started after t0 + the
    # timeout declares the range lost at once instead of waiting a full timeout again.
    t0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    now = [t0]
    h = Harness(timeout="60s", retries=2, exactly_once=exactly_once)
    try:
        write(h.store, key(0, 9))
        write(h.store, key(20, 29))
        w = h.start(clock=lambda: now[0])
        h.wait(lambda: h.metric("replicator_ingress_segments_late") == 10)
        h.wait(lambda: Checkpoint.decode(
            h.checkpoints.values["us-east-1:t:3:copy"][-1]).late is not None)
        last = Checkpoint.decode(h.checkpoints.values["us-east-1:t:3:copy"][-1])
        assert (last.offset, last.late) == (9, (10, t0))
        h.stop()
        assert w.position == 9
        now[0] = t0 + timedelta(seconds=61)          # a later session, after the timeout
        h.start(clock=lambda: now[0])
        h.wait(lambda: h.offsets()[-1:] == [29], timeout=5)
        assert h.metric("replicator_ingress_messages_lost_total") == 10
    finally:
        h.stop()


def topic_json(store: MemoryObjectStore, first_positions: dict[str, int] | None, *,
               updated_at: datetime | None = None) -> None:
    body: dict[str, Any] = {"partitions": 4}
    if first_positions is not None:
        body["first_positions"] = first_positions
    if updated_at is not None:
        body["updated_at"] = rfc3339(updated_at)
    store.put("data/us-east-1/t/_topic.json", json.dumps(body).encode())


def test_late_first_segment_is_waited_for_at_the_recorded_first_position() -> None:
    # S3 replication keeps no order: the first segment arrives after later ones. With the
    # first position recorded by egress, nothing is skipped (was: 0-99 "NOT replayed").
    h = Harness()       # first_segment_delay 0s
    try:
        topic_json(h.store, {"3": 0})
        write(h.store, key(100, 149))
        w = h.start()
        h.wait(lambda: h.metric("replicator_ingress_segments_late") == 100)
        assert h.offsets() == []
        write(h.store, key(0, 99))
        w.offer(SegmentEvent("created", key(0, 99)))
        h.wait(lambda: w.checkpointed == 149)
        assert h.offsets() == list(range(150))
        assert h.metric("replicator_ingress_messages_skipped_total") == 0
        assert h.metric("replicator_ingress_messages_lost_total") == 0
    finally:
        h.stop()


def test_pending_first_position_waits_and_a_later_history_start_is_exact() -> None:
    h = Harness(first_delay="60s")
    try:
        topic_json(h.store, {"0": 0})            # another partition's entry only
        write(h.store, key(500, 549))
        write(h.store, key(550, 599))
        w = h.start()
        h.wait(lambda: h.metric("replicator_ingress_first_position_waiting") == 1)
        time.sleep(0.3)
        assert h.offsets() == []                 # not started at an arbitrary segment
        topic_json(h.store, {"0": 0, "3": 550})  # this partition's history begins at 550
        h.wait(lambda: w.checkpointed == 599, timeout=10)
        assert h.offsets() == list(range(550, 600))
        assert h.metric("replicator_ingress_first_position_waiting") == 0
    finally:
        h.stop()


def test_a_first_position_never_recorded_is_waited_for_first_segment_delay_only(
        caplog: pytest.LogCaptureFixture) -> None:
    # An egress that left a partition's entry out (the latest-start defect of an earlier
    # release, a lost _topic.json write) must not stall the partition for ever: after
    # first_segment_delay from the first segment's arrival, one ERROR naming the partition,
    # and the replay starts at the earliest segment known.
    t0 = datetime.now(UTC)
    now = [t0]
    h = Harness(first_delay="5m")
    try:
        topic_json(h.store, {"0": 0})            # first_positions present, ours missing
        write(h.store, key(2500, 2549))
        write(h.store, key(2550, 2599))
        with caplog.at_level(logging.WARNING, logger="ingress.worker"):
            w = h.start(clock=lambda: now[0])
            h.wait(lambda: h.metric("replicator_ingress_first_position_waiting") == 1)
            time.sleep(0.3)
            assert h.offsets() == []
            now[0] = t0 + timedelta(minutes=10)     # well past the delay, however slow the writes
            w.offer(SegmentEvent("created", key(2550, 2599)))     # wakes the worker
            h.wait(lambda: w.checkpointed == 2599, timeout=10)
        assert h.offsets() == list(range(2500, 2600))
        assert h.metric("replicator_ingress_first_position_waiting") == 0
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "us-east-1/t[3]" in errors[0]
        assert "position 2500" in errors[0]
        # A first segment arriving later below the start is reported, never silently lost.
        write(h.store, key(2400, 2499))
        w.offer(SegmentEvent("created", key(2400, 2499)))
        h.wait(lambda: h.metric("replicator_ingress_messages_skipped_total") == 100)
    finally:
        h.stop()


def test_never_arriving_first_segment_is_declared_lost_with_its_exact_range(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(timeout="600ms", retries=2)
    try:
        topic_json(h.store, {"3": 0})
        write(h.store, key(40, 49))
        with caplog.at_level(logging.ERROR, logger="ingress.worker"):
            w = h.start()
            h.wait(lambda: w.checkpointed == 49)
        assert h.offsets() == list(range(40, 50))
        assert h.metric("replicator_ingress_messages_lost_total") == 40
        lost = [r.getMessage() for r in caplog.records if "LOST" in r.getMessage()]
        assert len(lost) == 1 and "positions 0-39 (40)" in lost[0]
    finally:
        h.stop()


def test_start_earliest_available_keeps_the_first_segment_delay_behaviour() -> None:
    h = Harness()
    h.cfg = replace(h.cfg, source=h.cfg.source.model_copy(
        update={"start": "earliest-available"}))
    try:
        topic_json(h.store, {"3": 0})
        write(h.store, key(100, 149))
        w = h.start()
        h.wait(lambda: w.checkpointed == 149)
        assert h.offsets() == list(range(100, 150))
    finally:
        h.stop()


def test_start_latest_with_an_empty_bucket_replays_everything_that_arrives() -> None:
    # Ingress deployed with start = latest before egress wrote anything: there is no
    # history to skip, so the first segment to arrive is replayed (it was skipped as
    # "history", and with it every record egress archived until then).
    h = Harness()
    h.cfg = replace(h.cfg, source=h.cfg.source.model_copy(update={"start": "latest"}))
    try:
        topic_json(h.store, {"3": 100})
        w = h.start()
        h.wait(lambda: w.replaying)
        write(h.store, key(150, 199))            # the second segment arrives first
        w.offer(SegmentEvent("created", key(150, 199)))
        h.wait(lambda: h.metric("replicator_ingress_segments_late") == 50)
        write(h.store, key(100, 149))
        w.offer(SegmentEvent("created", key(100, 149)))
        h.wait(lambda: w.checkpointed == 199)
        assert h.offsets() == list(range(100, 200))
        assert h.metric("replicator_ingress_messages_skipped_total") == 0
    finally:
        h.stop()


def test_start_latest_skips_the_history_loudly_and_keeps_its_start_across_restarts() -> None:
    h = Harness()
    h.cfg = replace(h.cfg, source=h.cfg.source.model_copy(update={"start": "latest"}))
    try:
        topic_json(h.store, {"3": 0})
        write(h.store, key(0, 49))
        write(h.store, key(50, 99))
        w = h.start()
        h.wait(lambda: w.checkpointed == 99)
        assert h.offsets() == []                       # the history is not replayed
        assert h.metric("replicator_ingress_messages_skipped_total") == 100
        write(h.store, key(100, 119))
        w.offer(SegmentEvent("created", key(100, 119)))
        h.wait(lambda: w.checkpointed == 119)
        assert h.offsets() == list(range(100, 120))
        h.stop()
        # A restart resumes from the checkpoint: the newer segment is not skipped.
        write(h.store, key(120, 139))
        w = h.start()
        h.wait(lambda: w.checkpointed == 139)
        assert h.offsets() == list(range(100, 140))
        assert h.metric("replicator_ingress_messages_skipped_total") == 100
    finally:
        h.stop()


def test_first_segment_delay_waits_for_earlier_segments() -> None:
    h = Harness(first_delay="400ms")
    try:
        write(h.store, key(10, 19))
        w = h.start()
        time.sleep(0.15)
        assert h.offsets() == []
        write(h.store, key(0, 9))
        w.offer(SegmentEvent("created", key(0, 9)))
        h.wait(lambda: h.offsets()[-1:] == [19])
        assert h.offsets() == list(range(20))
    finally:
        h.stop()


def test_removed_event_drops_a_segment(h: Harness) -> None:
    write(h.store, key(0, 9))
    w = h.start()
    h.wait(lambda: h.offsets()[-1:] == [9])
    w.offer(SegmentEvent("removed", key(0, 9)))
    write(h.store, key(10, 19))
    w.offer(SegmentEvent("created", key(10, 19)))
    h.wait(lambda: h.offsets()[-1:] == [19])
    assert h.offsets() == list(range(20))



def test_corrupt_first_segment_without_checkpoint_is_lost_not_skipped_silently() -> None:
    h = Harness(timeout="300ms", retries=1)
    try:
        h.store.put(key(0, 9).to_key(), b"garbage")
        write(h.store, key(10, 19))
        h.start()
        h.wait(lambda: h.offsets()[-1:] == [19])
        assert h.offsets() == list(range(10, 20))
        assert h.metric("replicator_ingress_messages_lost_total") == 10
        assert h.metric("replicator_ingress_segments_corrupt_total") == 1
    finally:
        h.stop()


def test_unexpected_error_restarts_with_backoff_not_a_hot_loop() -> None:
    h = Harness()
    calls: list[float] = []

    class Boom(MemorySink):
        def start(self) -> None:
            calls.append(time.monotonic())
            raise RuntimeError("bug")

    h.sink = Boom(h.checkpoints)
    try:
        w = h.start()
        for i in range(5):
            w.offer(SegmentEvent("created", key(i * 10, i * 10 + 9)))  # events must not wake it
        time.sleep(0.8)
        assert 1 <= len(calls) <= 2
        assert h.metrics.value("replicator_ingress_worker_errors_total",
                               {**LABELS, "kind": "unexpected"}) == len(calls)
    finally:
        h.stop()


def test_batch_rows_keeps_every_field_and_respects_slices_and_skips() -> None:
    from ingress.rows import batch_rows

    recs = [rec(o) for o in range(30)]
    batch = records_to_batch(recs)
    for sliced, after in ((batch, None), (batch.slice(4, 17), None), (batch, 12),
                          (batch.slice(10, 10), 14)):
        rows = batch_rows(sliced, after)
        assert rows is not None
        first = sliced.column("offset")[0].as_py()
        want = [r for r in recs[first:first + sliced.num_rows]
                if after is None or r.offset > after]
        assert rows.records() == [(r.offset, r.timestamp_ms, r.key, r.value,
                                   list(r.headers) or None) for r in want]
    assert batch_rows(batch, 29) is None


def test_split_by_bytes_counts_keys_values_and_headers_and_keeps_order() -> None:
    from ingress.rows import record_bytes, split_by_bytes

    recs = [rec(o) for o in range(30)]
    batch = records_to_batch(recs)
    want = [len(r.key or b"") + len(r.value or b"") + sum(len(k.encode()) + len(v or b"")
                                                         for k, v in r.headers) for r in recs]
    assert record_bytes(batch).tolist() == want
    assert record_bytes(batch.slice(5, 10)).tolist() == want[5:15]
    for cap in (1, 10, 25, 10**9):
        parts = list(split_by_bytes(batch, cap))
        assert [o for p in parts for o in p.column("offset").to_pylist()] == list(range(30))
        for p in parts:
            size = int(record_bytes(p).sum())
            assert size <= cap or p.num_rows == 1


def big(o: int) -> Record:
    return Record(o, 1_700_000_000_000 + o, b"k", b"x" * 1000, (), 1)


def test_batches_and_transactions_are_capped_by_bytes() -> None:
    # 1 KiB records, 1000 per batch by count but 3000 bytes per batch: a transaction holds
    # at most 2 records (10 000 records of 1 MiB made a 10 GiB transaction before).
    h = Harness(batch_size=1000)
    h.cfg = replace(h.cfg, batch_bytes=3000)
    try:
        up = SegmentUpload(h.store, FMT, "temp", WriterOptions())
        up.write_batch(records_to_batch([big(o) for o in range(20)]))
        temp = up.finish(SegmentMetadata.for_key(key(0, 19), 20))
        publish_segment(h.store, temp.key, key(0, 19))
        w = h.start()
        h.wait(lambda: w.checkpointed == 19)
        cps = [Checkpoint.decode(v).offset for v in h.checkpoints.values["us-east-1:t:3:copy"]]
        assert cps == list(range(1, 20, 2))
        assert h.offsets() == list(range(20))
    finally:
        h.stop()


def test_permits_bound_the_segments_replayed_at_once() -> None:
    import io

    state = {"open": 0, "max": 0}

    class TrackedRange(RangeReader):
        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            state["open"] += 1
            state["max"] = max(state["max"], state["open"])

        def close(self) -> None:
            if not self.closed:
                state["open"] -= 1
            super().close()

    class CountingStore(MemoryObjectStore):
        def open_read(self, key: str, *, buffer_size: int = 8 * 1024**2) -> BinaryIO:
            raw = TrackedRange(self, key, self.head(key).size)
            return io.BufferedReader(raw, buffer_size=buffer_size)

    store = CountingStore("dest")
    topic_json(store, None)
    permits = FifoPermits(1)
    pool = Scheduler(2, name="test-replay")   # fewer threads than workers
    pool.start()
    workers, sinks = [], []
    for p in (0, 1, 2):
        ref = PartitionRef("data", "us-east-1", "t", p)
        for i in range(3):
            k = SegmentKey("data", "us-east-1", "t", p, 0, i * 50, i * 50 + 49)
            write(store, k)
        h = Harness()
        sink = MemorySink(h.checkpoints)
        cfg = WorkerConfig(source=h.cfg.source, ref=ref, destination_topic="copy",
                           delivery=delivery_for("exactly-once"), batch_size=7,
                           rescan_interval=timedelta(seconds=5))
        w = ReplayWorker(cfg, store=store, checkpoints=h.checkpoints,
                         make_sink=functools.partial(lambda s: s, sink), metrics=h.m,
                         scheduler=pool, permits=permits)
        workers.append(w)
        sinks.append(sink)
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 10
        while any(len(s.committed) < 150 for s in sinks):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert state["max"] == 1
        assert all([r[0] for r in s.committed] == list(range(150)) for s in sinks)
    finally:
        for w in workers:
            w.stop()
            w.join(5)
        pool.close()


def test_checkpoint_store_latest_valid_and_tombstone() -> None:
    from ingress.checkpoints import latest_valid

    a = Checkpoint(5, "s", datetime.now(UTC)).encode()
    b = Checkpoint(9, "s", datetime.now(UTC)).encode()
    assert latest_valid("k", [a, b"junk", b, b'{"offset": -1}'], None).offset == 9  # type: ignore[union-attr]
    assert latest_valid("k", [a, None], None) is None
    assert latest_valid("k", [b"junk"], None) is None
    cp = Checkpoint(3, "", datetime.now(UTC), lost=(1, 3))
    assert Checkpoint.decode(cp.encode()) == cp


def test_malformed_checkpoint_is_counted_and_ignored_not_a_session_crash(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    try:
        write(h.store, key(0, 19))
        good = Checkpoint(9, key(0, 19).to_key(), datetime.now(UTC)).encode()
        bad = b'{"offset": 15, "segment": "s", "updated_at": "2026-01-01T00:00:00Z", ' \
              b'"lost": [null, 2]}'
        h.checkpoints.append("us-east-1:t:3:copy", good)
        h.checkpoints.append("us-east-1:t:3:copy", bad)
        with caplog.at_level(logging.ERROR, logger="ingress.checkpoints"):
            w = h.start()
            h.wait(lambda: w.checkpointed == 19)
        assert h.offsets() == list(range(10, 20))   # resumed after the valid one
        assert w.failed is None
        assert any("invalid checkpoint" in r.getMessage() for r in caplog.records)
    finally:
        h.stop()


def test_two_destinations_of_one_source_keep_their_own_checkpoints() -> None:
    # Two deployments replay the same source into different topics with one checkpoint
    # topic: the second must not resume from the first one's progress.
    a = Harness()
    b = Harness(dest="other")
    b.checkpoints = a.checkpoints
    b.sink = MemorySink(a.checkpoints)
    try:
        write(a.store, key(0, 19))
        b.store = a.store
        wa = a.start()
        a.wait(lambda: wa.checkpointed == 19)
        a.stop()
        wb = b.start()
        b.wait(lambda: wb.checkpointed == 19)
        assert b.offsets() == list(range(20))   # nothing skipped
        assert set(a.checkpoints.values) == {"us-east-1:t:3:copy", "us-east-1:t:3:other"}
    finally:
        a.stop()
        b.stop()


def test_checkpoint_of_an_earlier_version_is_taken_over_once() -> None:
    h = Harness()
    try:
        write(h.store, key(0, 19))
        h.checkpoints.append("us-east-1:t:3",
                             Checkpoint(9, key(0, 19).to_key(), datetime.now(UTC),
                                        origin=0).encode())
        w = h.start()
        h.wait(lambda: w.checkpointed == 19)
        assert h.offsets() == list(range(10, 20))   # resumed: no duplicates after upgrade
        new = [Checkpoint.decode(v) for v in h.checkpoints.values["us-east-1:t:3:copy"]]
        # Written under the new key before anything else, so the legacy key is read once.
        assert new[0].offset == 9 and new[0].origin == 0 and new[-1].offset == 19
    finally:
        h.stop()


def test_legacy_checkpoint_is_not_taken_when_another_destination_shares_the_topic() -> None:
    h = Harness()
    try:
        write(h.store, key(0, 19))
        now = datetime.now(UTC)
        h.checkpoints.append("us-east-1:t:3", Checkpoint(15, "s", now).encode())
        h.checkpoints.append("us-east-1:t:3:elsewhere", Checkpoint(15, "s", now).encode())
        w = h.start()
        h.wait(lambda: w.checkpointed == 19)
        assert h.offsets() == list(range(20))   # may be another's progress: replay all
    finally:
        h.stop()


def test_checkpoint_origin_round_trips_and_old_values_have_none() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    cp = Checkpoint(41, key(0, 99).to_key(), now, origin=7)
    assert Checkpoint.decode(cp.encode()) == cp
    old = b'{"offset": 41, "segment": "s", "updated_at": "2026-01-02T03:04:05Z"}'
    assert Checkpoint.decode(old).origin is None
    weird = b'{"offset": 41, "segment": "s", "updated_at": "2026-01-02T03:04:05Z", "origin": "x"}'
    assert Checkpoint.decode(weird).origin is None


def test_a_segment_starting_before_the_checkpoints_one_is_found_before_the_gap_counts(
        h: Harness) -> None:
    """The session lists level 0 from the checkpoint's segment on. The only segment
    covering the next position starts before it (an overlap of level-0 segments): the
    complete listing finds it before anything is reported late."""
    write(h.store, key(100, 149))                 # the checkpoint's segment, replayed
    write(h.store, key(90, 199))                  # starts before it, covers 150-199
    cp = Checkpoint(149, key(100, 149).to_key(), datetime.now(UTC))
    h.checkpoints.append("us-east-1:t:3:copy", cp.encode())
    w = h.start()
    h.wait(lambda: w.checkpointed == 199)
    assert h.offsets() == list(range(150, 200))
    assert h.metric("replicator_ingress_late_gaps_total") == 0


def test_a_worker_stopped_while_its_checkpoint_load_waits_leaves_no_waiter() -> None:
    """Was: the reader kept the wake-up of a stopped worker's load (and reported it as a
    load waiting for minutes) until it had read far enough, one per revoked session."""
    from tests.unit.test_ingress_checkpoints import FakeLog, reader

    fake = FakeLog()
    with fake.lock:
        fake.records = [(b"other", None)]     # open: the stable offset stays at 0
    store = reader(fake)
    h = Harness()
    scheduler = Scheduler(2, name="test-replay")
    scheduler.start()
    worker = ReplayWorker(h.cfg, store=h.store, checkpoints=store, make_sink=lambda: h.sink,
                          metrics=h.m, scheduler=scheduler)
    try:
        worker.start()
        h.worker = worker
        h.wait(lambda: bool(store._waiters))
        worker.stop()
        assert worker.join(5)
        assert store._waiters == {}
    finally:
        scheduler.close()
        store.close()


class QueueingProducer:
    """The shared at-least-once producer's client: records stay queued (the broker does
    not answer) until ``answering``; what it would still deliver is ``queued``."""

    def __init__(self) -> None:
        self.queued: list[int] = []
        self.delivered: list[int] = []
        self.answering = False
        self.failing = False
        """Each poll reports a failed record (a batch of them failing one by one)."""
        self.on_failure: Any = None
        self.calls: list[tuple[int, Any]] = []

    def produce_many(self, topic: str, partition: int, timestamps: Any, keys: Any,
                     values: Any, headers: Any, offsets: Sequence[int],
                     on_ends: Any = None, on_failure: Any = None) -> None:
        self.queued.extend(offsets)
        self.on_failure = on_failure
        self.calls.append((len(offsets), on_ends))

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        from replicator.core.kafka.types import DeliveryReport

        on_delivery(DeliveryReport(topic, 0, 0))

    def poll(self, timeout: float = 0.0) -> int:
        if self.answering:
            from replicator.core.kafka.types import DeliveryReport

            self.delivered.extend(self.queued)
            self.queued.clear()
            calls, self.calls = self.calls, []
            for n, on_ends in calls:
                if on_ends is not None:
                    on_ends(n - 1, DeliveryReport("copy", 3, 0))
        else:
            time.sleep(min(timeout, 0.01))
        if self.failing and self.on_failure is not None:
            self.on_failure(self.take_failures()[0])
        return 0

    def take_failures(self, topic: str | None = None, partition: int | None = None) -> list[Any]:
        from replicator.core.errors import KafkaRetriableError
        from replicator.core.kafka.types import DeliveryReport

        if not self.failing:
            return []
        return [DeliveryReport("copy", 3, -1, KafkaRetriableError("too large"), "too large")]

    def done(self, topic: str, partition: int) -> int:
        return len(self.delivered)

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return len(self.queued)

    def purge(self, *, in_flight: bool = False) -> None:
        self.queued.clear()


def unacknowledged_worker(monkeypatch: pytest.MonkeyPatch
                          ) -> tuple[Harness, QueueingProducer, ReplayWorker, Scheduler]:
    """An at-least-once worker (not started) over the process's shared producer, whose
    broker does not acknowledge (``QueueingProducer``), with a 0.3 s acknowledgement wait,
    on a started two-thread pool; the caller closes the pool."""
    from ingress import delivery
    from ingress.acks import SharedAcks, SharedAckSink
    from replicator.core.settings import KafkaSettings

    monkeypatch.setattr(delivery, "ACK_TIMEOUT", 0.3)
    producer = QueueingProducer()
    shared = SharedAcks(KafkaSettings(brokers="x:1"), timeout=0.3,
                        make_producer=lambda: cast(Any, producer))
    shared.start()
    h = Harness(exactly_once=False)
    write(h.store, key(0, 99))
    scheduler = Scheduler(2, name="test-replay")
    scheduler.start()
    worker = ReplayWorker(h.cfg, store=h.store, checkpoints=h.checkpoints,
                          make_sink=lambda: SharedAckSink(shared, topic="copy", partition=3,
                                                          checkpoint_topic="cps"),
                          metrics=h.m, scheduler=scheduler)
    return h, producer, worker, scheduler


@pytest.mark.parametrize("failing", [False, True])
def test_an_at_least_once_worker_stopped_with_records_unacknowledged_leaves_none_queued(
        monkeypatch: pytest.MonkeyPatch, failing: bool) -> None:
    """At-least-once, revoked while the broker does not acknowledge: the stop's wait for
    acknowledgements gives up (``ACK_TIMEOUT``) within the revoke deadline and the sink is
    closed. Was: its records stayed queued in the process's shared producer and reached
    the partition after it was released, beside the next owner's. With records failing
    (``failing``), the purge must not take a failed record for "nothing unacknowledged"
    (was: ``SharedAckSink.outstanding_now`` answered 0 when a failure was pending)."""
    h, producer, worker, scheduler = unacknowledged_worker(monkeypatch)
    try:
        worker.start()
        h.wait(lambda: len(producer.queued) >= 7)
        worker.stop()                        # the revoke callback: stop, join, else purge
        producer.failing = failing
        if not worker.join(5):
            worker.purge()
        left = list(producer.queued)
        producer.answering = True            # the broker answers again
        producer.poll()
        assert left == [], f"still queued after the release: {left}"
    finally:
        scheduler.close()


@pytest.mark.parametrize("granted_before_stop", [False, True])
def test_a_worker_stopped_while_waiting_for_a_replay_slot_keeps_none(
        granted_before_stop: bool) -> None:
    """A leaked slot would starve every other partition: a worker stopped in the slot
    queue leaves it, and one granted the slot before its stop step ran gives it back."""
    h = Harness()
    write(h.store, key(0, 9))
    permits = FifoPermits(1)
    other = permits.request(lambda: None)        # another partition holds the only slot
    assert other.granted
    scheduler = Scheduler(2, name="test-replay")
    scheduler.start()
    worker = ReplayWorker(h.cfg, store=h.store, checkpoints=h.checkpoints,
                          make_sink=lambda: h.sink, metrics=h.m, scheduler=scheduler,
                          permits=permits)
    try:
        worker.start()
        h.wait(lambda: permits.waiting == 1)
        if granted_before_stop:
            worker._stopping.set()               # stop() without its wake-up yet ...
            permits.cancel(other)                # ... the slot is handed to the worker
            worker.stop()
        else:
            worker.stop()
            permits.cancel(other)
        assert worker.join(5)
        assert permits.waiting == 0
        assert permits.request(lambda: None).granted, "the slot leaked"
        assert h.offsets() == []
    finally:
        scheduler.close()


def test_an_at_least_once_session_that_failed_leaves_no_records_queued_behind_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A session whose records were not acknowledged in time fails and closes its sink.
    Was: the records stayed queued in the shared producer, owned by no sink: a revoke
    while the worker waited to restart found nothing to purge, and they reached the
    partition after its release, beside the next owner's."""
    h, producer, worker, scheduler = unacknowledged_worker(monkeypatch)
    try:
        worker.start()
        h.wait(lambda: worker.failed is not None)     # session failed; restart in ~0.5 s
        worker.stop()                                  # the revoke, during the backoff
        if not worker.join(5):
            worker.purge()
        left = list(producer.queued)
        assert left == [], f"still queued after the release: {left}"
    finally:
        scheduler.close()


def test_the_segment_inventory_stays_bounded_on_a_busy_partition() -> None:
    """Segment events come faster than the rescan interval (a busy partition): every event
    wakes the worker before the idle rescan's reload, so only events feed the inventory.
    Was: ``known`` and ``arrived`` kept every segment announced for the worker's life (and
    each step cost time in proportion). Segments below the position are dropped now."""
    h = Harness(batch_size=50)
    h.cfg = replace(h.cfg, rescan_interval=timedelta(hours=1))
    try:
        write(h.store, key(0, 4))
        w = h.start()
        h.wait(lambda: h.offsets()[-1:] == [4])
        most = 0
        for i in range(1, 150):
            k = key(i * 5, i * 5 + 4)
            write(h.store, k)
            w.offer(SegmentEvent("created", k, event_time=utc_now()))
            h.wait(lambda k=k: h.offsets()[-1:] == [k.end])    # type: ignore[misc]
            most = max(most, len(w.inventory.known), len(w.inventory.arrived))
        assert h.offsets() == list(range(150 * 5))
        assert most <= 3, f"{most} segments kept for a position that only moves forward"
    finally:
        h.stop()


def test_a_segment_arriving_after_its_range_was_declared_lost_gives_the_restore_command(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(timeout="300ms", retries=1)
    try:
        write(h.store, key(0, 9))
        write(h.store, key(20, 29))
        h.start()
        h.wait(lambda: h.offsets()[-1:] == [29])
        assert h.metric("replicator_ingress_messages_lost_total") == 10
        with caplog.at_level(logging.ERROR, logger="ingress.declared_lost"):
            # S3 replication re-driven: the missing segment arrives.
            write(h.store, key(10, 19))
            assert h.worker is not None
            h.worker.offer(SegmentEvent("created", key(10, 19)))
            h.wait(lambda: h.metric("replicator_ingress_late_after_lost_messages_total")
                   == 10)
            # A duplicate event, a compacted segment over the same positions: nothing new.
            h.worker.declared_lost.arrived([SegmentEvent("created", key(10, 19)),
                                            SegmentEvent("created", key(5, 24, level=1))])
        lines = [r.message for r in caplog.records if r.name == "ingress.declared_lost"]
        assert len(lines) == 1
        assert "positions 10-19 (10)" in lines[0] and key(10, 19).to_key() in lines[0]
        assert ("replicator restore --config FILE --source-region us-east-1 --topic t "
                "--partitions 3 --from-offset 10 --to-offset 19 --to-topic copy ;") \
            in lines[0]
        assert "--to-topic copy.restored" in lines[0]
        assert h.metric("replicator_ingress_late_after_lost_messages_total") == 10
        assert h.offsets() == list(range(10)) + list(range(20, 30))   # not replayed
    finally:
        h.stop()


def test_the_declared_lost_range_of_the_resumed_checkpoint_is_watched_too(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.checkpoints.values["us-east-1:t:3:copy"] = [
        Checkpoint(19, key(20, 29).to_key(), datetime.now(UTC), lost=(10, 19)).encode()]
    try:
        write(h.store, key(20, 29))
        h.start()
        h.wait(lambda: h.offsets()[-1:] == [29])
        with caplog.at_level(logging.ERROR, logger="ingress.declared_lost"):
            write(h.store, key(12, 15))
            assert h.worker is not None
            h.worker.offer(SegmentEvent("created", key(12, 15)))
            h.wait(lambda: h.metric("replicator_ingress_late_after_lost_messages_total") == 4)
        assert "--from-offset 12 --to-offset 15" in caplog.records[-1].message
    finally:
        h.stop()


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_refused_record_stops_the_partition_at_it_until_retried(
        exactly_once: bool, caplog: pytest.LogCaptureFixture) -> None:
    """The destination refuses record 10 for good: the partition stops before the batch
    holding it (nothing after it produced, nothing skipped), reported by the gauge, the
    counter and in the checkpoint (``refused``, for ``replicator topics``) from the next
    session, which replays what precedes the record, checkpoints it, and then the record
    alone; once the destination takes it (its configs changed), the partition goes on by
    itself and the next checkpoint carries no refusal.

    Each wait is for a state the worker reaches by itself, never for a timer: was flaky
    under load, when ``retry_refused`` came between the refusal's report and its backoff
    being set, and was overwritten by the 10 s backoff (now a flag the state keeps)."""
    h = Harness(exactly_once=exactly_once, batch_size=7)
    try:
        write(h.store, key(0, 20))
        h.sink.refuse = {10}
        caplog.set_level(logging.INFO, logger="ingress")
        w = h.start()
        h.wait(lambda: w.state is ReplayState.REFUSED and w.checkpointed == 6)
        assert h.metric("replicator_ingress_partition_refused") == 1
        assert h.offsets() == list(range(7))
        assert w.refused is not None and w.refused.offset == 10
        w.retry_refused()               # a session now: the refusal goes into the checkpoint
        h.wait(lambda: h.metric("replicator_ingress_records_refused_total") >= 2)
        h.wait(lambda: w.state is ReplayState.REFUSED)
        cp = Checkpoint.decode(h.checkpoints.values[w.key][-1])
        # What precedes the record was replayed and checkpointed, then the record alone.
        assert cp.offset == 9 and cp.refused is not None and cp.refused.offset == 10
        # The checkpoints that record the refusal are no progress past it: still stopped.
        assert h.metric("replicator_ingress_partition_refused") == 1 and w.refused is not None
        assert not any("replicating again" in r.getMessage() for r in caplog.records)
        assert h.offsets() == list(range(10))
        h.sink.refuse = set()
        w.retry_refused()
        h.wait(lambda: h.offsets()[-1:] == [20])
        assert h.offsets() == list(range(21))
        h.wait(lambda: h.metric("replicator_ingress_partition_refused") == 0)
        assert w.refused is None
        assert Checkpoint.decode(h.checkpoints.values[w.key][-1]).refused is None
        assert any("replicating again" in r.getMessage() for r in caplog.records)
    finally:
        h.stop()


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_segment_event_repeated_after_its_replay_adds_no_record(exactly_once: bool) -> None:
    # Egress's [egress.mirror] copies a segment into this bucket, and S3 replication writes
    # the same key and bytes again later: ingress gets a second "created" event for a
    # segment it has replayed (below its checkpoint), which must add nothing.
    h = Harness(exactly_once=exactly_once)
    try:
        write(h.store, key(0, 9))
        w = h.start()
        h.wait(lambda: h.offsets()[-1:] == [9] and w.checkpointed == 9)
        write(h.store, key(0, 9))                   # the replica: same key, same bytes
        w.offer(SegmentEvent("created", key(0, 9)))
        write(h.store, key(10, 19))
        w.offer(SegmentEvent("created", key(10, 19)))
        h.wait(lambda: h.offsets()[-1:] == [19] and w.checkpointed == 19)
        write(h.store, key(10, 19))                 # the last segment's replica, too
        w.offer(SegmentEvent("created", key(10, 19)))
        w.offer(SegmentEvent("created", key(0, 9)))  # and the first one's, once more
        write(h.store, key(20, 29))
        w.offer(SegmentEvent("created", key(20, 29)))
        h.wait(lambda: h.offsets()[-1:] == [29] and w.checkpointed == 29)
        assert h.offsets() == list(range(30))
        assert h.metric("replicator_ingress_segments_lost_total") == 0
    finally:
        h.stop()


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_segment_event_repeated_while_it_replays_adds_no_record(exactly_once: bool) -> None:
    # The replica's event may also come while the mirrored copy is still being replayed
    # (small batches: several transactions per segment), and for a segment not replayed
    # yet (the mirror's copy and the replica both ahead of the checkpoint).
    h = Harness(exactly_once=exactly_once, batch_size=3)
    try:
        write(h.store, key(0, 29))
        write(h.store, key(30, 59))
        w = h.start()
        for _ in range(3):
            w.offer(SegmentEvent("created", key(0, 29)))
            w.offer(SegmentEvent("created", key(30, 59)))
        h.wait(lambda: h.offsets()[-1:] == [59] and w.checkpointed == 59)
        w.offer(SegmentEvent("created", key(30, 59)))
        write(h.store, key(60, 69))
        w.offer(SegmentEvent("created", key(60, 69)))
        h.wait(lambda: h.offsets()[-1:] == [69] and w.checkpointed == 69)
        assert h.offsets() == list(range(70))
    finally:
        h.stop()


def test_segments_before_any_topic_json_wait_for_it_not_for_first_segment_delay(
        caplog: pytest.LogCaptureFixture) -> None:
    """The low-RPO mirror (or S3 replication out of order) can bring a partition's
    segments before ``_topic.json``: with the first segment's copy dropped and the file
    later than first_segment_delay, starting at the earliest segment known reported 0-99
    NOT replayed. Without ``_topic.json`` the start is not decided (bounded by
    lost_segment_timeout)."""
    t0 = datetime.now(UTC)
    now = [t0]
    h = Harness(first_delay="5m", timeout="24h", meta=False)
    try:
        write(h.store, key(100, 199))            # the mirror's copy of the 2nd segment
        with caplog.at_level(logging.WARNING, logger="ingress"):
            w = h.start(clock=lambda: now[0])
            h.wait(lambda: h.metric("replicator_ingress_first_position_waiting") == 1)
            now[0] = t0 + timedelta(minutes=6)   # past first_segment_delay
            w.offer(SegmentEvent("created", key(100, 199)))
            h.wait(lambda: any("no _topic.json yet" in r.getMessage()
                               for r in caplog.records))
            assert h.offsets() == []
        write(h.store, key(0, 99))               # S3 replication: the 1st segment ...
        topic_json(h.store, {"3": 0})            # ... and _topic.json
        w.offer(SegmentEvent("created", key(0, 99)))
        h.wait(lambda: w.checkpointed == 199, timeout=20)
        assert h.offsets() == list(range(200))
        assert h.metric("replicator_ingress_messages_skipped_total") == 0
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        h.stop()


def test_a_topic_json_that_never_comes_is_waited_for_lost_segment_timeout_only() -> None:
    t0 = datetime.now(UTC)
    now = [t0]
    h = Harness(first_delay="5m", timeout="1h", meta=False)
    try:
        write(h.store, key(100, 199))
        w = h.start(clock=lambda: now[0])
        h.wait(lambda: h.metric("replicator_ingress_first_position_waiting") == 1)
        now[0] = t0 + timedelta(hours=2)         # past lost_segment_timeout
        w.offer(SegmentEvent("created", key(100, 199)))
        h.wait(lambda: w.checkpointed == 199, timeout=20)
        assert h.offsets() == list(range(100, 200))
    finally:
        h.stop()
