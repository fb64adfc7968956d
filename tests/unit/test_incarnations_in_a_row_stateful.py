"""Two and three recreates in a row over two partitions (Hypothesis stateful): the topic is
deleted and created again while one partition still holds a segment of an earlier topic
and the other, assigned again (Kafka drops the group's offsets with the topic), reads the
later one; each partition names its segments when it closes them, so the later topic's
segments can be named before an earlier topic's. Each partition is on a member of its own,
and a member's check can land between another member's read of the chain and its write
(two publishers racing: the write is refused and merged).

Invariants (docs/architecture.md, "Topic incarnations"):

* the chain lists the incarnations in the order the topics were created, whatever order
  their segments were named in;
* no archived object is ever overwritten; every segment holds one incarnation's records,
  of its own partition, in the location the chain gives that incarnation;
* every record egress fetched is archived, or counted lost; the live topic is archived in
  full;
* replaying each partition as ingress does (``ingress.incarnations.advance`` after each
  segment, with only the segments in the bucket then: all at the start, or arriving one
  at a time in the order they were named) delivers every archived record once,
  incarnation after incarnation in creation order, each in offset order.

Out of the model (documented limits kept by ``test_incarnations_stateful.py`` and
``egress/test_incarnation_ids.py``): a new log that reaches a partition's read position
without offsets going back. A stale partition's new log stays below its position until the
partition resets (out of range) or is assigned again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from egress.metrics import EgressMetrics
from egress.partition_writer import PartitionWriter, WriterContext
from egress.rotation import CloseReason
from egress.topic_meta import TopicMetadataPublisher
from formats.records import Record
from formats.segment_io import open_segment
from ingress.incarnations import Chain, advance
from replicator.core.kafka import OFFSET_BEGINNING
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.retry import RetryPolicy
from replicator.core.storage import ObjectInfo
from replicator.core.wire import TopicMetadata
from tests.unit.egress.fakes import FakeMessage, Harness, RecordingStore, SourceAdmin

TOPIC_JSON = "data/r1/t/_topic.json"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
PARTITIONS = (0, 1)


class RacingStore(RecordingStore):
    """Runs ``hook`` (once) just before a member's next conditional put of
    ``_incarnations.json``: another member's whole read-modify-write lands between that
    member's read of the chain and its put (which is refused and merged).
    """

    hook: Callable[[], bool] | None = None
    """Returns False when it cannot run now (it stays armed)."""

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        if key.endswith("_incarnations.json") and self.hook is not None:
            hook = self.hook
            self.hook = None
            if not hook():
                self.hook = hook
        return super().put(key, data, **kw)


class RecreatesInARow(RuleBasedStateMachine):
    def __init__(self, *, ticking: bool = True) -> None:
        super().__init__()
        self.store = RacingStore()
        self.admin = SourceAdmin("I0", len(PARTITIONS))
        self.tick = 0
        self.ticking = ticking
        """Whether the clocks move (else every id is first seen at the same moment: only
        what each writer read tells the order)."""
        self.source: list[tuple[str, list[int]]] = [("I0", [0 for _ in PARTITIONS])]
        """(topic id, records per partition) of each topic, in creation order."""
        self.fetched: dict[str, set[tuple[int, int]]] = {}
        self.seen: dict[str, bytes] = {}
        # Each partition on an egress member of its own (caches of its own).
        self.h = Harness(store=self.store)
        self.pubs: list[TopicMetadataPublisher] = []
        self.ctxs: list[WriterContext] = []
        for _ in PARTITIONS:
            self._member()
        self.writers: dict[int, PartitionWriter] = {}
        self.pos: dict[int, int] = {}
        self.reading: dict[int, str] = {}
        for p in PARTITIONS:
            self._assign(p)

    def _member(self, p: int | None = None) -> None:
        """An egress member (new, or member ``p`` restarted: nothing cached; its check at
        start is the ``metadata_check`` rule's, left to the search).
        """
        pub = TopicMetadataPublisher(
            ["t"], self.admin, self.store, prefix="data", region="r1",
            metrics=EgressMetrics(Metrics()), wall=self._wall,
            retry_policy=RetryPolicy(attempts=2, initial=timedelta(0)),
            interval=timedelta(minutes=1))
        if p is None:
            pub.check()
        ctx = dataclasses.replace(self.h.ctx, wall=self._wall, incarnations=pub,
                                  first_positions=pub.record_first_position)
        if p is None:
            self.pubs.append(pub)
            self.ctxs.append(ctx)
        else:
            self.pubs[p], self.ctxs[p] = pub, ctx

    def _wall(self) -> datetime:
        return NOW + timedelta(seconds=self.tick)

    # --- egress ------------------------------------------------------------------------

    def _assign(self, p: int) -> None:
        """The partition assigned, its topic id read (as the controller does), read from
        the live topic's oldest record (no commit of it: a new topic, or a new partition).
        """
        tid = self.admin.id
        assert tid is not None          # the model never deletes without creating
        w = PartitionWriter(PartitionRef("data", "r1", "t", p), self.h.limits, None,
                            ctx=self.ctxs[p], metrics=self.h.m.for_partition("r1", "t", p),
                            commit=self.h._commit, topic_id=tid)
        w.hold_seconds = 0.0       # the model delivers no reset while a segment waits
        self.writers[p], self.pos[p], self.reading[p] = w, 0, tid

    def _settle(self, p: int) -> None:
        w = self.writers[p]
        assert w.queue.wait_idle(10)
        for o in list(self.h.outcomes):
            o.writer.outcome(o, 0.0)
        self.h.outcomes.clear()
        if w.failed is not None:
            # Named after the topic changed with no reset: dropped (counted lost), the
            # partition reads the topic it found from its oldest record.
            switch = w._switch_to
            offset = w.rewind_offset()
            w.rewind()
            self.pos[p] = 0 if offset == OFFSET_BEGINNING else offset
            if switch is not None:
                self.reading[p] = switch
        self._check_no_overwrite()

    def _check_no_overwrite(self) -> None:
        for k in self.h.final_keys():
            if k.endswith("_topic.json"):
                continue
            data = self.store.get(k)
            assert self.seen.setdefault(k, data) == data, f"{k} was overwritten"

    @property
    def live(self) -> tuple[str, list[int]]:
        return self.source[-1]

    def _cap(self, p: int, count: int) -> int:
        # A partition still reading an earlier topic sees the new log only by a reset (its
        # position beyond the log) or an assignment: the log stays below the position.
        if self.reading[p] != self.live[0]:
            return min(count, max(self.pos[p] - 1, 0))
        return count

    # --- rules -------------------------------------------------------------------------

    @initialize(n=st.integers(1, 6))
    def archived_before(self, n: int) -> None:
        # Both partitions have records of the first topic archived and a position past
        # them: a recreate then shows as a reset (offsets go back).
        for p in PARTITIONS:
            self.fetch(p, n)
            self.close_segment(p)

    def produce(self, p: int, n: int) -> None:
        counts = self.live[1]
        counts[p] = self._cap(p, counts[p] + n)

    @precondition(lambda self: len(self.source) < 4)
    @rule(n=st.integers(0, 4))
    def recreate(self, n: int) -> None:
        if self.ticking:
            self.tick += 1
        tid = f"I{len(self.source)}"
        self.source.append((tid, [0 for _ in PARTITIONS]))
        self.admin.id = tid
        for p in PARTITIONS:
            self.live[1][p] = self._cap(p, n)

    @rule(p=st.sampled_from(PARTITIONS), n=st.integers(0, 6))
    def fetch(self, p: int, n: int, produced: int | None = None) -> None:
        """The partition fetches up to ``n`` records, ``produced`` (default ``n``) more
        produced to the live topic first (those of a partition still reading an earlier
        topic come after its reset).
        """
        if self.ticking:
            self.tick += 1
        tid, counts = self.live
        w = self.writers[p]
        if self.reading[p] != tid:
            if self.pos[p] <= counts[p]:
                return          # the earlier log is gone; the new one is not there yet
            w.position_left_the_log(self.pos[p], 0)     # closes the open segment
            self.pos[p], self.reading[p] = 0, tid
            self._settle(p)
        self.produce(p, n if produced is None else produced)
        hi = min(counts[p], self.pos[p] + n)
        if hi <= self.pos[p]:
            return
        w.append([FakeMessage(Record(o, 1_700_000_000_000 + o, None, f"{tid}:{p}:{o}".encode()),
                              partition=p) for o in range(self.pos[p], hi)], now=0.0)
        self.fetched.setdefault(tid, set()).update((p, o) for o in range(self.pos[p], hi))
        self.pos[p] = hi

    @rule(p=st.sampled_from(PARTITIONS))
    def close_segment(self, p: int) -> None:
        if self.ticking:
            self.tick += 1
        self.writers[p].close(CloseReason.AGE)
        self._settle(p)

    @rule(p=st.sampled_from(PARTITIONS))
    def metadata_check(self, p: int) -> None:
        # A member's periodic check records the live topic's id, named or not.
        self.pubs[p].check()

    @rule(p=st.sampled_from(PARTITIONS))
    def race_next_pin(self, p: int) -> None:
        # Two publishers racing: member p's check records the live topic's id in the
        # middle of the next chain write of another member.
        def check() -> bool:
            pub = self.pubs[p]
            if pub.running:
                return False       # its own check is writing: not a race
            pub.check()
            return True

        self.store.hook = check

    @precondition(lambda self: any(self.reading[p] != self.live[0] for p in PARTITIONS))
    @rule(p=st.sampled_from(PARTITIONS), restarted=st.booleans())
    def assign_again(self, p: int, restarted: bool = False) -> None:
        if self.reading[p] == self.live[0]:
            return
        # Revoked (its open segment closed and named), then assigned again, on the same
        # member or on one that restarted meanwhile.
        self.writers[p].close(CloseReason.AGE)
        self._settle(p)
        if restarted:
            self._member(p)
        self._assign(p)

    # --- the end -----------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self._drain()
            self._check()
        finally:
            self.h.close()

    def _drain(self) -> None:
        self.store.hook = None
        for _ in range(10):
            done = True
            for p in PARTITIONS:
                tid, counts = self.live
                if self.reading[p] != tid:
                    if self.pos[p] > counts[p]:
                        self.fetch(p, 1, produced=0)
                    else:
                        self.assign_again(p)
                self.fetch(p, 10**6, produced=0)
                self.close_segment(p)
                w = self.writers[p]
                done = done and self.reading[p] == tid and self.pos[p] == counts[p] \
                    and w.segment is None and w.failed is None
            if done:
                break
        for pub in self.pubs:
            pub.check()

    def _check(self) -> None:
        self._check_no_overwrite()
        meta = TopicMetadata.parse(self.store.get(TOPIC_JSON), where="_topic.json")
        created = [tid for tid, _ in self.source]
        listed = [i.topic_id for i in meta.incarnations]
        assert listed == [t for t in created if t in listed], ("creation order", listed)
        label_of = {i.topic_id: i.label for i in meta.incarnations}
        id_of = {i.label: i.topic_id for i in meta.incarnations}
        archived: dict[str, set[tuple[int, int]]] = {}
        segments: dict[int, list[tuple[SegmentKey, list[tuple[int, bytes]]]]] = {}
        # Named order (the order the objects appeared): S3 replication delivers them so.
        for k in sorted(self.h.final_keys(), key=lambda k: list(self.seen).index(k)
                        if k in self.seen else len(self.seen)):
            key = SegmentKey.try_parse(k)
            if key is None:
                continue
            tid = id_of.get(key.incarnation)
            with open_segment(self.store, key) as r:
                assert r.metadata.topic_id == tid, (k, r.metadata.topic_id, tid)
                rows: list[tuple[int, bytes]] = []
                for b in r.iter_batches(10_000):
                    rows += zip(b.column("offset").to_pylist(), b.column("value").to_pylist(),
                                strict=True)
            for o, v in rows:
                assert v == f"{tid}:{key.partition}:{o}".encode(), (k, o, v)
                archived.setdefault(str(tid), set()).add((key.partition, o))
            segments.setdefault(key.partition, []).append((key, rows))
        lost = sum(float(self.h.m.for_partition("r1", "t", p).lost._value.get())
                   for p in PARTITIONS)
        missing = sum(len(self.fetched.get(t, set()) - archived.get(t, set()))
                      for t in created)
        assert missing <= lost, ("fetched, not archived, not counted", missing, lost)
        live, counts = self.live
        assert archived.get(live, set()) == {(p, o) for p in PARTITIONS
                                             for o in range(counts[p])}, "the live topic"
        for p in PARTITIONS:
            want = [f"{t}:{p}:{o}".encode() for t in listed
                    for o in sorted(o for q, o in archived.get(t, set()) if q == p)]
            for at_once in (True, False):
                out = replay(Chain.of(meta, p), segments.get(p, []), at_once=at_once)
                assert out == want, (p, at_once, [label_of[t] for t in listed])


def replay(chain: Chain, arrivals: list[tuple[SegmentKey, list[tuple[int, bytes]]]], *,
           at_once: bool) -> list[bytes]:
    """The values one ingress worker replays of a partition whose segments are all in the
    bucket at its start (``at_once``) or arrive one at a time in ``arrivals``' order. Each
    planning step replays one segment that follows its position in the incarnation it is
    in, then moves on as far as ``advance`` allows with only the segments arrived so far.
    """
    out: list[bytes] = []
    label, position = chain.labels[0], None
    known: list[tuple[SegmentKey, list[tuple[int, bytes]]]] = []
    for arrival in [None] if at_once else [*arrivals, None]:
        if at_once:
            known = list(arrivals)
        elif arrival is not None:
            known.append(arrival)
        for _ in range(2 * len(arrivals) + len(chain.labels) + 2):
            mine = sorted((k.start, rows) for k, rows in known if k.incarnation == label)
            before = (label, position)
            for _start, rows in mine:
                new = [(o, v) for o, v in sorted(set(rows))
                       if position is None or o > position]
                if new and (position is None or new[0][0] == position + 1):
                    out += [v for _o, v in new]
                    position = new[-1][0]
                    break
            ends: dict[str, int] = {}
            for k, _rows in known:
                ends[k.incarnation] = max(k.end, ends.get(k.incarnation, k.end))
            moves = advance(label, position, chain, has_segments=bool(mine),
                            known_ends=ends)
            if moves:
                label, position = moves[-1].entered, moves[-1].position
            if (label, position) == before:
                break
    return out


RecreatesInARow.TestCase.settings = settings(
    max_examples=50, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestRecreatesInARow = RecreatesInARow.TestCase


def r03(state: RecreatesInARow) -> None:
    """The order of the review's reproduction: partition 0 holds a segment of the middle
    topic while partition 1, assigned again, names the last topic's segment first.
    """
    for p in PARTITIONS:
        state.fetch(p, 5)
        state.close_segment(p)
    state.recreate(n=0)
    state.assign_again(0)              # reads the middle topic (the broker dropped commits)
    state.fetch(0, 3)                  # a segment of it open (closed by age later)
    state.recreate(n=0)
    state.assign_again(1)              # reads the last topic, names its segment first
    state.fetch(1, 4)
    state.close_segment(1)
    state.produce(0, 2)                # below partition 0's position 3: out of range
    state.fetch(0, 6, produced=0)      # the reset names the middle topic's segment


def test_two_recreates_in_a_row_named_out_of_order() -> None:
    state = RecreatesInARow(ticking=False)   # only what the writers read tells the order
    try:
        r03(state)
    finally:
        state.teardown()


def test_two_recreates_in_a_row_named_out_of_order_with_clocks() -> None:
    state = RecreatesInARow()
    try:
        r03(state)
    finally:
        state.teardown()


def test_three_recreates_in_a_row_named_out_of_order() -> None:
    state = RecreatesInARow(ticking=False)
    try:
        r03(state)
        state.recreate(n=0)
        state.assign_again(0)
        state.fetch(0, 1)
        state.close_segment(0)
        state.produce(1, 2)            # partition 1's position 4: out of range
        state.fetch(1, 1, produced=0)
    finally:
        state.teardown()


def test_two_members_racing_record_two_recreates_in_creation_order() -> None:
    # Partition 1 names its segment of the middle topic (read before the last one was
    # created); member 0's check records the last topic between member 1's read of the
    # chain and its write.
    state = RecreatesInARow()
    try:
        state.archived_before(n=1)
        state.recreate(n=0)
        state.fetch(1, 1)
        state.race_next_pin(0)
        state.recreate(n=0)
        state.close_segment(1)
        assert state.store.hook is None, "the race did not happen"
    finally:
        state.teardown()
