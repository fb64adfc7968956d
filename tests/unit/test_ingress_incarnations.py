"""Ingress and a source topic deleted and created again: the new incarnation is replayed
after every record of the earlier one, into the same destination partition, never judged
by the earlier one's checkpoint (docs/architecture.md, "Topic incarnations").
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.segment_io import SegmentUpload, publish_segment
from ingress.events import SegmentEvent
from ingress.incarnations import Chain, advance, end_of
from ingress.planner import DeclareLost, Idle, Produce, WaitLate, next_action
from replicator.core.keys import SegmentKey
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Checkpoint, Incarnation, TopicMetadata
from tests.unit.test_ingress_worker import FMT, Harness, key, write

NEW = "IdB"


def new_key(start: int, end: int) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "t", 3, 0, start, end, NEW)


def write_new(store: MemoryObjectStore, k: SegmentKey) -> None:
    up = SegmentUpload(store, FMT, "temp", WriterOptions())
    up.write_batch(records_to_batch([Record(o, 1_700_000_000_000, None, b"new%d" % o)
                                     for o in range(k.start, k.end + 1)]))
    publish_segment(store, up.finish(SegmentMetadata.for_key(k, k.span, topic_id=NEW)).key, k)


def topic_json(store: MemoryObjectStore, previous_end: int | None, *,
               sealed: bool = True) -> None:
    incs = (Incarnation("IdA", ""),
            Incarnation(NEW, NEW, {3: previous_end} if sealed else {},
                        {3: 0} if sealed else {}))
    store.put("data/us-east-1/t/_topic.json",
              TopicMetadata(4, {}, "t", "us-east-1", None, {3: 0},
                            incs).encode())


def values(h: Harness) -> list[bytes | None]:
    return [r[3] for r in h.sink.committed]


def old(n: range) -> list[bytes | None]:
    from tests.unit.test_ingress_worker import rec
    return [rec(o).value for o in n]


def test_the_new_incarnation_is_replayed_after_the_old_one(
        caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    try:
        write(h.store, key(0, 9))
        write(h.store, key(10, 19))
        topic_json(h.store, 19)
        write_new(h.store, new_key(0, 4))       # ends below the old checkpoint
        write_new(h.store, new_key(5, 24))
        with caplog.at_level(logging.WARNING, logger="ingress.incarnations"):
            w = h.start()
            h.wait(lambda: len(h.sink.committed) == 20 + 25)
        assert h.offsets() == list(range(20)) + list(range(25))
        assert values(h) == old(range(20)) + [b"new%d" % o for o in range(25)]
        h.wait(lambda: w.checkpointed == 24)
        cp = Checkpoint.decode(h.checkpoints.values["us-east-1:t:3:copy"][-1])
        assert (cp.offset, cp.incarnation) == (24, NEW)
        assert h.metric("replicator_ingress_topic_incarnations_total") == 1
        warn = [r.getMessage() for r in caplog.records if "created again" in r.getMessage()]
        assert len(warn) == 1 and "IdA" in warn[0] and NEW in warn[0]
        assert h.metric("replicator_ingress_messages_lost_total") == 0
        assert h.metric("replicator_ingress_messages_skipped_total") == 0
    finally:
        h.stop()


def test_a_checkpoint_of_the_new_incarnation_resumes_in_it() -> None:
    h = Harness()
    try:
        write(h.store, key(0, 19))
        topic_json(h.store, 19)
        write_new(h.store, new_key(0, 9))
        write_new(h.store, new_key(10, 14))
        h.checkpoints.append("us-east-1:t:3:copy", Checkpoint(
            9, new_key(0, 9).to_key(), datetime.now(UTC), incarnation=NEW).encode())
        w = h.start()
        h.wait(lambda: w.checkpointed == 14)
        assert values(h) == [b"new%d" % o for o in range(10, 15)]   # the old one not again
    finally:
        h.stop()


def test_the_old_incarnations_pending_records_are_finished_first() -> None:
    h = Harness(timeout="60s")
    try:
        write(h.store, key(0, 9))
        topic_json(h.store, 19)                 # egress archived the old one up to 19
        write_new(h.store, new_key(0, 4))
        w = h.start()
        h.wait(lambda: h.metric("replicator_ingress_segments_late") == 10)
        assert h.offsets() == list(range(10))   # the new one waits for 10-19
        write(h.store, key(10, 19))
        w.offer(SegmentEvent("created", key(10, 19)))
        h.wait(lambda: len(h.sink.committed) == 25)
        assert values(h) == old(range(20)) + [b"new%d" % o for o in range(5)]
    finally:
        h.stop()


def test_the_new_incarnation_waits_until_egress_records_where_the_old_one_ends() -> None:
    h = Harness()
    try:
        write(h.store, key(0, 9))
        topic_json(h.store, None, sealed=False)
        write_new(h.store, new_key(0, 4))
        w = h.start()
        h.wait(lambda: w.checkpointed == 9)
        h.wait(lambda: w.incarnations.lineage.chain.labels == ("", NEW))
        assert h.offsets() == list(range(10))
        write(h.store, key(10, 11))
        topic_json(h.store, 11)
        w.offer(SegmentEvent("created", key(10, 11)))
        h.wait(lambda: len(h.sink.committed) == 17)
        assert values(h) == old(range(12)) + [b"new%d" % o for o in range(5)]
    finally:
        h.stop()


# --- the pure decisions over random histories ----------------------------------------

SRC = IngressSourceSettings(region="r", topic="t", lost_segment_timeout="1s",
                            late_segment_retries=1, first_segment_delay="0s")


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[list[SegmentKey]], list[SegmentKey]]:
    """2-3 incarnations, each a run of touching segments from 0 (some overlapping, some
    compacted), and the order they arrive in."""
    labels = ["", "B", "C"][:draw(st.integers(2, 3))]
    incs: list[list[SegmentKey]] = []
    for label in labels:
        ends = sorted(draw(st.sets(st.integers(0, 40), min_size=1, max_size=6)))
        segs, start = [], 0
        for e in ends:
            segs.append(SegmentKey("p", "r", "t", 0, 0, start, e, label))
            start = e + 1
        if draw(st.booleans()) and len(segs) > 1:
            segs.append(SegmentKey("p", "r", "t", 0, 1, segs[0].start, segs[1].end, label))
        incs.append(segs)
    arrival = draw(st.permutations([s for segs in incs for s in segs]))
    return incs, arrival


def chain_of(incs: list[list[SegmentKey]], sealed: int) -> Chain:
    labels = tuple(segs[0].incarnation for segs in incs)
    ends = tuple((False, None) if n == 0 or n > sealed else
                 (True, max(s.end for s in incs[n - 1])) for n in range(len(incs)))
    firsts = tuple(None if n == 0 or n > sealed else 0 for n in range(len(incs)))
    return Chain(labels, tuple(f"id{x}" for x in labels), ends, firsts)


@settings(max_examples=150, deadline=None)
@given(histories(), st.lists(st.booleans(), max_size=40))
def test_replay_never_skips_a_record_and_never_interleaves_incarnations(
        h: tuple[list[list[SegmentKey]], list[SegmentKey]], pauses: list[bool]) -> None:
    incs, arrival = h
    now = datetime(2026, 1, 1, tzinfo=UTC)
    label, position, replayed = "", -1, []
    known: set[SegmentKey] = set()
    sealed = 0
    for step in range(200):
        # Segments arrive in any order, the replay running in between; egress records an
        # incarnation's start (the end of the previous one) before that incarnation's
        # first segment is visible.
        if arrival and (step >= len(pauses) or not pauses[step]):
            seg = arrival.pop(0)
            rank = [x[0].incarnation for x in incs].index(seg.incarnation)
            sealed = max(sealed, rank)
            known.add(seg)
        chain = chain_of(incs, sealed)
        for move in advance(label, position, chain):
            label, position = move.entered, move.position
        mine = {s for s in known if s.incarnation == label}
        action = next_action(position, mine, now, SRC, until=end_of(label, chain))
        if isinstance(action, Produce):
            seg = action.segment
            after = position if action.skip_through is None else action.skip_through
            replayed += [(label, o) for o in range(max(seg.start, after + 1), seg.end + 1)]
            position = seg.end
        elif isinstance(action, DeclareLost | WaitLate):
            assert arrival, "a gap with every segment known"
        else:
            assert isinstance(action, Idle)
            if not arrival:
                break
    expected = [(segs[0].incarnation, o) for segs in incs
                for o in range(max(s.end for s in segs) + 1)]
    assert replayed == expected


def test_advance_waits_for_the_recorded_end() -> None:
    chain = Chain(("", "B"), ("a", "b"), ((False, None), (True, 9)), (None, 0))
    assert advance("", 8, chain) == []
    assert [m.entered for m in advance("", 9, chain)] == ["B"]
    assert advance("", None, chain) == []
    unsealed = Chain(("", "B"), ("a", "b"), ((False, None), (False, None)), (None, None))
    assert advance("", 9, unsealed) == []
    empty_old = Chain(("", "B"), ("a", "b"), ((False, None), (True, None)), (None, 3))
    assert advance("", None, empty_old)[0].position == 2
    assert end_of("", chain) == 9 and end_of("B", chain) is None


def test_topic_json_chain_of_one_partition() -> None:
    meta = TopicMetadata(1, incarnations=(Incarnation("a", ""),
                                          Incarnation("b", "b", {0: 5}, {0: 0})))
    assert Chain.of(meta, 0).previous_ends == ((False, None), (True, 5))
    assert Chain.of(meta, 1).previous_ends == ((False, None), (False, None))
    assert Chain.of(None, 0) == Chain()
    assert json.loads(meta.encode())["topic_id"] == "b"


def test_an_incarnation_without_segments_here_is_passed_through() -> None:
    chain = Chain(("", "B", "C"), ("a", "b", "c"),
                  ((False, None), (True, 4), (True, None)), (None, 0, 0))
    assert [m.entered for m in advance("", 4, chain)] == ["B", "C"]
    # No checkpoint and no segment of the first one: nothing to wait from.
    assert [m.entered for m in advance("", None, chain, has_segments=False)] == ["B", "C"]
    assert advance("", None, chain) == []


def test_a_move_lists_the_incarnation_entered() -> None:
    # The worker's listings no longer cover a later incarnation it cannot move into yet;
    # when it moves, the incarnation entered is listed at once: its segments, announced by
    # no event, are replayed without waiting for the next rescan.
    from dataclasses import replace
    from datetime import timedelta
    h = Harness()
    h.cfg = replace(h.cfg, rescan_interval=timedelta(hours=1))
    try:
        write(h.store, key(0, 9))
        topic_json(h.store, 19)                     # the old one ends at 19
        w = h.start()
        h.wait(lambda: w.checkpointed == 9)
        write_new(h.store, new_key(0, 4))           # no events for these
        write_new(h.store, new_key(5, 9))
        write(h.store, key(10, 19))
        w.offer(SegmentEvent("created", key(10, 19)))
        h.wait(lambda: len(h.sink.committed) == 30)
        assert values(h) == old(range(20)) + [b"new%d" % o for o in range(10)]
    finally:
        h.stop()


class _Moves:
    def inc(self) -> None:
        return


@settings(max_examples=60, deadline=None)
@given(histories(), st.lists(st.booleans(), max_size=60), st.lists(st.booleans(), max_size=60))
def test_listing_only_the_incarnations_a_worker_can_enter_skips_nothing(
        h: tuple[list[list[SegmentKey]], list[SegmentKey]], pauses: list[bool],
        rescans: list[bool]) -> None:
    # The real inventory and tracker over a bucket: segments of 2-3 incarnations become
    # visible in any order (no events), egress records an incarnation's start before its
    # first segment is visible, listings run at random steps and on every move (as the
    # worker does) and cover only the incarnations the worker can enter. Every record of
    # every incarnation is replayed once, in creation order.
    from ingress.incarnations import IncarnationTracker
    from ingress.inventory import SegmentInventory
    from replicator.core.keys import PartitionRef
    incs, arrival = h
    arrival = list(arrival)
    store = MemoryObjectStore("b")
    ref = PartitionRef("p", "r", "t", 0)
    clock = [0.0]
    tracker = IncarnationTracker(store, ref, "w", _Moves(), monotonic=lambda: clock[0])
    position = -1
    inv = SegmentInventory(store, ref, "w", horizon=lambda: (position, None),
                           locations=tracker.locations, current=lambda: tracker.label)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    labels = [segs[0].incarnation for segs in incs]
    sealed, replayed = 0, []

    def publish_chain() -> None:
        entries = [Incarnation(f"id{x}", x,
                               {} if n == 0 or n > sealed else
                               {0: max(s.end for s in incs[n - 1])},
                               {} if n == 0 or n > sealed else {0: 0})
                   for n, x in enumerate(labels)]
        store.put("p/r/t/_topic.json", TopicMetadata(1, incarnations=tuple(entries)).encode())

    publish_chain()
    for step in range(400):
        clock[0] += 10.0                    # the chain may be read again at every step
        if arrival and (step >= len(pauses) or not pauses[step]):
            seg = arrival.pop(0)
            if labels.index(seg.incarnation) > sealed:
                sealed = labels.index(seg.incarnation)
                publish_chain()
            store.put(seg.to_key(), b"x")
        if step >= len(rescans) or rescans[step]:
            inv.reload()
        label = tracker.label
        mine, moved_to, until = tracker.current(inv.usable(), position)
        assert moved_to is not None
        position = moved_to
        if tracker.label != label:
            inv.reload(retry_gone=False)
            mine = {s for s in inv.usable() if s.incarnation == tracker.label}
        action = next_action(position, mine, now, SRC, until=until)
        if isinstance(action, Produce):
            seg = action.segment
            after = position if action.skip_through is None else action.skip_through
            replayed += [(tracker.label, o) for o in range(max(seg.start, after + 1),
                                                           seg.end + 1)]
            position = seg.end
        elif not arrival:
            inv.reload()                    # the rescan of an idle or waiting worker
    expected = [(segs[0].incarnation, o) for segs in incs
                for o in range(max(s.end for s in segs) + 1)]
    assert replayed == expected


def test_an_incarnation_with_known_segments_is_not_passed_through_in_one_step() -> None:
    # The chain an egress before the fix wrote for two recreates in a row named out of
    # order (X, Z, Y): Z's end in the partition recorded as "none" while a Z segment is
    # in the bucket. The worker at X's end enters Z and replays it before moving on.
    chain = Chain(("", "Z", "Y"), ("x", "z", "y"),
                  ((False, None), (True, 9), (True, None)), (0, 0, 0))
    moves = advance("", 9, chain, known_ends={"": 9, "Z": 5, "Y": 2})
    assert [(m.entered, m.position) for m in moves] == [("Z", -1)]
    assert [m.entered for m in advance("Z", 5, chain, known_ends={"": 9, "Z": 5, "Y": 2})] \
        == ["Y"]
    # Without a segment of it known, nothing to replay: passed through, as before.
    assert [m.entered for m in advance("", 9, chain, known_ends={"": 9, "Y": 2})] \
        == ["Z", "Y"]


def test_a_worker_in_an_incarnation_does_not_leave_it_while_a_known_segment_is_ahead(
) -> None:
    # In Z (entered at an earlier step, or a checkpoint naming it), 0-5 replayed while
    # Z's 6-10 is known: the end "none" recorded before Z's place was known does not let
    # the worker move on, at this step or after a restart without a position.
    chain = Chain(("", "Z", "Y"), ("x", "z", "y"),
                  ((False, None), (True, 9), (True, None)), (0, 0, 0))
    known = {"": 9, "Z": 10, "Y": 2}
    assert advance("Z", 5, chain, known_ends=known) == []
    assert advance("Z", None, chain, known_ends=known) == []
    assert [m.entered for m in advance("Z", 10, chain, known_ends=known)] == ["Y"]


@pytest.mark.parametrize("z_segments", [((0, 5),), ((0, 5), (6, 8))],
                         ids=["one-segment", "two-segments"])
def test_a_worker_replays_an_incarnation_whose_end_was_recorded_as_none_before_leaving_it(
        z_segments: tuple[tuple[int, int], ...]) -> None:
    # The chain of two recreates named out of order by an egress before the fix
    # (X, Z, Y; Z's end recorded as "none" although Z segments are archived): the worker
    # replays all of Z's segments rather than moving through Z into Y in one step, or
    # into Y after Z's first segment (its second one known, not replayed).
    h = Harness()
    z_end = z_segments[-1][1]
    try:
        write(h.store, key(0, 9))
        for tid, start, end in (*(("IdZ", a, b) for a, b in z_segments), ("IdY", 0, 2)):
            k = SegmentKey("data", "us-east-1", "t", 3, 0, start, end, tid)
            up = SegmentUpload(h.store, FMT, "temp", WriterOptions())
            up.write_batch(records_to_batch([Record(o, 1_700_000_000_000, None,
                                                    f"{tid}:{o}".encode())
                                             for o in range(start, end + 1)]))
            publish_segment(h.store, up.finish(SegmentMetadata.for_key(
                k, k.span, topic_id=tid)).key, k)
        incs = (Incarnation("IdX", ""), Incarnation("IdZ", "IdZ", {3: 9}, {3: 0}),
                Incarnation("IdY", "IdY", {3: None}, {3: 0}))
        h.store.put("data/us-east-1/t/_topic.json",
                    TopicMetadata(4, {}, "t", "us-east-1", None, {3: 0}, incs).encode())
        w = h.start()
        h.wait(lambda: len(h.sink.committed) == 10 + z_end + 1 + 3)
        assert values(h) == old(range(10)) + [
            f"IdZ:{o}".encode() for o in range(z_end + 1)] + [
            f"IdY:{o}".encode() for o in range(3)]
        h.wait(lambda: w.checkpointed == 2)
    finally:
        h.stop()
