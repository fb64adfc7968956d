"""Ingress in the incarnation orders that used to skip or hide records: a worker without a
checkpoint that sees the later incarnation first, a segment of an incarnation the worker
has left (docs/architecture.md, "Topic incarnations").
"""

from __future__ import annotations

import logging
import time

import pytest

from ingress.events import SegmentEvent
from ingress.incarnations import Chain, advance
from replicator.core.wire import Incarnation, TopicMetadata
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
