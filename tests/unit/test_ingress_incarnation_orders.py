"""Ingress in the incarnation orders that used to skip or hide records: a worker without a
checkpoint that sees the later incarnation first, a segment of an incarnation the worker
has left (docs/architecture.md, "Topic incarnations").
"""

from __future__ import annotations

import logging
import time
import types
from datetime import UTC, datetime

import pytest

from ingress.controller import Ingress
from ingress.events import SegmentEvent
from ingress.incarnations import Chain, advance, same_incarnation
from replicator.core.wire import Checkpoint, Heartbeat, Incarnation, TopicMetadata
from tests.unit.test_ingress_incarnations import NEW, new_key, topic_json, write_new
from tests.unit.test_ingress_worker import Harness, key, write


def test_a_fresh_worker_seeing_the_later_incarnation_first_waits_for_the_earlier() -> None:
    h = Harness()
    try:
        # _topic.json as egress left it: the first topic's partition 3 is 0-19.
        h.store.put("data/us-east-1/t/_topic.json", TopicMetadata(
            4, {}, "t", "us-east-1", None, {3: 0},
            (Incarnation("IdA", ""), Incarnation(NEW, NEW, {3: 19}, {3: 0}))).encode())
        write_new(h.store, new_key(0, 4))        # replicated before the first topic's
        w = h.start()
        time.sleep(0.5)
        assert h.offsets() == []                 # waits: the first topic begins at 0
        write(h.store, key(0, 9))
        write(h.store, key(10, 19))
        w.offer(SegmentEvent("created", key(0, 9)))
        w.offer(SegmentEvent("created", key(10, 19)))
        h.wait(lambda: len(h.sink.committed) == 25)
        assert [r[3] for r in h.sink.committed][-5:] == [b"new%d" % o for o in range(5)]
        assert h.offsets()[:20] == list(range(20))
    finally:
        h.stop()


def test_advance_waits_for_a_recorded_first_position_only() -> None:
    meta = TopicMetadata(1, {}, "t", "r", None, {0: 0},
                         (Incarnation("A", ""), Incarnation("B", "B", {0: 19}, {0: 0})))
    chain = Chain.of(meta, 0)
    assert advance("", None, chain, has_segments=False) == []
    unrecorded = TopicMetadata(1, {}, "t", "r", None, {}, meta.incarnations)
    assert [m.entered for m in advance("", None, Chain.of(unrecorded, 0),
                                       has_segments=False)] == ["B"]
    empty = TopicMetadata(1, {}, "t", "r", None, {0: 0},
                          (Incarnation("A", ""), Incarnation("B", "B", {0: None}, {0: 0})))
    assert [m.entered for m in advance("", None, Chain.of(empty, 0),
                                       has_segments=False)] == ["B"]


def test_a_segment_of_a_left_incarnation_is_reported_lost(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    try:
        write(h.store, key(0, 9))
        topic_json(h.store, 9)                   # egress sealed: the first topic ends at 9
        write_new(h.store, new_key(0, 4))
        w = h.start()
        h.wait(lambda: len(h.sink.committed) == 15)
        with caplog.at_level(logging.ERROR, logger="ingress.incarnations"):
            write(h.store, key(10, 14))          # published after the seal
            w.offer(SegmentEvent("created", key(10, 14)))
            write(h.store, key(0, 4))            # replayed already: nothing to report
            w.offer(SegmentEvent("created", key(0, 4)))
            write_new(h.store, new_key(5, 9))
            w.offer(SegmentEvent("created", new_key(5, 9)))
            h.wait(lambda: len(h.sink.committed) == 20)
            h.wait(lambda: h.metric("replicator_ingress_messages_lost_total") == 5)
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "positions 10-14 (5)" in errors[0]
    finally:
        h.stop()


def beat(h: Harness, w: object, ids: dict[int, str]) -> float:
    h.store.put("data/us-east-1/t/_heartbeats/e1.json", Heartbeat(
        "t", "us-east-1", "e1", datetime.now(UTC), {3: 24}, ids).encode())
    stub = types.SimpleNamespace(
        store=h.store, heartbeats=None, m=h.m, clock=lambda: datetime.now(UTC),
        settings=types.SimpleNamespace(s3=types.SimpleNamespace(prefix="data")),
        sources={("us-east-1", "t"): None}, workers={("us-east-1", "t", 3): w})
    Ingress._read_heartbeats(stub)  # type: ignore[arg-type]
    return float(w.freshness.lag_seconds())  # type: ignore[attr-defined]


@pytest.mark.parametrize("ids", [{}, {3: NEW}])
def test_a_worker_in_an_earlier_incarnation_is_not_fresh_by_the_live_topics_heartbeat(
        ids: dict[int, str]) -> None:
    h = Harness(timeout="1d")
    try:
        write(h.store, key(0, 99))                 # the first topic: 100-199 not here yet
        h.store.put("data/us-east-1/t/_topic.json", TopicMetadata(
            4, {}, "t", "us-east-1", None, {3: 0},
            (Incarnation("IdA", ""), Incarnation(NEW, NEW, {3: 199}, {3: 0}))).encode())
        write_new(h.store, new_key(0, 24))         # the live topic, egress caught up at 24
        w = h.start(clock=lambda: datetime.now(UTC))
        h.wait(lambda: w.checkpointed == 99)
        assert w.incarnations.label == ""
        assert beat(h, w, ids) > 3600              # records from 2023: lag stays
        assert beat(h, w, {3: "IdA"}) < 3600       # a beat of its own incarnation counts
    finally:
        h.stop()


def test_same_incarnation() -> None:
    assert same_incarnation(None, None, None) and same_incarnation("B", None, "B")
    assert same_incarnation(None, "B", "B") and not same_incarnation(None, "A", "B")
    assert same_incarnation("A", "A", "B") and not same_incarnation("B", "A", "B")
    hb = Heartbeat("t", "r", "e", datetime(2026, 1, 1, tzinfo=UTC), {0: 5}, {0: "A"})
    assert Heartbeat.parse(hb.encode(), where="x") == hb


def two_incarnations(h: Harness, end: int) -> None:
    h.store.put("data/us-east-1/t/_topic.json", TopicMetadata(
        4, {}, "t", "us-east-1", None, {3: 0},
        (Incarnation("IdA", ""), Incarnation(NEW, NEW, {3: end}, {3: 0}))).encode())


def late_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "ingress.declared_lost" and r.levelname == "ERROR"]


def test_a_late_segment_of_a_later_incarnation_declared_lost_is_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(timeout="300ms", retries=1)
    try:
        write(h.store, key(0, 9))
        two_incarnations(h, 9)
        write_new(h.store, new_key(0, 4))
        write_new(h.store, new_key(10, 14))
        h.checkpoints.append("us-east-1:t:3:copy", Checkpoint(
            4, new_key(0, 4).to_key(), datetime.now(UTC), incarnation=NEW).encode())
        with caplog.at_level(logging.ERROR):
            w = h.start()
            h.wait(lambda: h.metric("replicator_ingress_messages_lost_total") == 5)
            write_new(h.store, new_key(5, 9))
            w.offer(SegmentEvent("created", new_key(5, 9)))
            h.wait(lambda: h.metric("replicator_ingress_late_after_lost_messages_total") == 5)
        assert len(late_errors(caplog)) == 1
        assert f"--incarnation {NEW}" in late_errors(caplog)[0]
    finally:
        h.stop()


def test_the_restore_command_of_an_earlier_incarnation_names_it(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(timeout="300ms", retries=1)
    try:
        write(h.store, key(0, 9))
        write(h.store, key(20, 29))
        two_incarnations(h, 29)
        write_new(h.store, new_key(0, 4))
        with caplog.at_level(logging.ERROR):
            w = h.start()
            h.wait(lambda: len(h.sink.committed) == 25)
            write(h.store, key(10, 19))
            w.offer(SegmentEvent("created", key(10, 19)))
            h.wait(lambda: h.metric("replicator_ingress_late_after_lost_messages_total") == 10)
        assert len(late_errors(caplog)) == 1
        assert "--incarnation IdA" in late_errors(caplog)[0]
    finally:
        h.stop()
