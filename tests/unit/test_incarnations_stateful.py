"""Topic incarnations over orders of events (Hypothesis stateful): a source partition
deleted and created again any number of times, with any number of records, while egress
fetches (a fetch that goes on into the new log, or a reset when it went back), fails a
copy and rewinds, restarts from its commit (of which topic?), and an egress of the release
before incarnations rewrites ``_topic.json`` without them.

Invariants (docs/architecture.md, "Topic incarnations"):

* no archived object is ever overwritten;
* every segment holds one incarnation's records, at their own offsets, in the location the
  chain gives that incarnation (its footer names it);
* every record egress fetched is archived, or counted lost (``egress_source_lost_messages
  _total``, logged at ERROR with its range); the live topic is archived in full;
* replaying the chain as ingress does (``ingress.incarnations.advance``) delivers every
  archived record once, incarnation after incarnation in the order they were created,
  each in offset order.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from egress.commits import commit_metadata
from egress.controller import own_incarnation
from egress.metrics import EgressMetrics
from egress.partition_writer import PartitionWriter
from egress.rotation import CloseReason
from egress.topic_meta import TopicMetadataPublisher
from formats.records import Record
from formats.segment_io import open_segment
from ingress.incarnations import Chain, advance
from replicator.core.kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.retry import RetryPolicy
from replicator.core.wire import TopicMetadata
from tests.unit.egress.fakes import FakeMessage, Harness, RecordingStore, SourceAdmin

TOPIC_JSON = "data/r1/t/_topic.json"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Incarnations(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = RecordingStore()
        self.admin = SourceAdmin("I0")
        self.source: list[tuple[str, int]] = [("I0", 0)]
        """(topic id, records) of each incarnation, in creation order; the last is live."""
        self.fetched: dict[str, set[int]] = {}
        self.seen: dict[str, bytes] = {}
        self.lost = 0.0
        self.either = 0.0
        """Positions reported as either topic's at a switch (``egress.recreate_loss``)."""
        self.watermarked = True
        """Every fetch so far gave the writer its high watermark, and every earlier topic
        was fetched (records or none) since the writer started."""
        self.noted_live = False
        """The live topic was fetched with a watermark since the writer started."""
        self.commit: tuple[int, str | None] | None = None
        self.harnesses: list[Harness] = []
        self.recreated = False
        self.fetched_after_recreate = False
        self.strict_live = False
        """Ask for the live topic in full even where the documented limit leaves it."""
        self.seeded_at: dict[str, int] = {}
        """Where ``start = "latest"`` seeded a topic (nothing archived before)."""
        self._start(expected=None)

    # --- egress process --------------------------------------------------------------

    def _start(self, expected: int | None) -> None:
        self.pub = TopicMetadataPublisher(
            ["t"], self.admin, self.store, prefix="data", region="r1",
            metrics=EgressMetrics(Metrics()), wall=lambda: NOW,
            retry_policy=RetryPolicy(attempts=2, initial=timedelta(0)),
            interval=timedelta(minutes=1))
        self.pub.check()
        self.h = Harness(store=self.store, first_positions=self.pub.record_first_position,
                         incarnations=self.pub, expected=expected)
        self.harnesses.append(self.h)
        commit = self.h._commit
        # As the controller builds it: the topic id read at assignment.
        writer = self.h.writer = PartitionWriter(
            PartitionRef("data", "r1", "t", 0), self.h.limits, expected, ctx=self.h.ctx,
            metrics=self.h.m.for_partition("r1", "t", 0), commit=commit,
            topic_id=self.admin.id)
        writer.hold_seconds = 0.1

        def recording(offset: int, next_segment: int | None = None, *, first: bool = False,
                      topic_id: str | None = None) -> None:
            commit(offset, next_segment, first=first, topic_id=topic_id)
            self.commit = (offset, topic_id)

        writer._commit = recording
        self.pos = 0 if expected is None else expected

    def _stop(self) -> None:
        self.lost += float(self.h.writer.metrics.lost._value.get())
        self.either += float(self.h.writer.metrics.unattributed._value.get())
        self.h.close()

    def _settle(self) -> None:
        self.h.settle()
        w = self.h.writer
        if w.segment is None and not w.closing and w.topic_id in (None, self.live[0]):
            # A recreate is behind the writer only once its epoch has the live id (a reset
            # or an assignment read it; ``None``: read when the next segment is named).
            # Before that, records the new topic gives at the read position without
            # offsets going back are fetched in the epoch of the earlier id, whether or
            # not a segment was open at the recreate: a second recreate then is the
            # documented limit (``test_recreate_at_position_0_then_again``).
            self.recreated = self.fetched_after_recreate = False
        if w.failed is not None:
            offset = w.rewind_offset()
            if w._switch_to is None and w.failed.epoch == w.epoch:
                # A rewind within the epoch: its records are to be fetched again, as after
                # a restart (below). If the topic is deleted first they went with it, like
                # records it held that egress never read: egress sees no reset (a log
                # read from 0 cannot go back) and nothing tells it they were there. (A
                # rewind of a segment from before a reset is the product's to report.)
                tid = w.topic_id or self.live[0]
                start = 0 if offset == OFFSET_BEGINNING else offset
                self.fetched[tid] = {o for o in self.fetched.get(tid, set()) if o < start}
            w.rewind()
            self.pos = 0 if offset == OFFSET_BEGINNING else offset
        self._check_no_overwrite()

    def _check_no_overwrite(self) -> None:
        for k in self.h.final_keys():
            if k.endswith("_topic.json"):
                continue
            data = self.store.get(k)
            assert self.seen.setdefault(k, data) == data, f"{k} was overwritten"

    @property
    def live(self) -> tuple[str, int]:
        return self.source[-1]

    # --- rules -------------------------------------------------------------------------

    @rule(n=st.integers(1, 8))
    def produce(self, n: int) -> None:
        tid, count = self.live
        self.source[-1] = (tid, count + n)

    @precondition(lambda self: not self.fetched_after_recreate)
    @rule(n=st.integers(0, 12))
    def recreate(self, n: int) -> None:
        # No fetch of the earlier topic since the writer started: its end is unknown.
        self.watermarked = self.watermarked and self.noted_live
        self.noted_live = False
        # Not again while records fetched after the last recreate wait to be named: with
        # two, the middle topic's records fetched without offsets going back cannot be
        # told from the first topic's once the second makes them go back (a documented
        # limit; test_incarnation_ids.py keeps it as a strict xfail).
        self.recreated = True
        tid = f"I{len(self.source)}"
        self.source.append((tid, n))
        self.admin.id = tid

    @rule(n=st.integers(1, 8), watermark=st.booleans())
    def fetch(self, n: int, watermark: bool = False) -> None:
        tid, count = self.live
        w = self.h.writer
        if self.pos > count:
            # The position is beyond the (new) log: the client reads on from its start.
            w.position_left_the_log(self.pos, 0)
            self.pos = 0
        hi = min(count, self.pos + n)
        self.watermarked = self.watermarked and watermark
        if hi <= self.pos:
            if watermark and self.pos == count and w.failed is None:
                w.note_source_end(count, self.pos)    # an empty fetch at the log's end
                self.noted_live = True
            return
        msgs = [FakeMessage(Record(o, 1_700_000_000_000 + o, None, f"{tid}:{o}".encode()))
                for o in range(self.pos, hi)]
        w.append(msgs, now=0.0)
        if watermark:
            self.noted_live = True
            # The fetch response's high watermark: the live log's end, and the consumer's
            # position after the run (egress.poll_loop).
            w.note_source_end(count, hi)
        self.fetched_after_recreate = self.fetched_after_recreate or self.recreated
        self.fetched.setdefault(tid, set()).update(range(self.pos, hi))
        self.pos = hi

    @rule(fail=st.booleans())
    def close_segment(self, fail: bool) -> None:
        if fail:
            self.store.fail["copy"] = 3
        self.h.writer.close(CloseReason.AGE)
        self._settle()
        self.store.fail.pop("copy", None)

    @rule()
    def restart(self) -> None:
        self._stop()
        self.noted_live = False
        # What was fetched and not made durable is fetched again (or went with its topic).
        if self.commit is None:
            self.fetched = {}
        else:
            offset, cid = self.commit
            self.fetched = {str(cid): {o for o in self.fetched.get(str(cid), set())
                                       if o < offset}}
        live = self.admin.id
        _, count = self.live
        expected: int | None = None
        tp = TopicPartition("t", 0, OFFSET_INVALID)
        if self.commit is not None:
            offset, cid = self.commit
            tp = own_incarnation(TopicPartition("t", 0, offset,
                                                commit_metadata(offset, offset, cid)), live)
        if tp.offset >= 0:
            expected = tp.offset
        else:
            # No commit of the live topic: where the bucket says, else start = "latest".
            probe = TopicMetadataPublisher(
                ["t"], self.admin, self.store, prefix="data", region="r1",
                metrics=EgressMetrics(Metrics()), wall=lambda: NOW,
                retry_policy=RetryPolicy(attempts=2, initial=timedelta(0)),
                interval=timedelta(minutes=1))
            start = probe.archived_start(PartitionRef("data", "r1", "t", 0), live)
            if isinstance(start, int):
                expected = start
            elif start is None:
                expected = count                  # the end of the log
                if not any(SegmentKey.try_parse(k) for k in self.h.final_keys()):
                    self.seeded_at[str(live)] = count   # nothing archived: a seeding
        self.commit = None if expected is None else (expected, live)
        self._start(expected)

    @precondition(lambda self: TOPIC_JSON in self.store.keys())  # noqa: SIM118
    @rule()
    def earlier_release_rewrites_topic_json(self) -> None:
        doc = json.loads(self.store.get(TOPIC_JSON))
        for k in ("incarnations", "topic_id", "partitions_at_start"):
            doc.pop(k, None)
        self.store.put(TOPIC_JSON, json.dumps(doc).encode())

    # --- the end: drain, then the invariants -------------------------------------------

    def teardown(self) -> None:
        try:
            self._drain()
            self._check()
        finally:
            self._stop()

    def _drain(self) -> None:
        for _ in range(20):
            self._settle()
            _, count = self.live
            if self.pos == count and self.h.writer.segment is None \
                    and self.h.writer.failed is None:
                break
            self.fetch(count + 1, self.watermarked)
            self.close_segment(False)
        self.pub.check()

    def _check_losses(self, created: list[str], archived: dict[str, dict[int, bytes]]
                      ) -> None:
        # Fetched and not archived: reported lost (an upper bound), or reported as either
        # topic's when fetched after the earlier topic's id was last read.
        missing = sum(len(self.fetched.get(t, set()) - set(archived.get(t, {})))
                      for t in created[:-1])
        lost = self.lost + float(self.h.writer.metrics.lost._value.get())
        either = self.either + float(self.h.writer.metrics.unattributed._value.get())
        assert missing <= lost + either
        if self.watermarked:
            # Every high watermark known: never more claimed lost than the earlier topics'
            # records not archived (without one, the fetched records are an upper bound).
            gone = sum(n - len(archived.get(t, {})) for t, n in self.source[:-1])
            assert lost <= gone, (lost, gone)

    def _check(self) -> None:
        self._check_no_overwrite()
        meta = TopicMetadata.parse(self.store.get(TOPIC_JSON), where="_topic.json")
        chain = Chain.of(meta, 0)
        id_of = dict(zip(chain.labels, chain.ids, strict=True))
        archived: dict[str, dict[int, bytes]] = {}
        by_label: dict[str, list[tuple[int, bytes]]] = {}
        for k in self.h.final_keys():
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
                assert v == f"{tid}:{o}".encode(), (k, o, v)      # its own records
                archived.setdefault(str(tid), {})[o] = v
            by_label.setdefault(key.incarnation, []).extend(rows)
        created = [tid for tid, _ in self.source]
        listed = [i for i in chain.ids]
        assert listed == [t for t in created if t in listed], (listed, created)
        self._check_losses(created, archived)
        live, count = self.live
        want = set(range(self.seeded_at.get(live, 0), count))
        if not self.strict_live and self.h.writer.topic_id not in (None, live):
            # The documented limit: the live topic's log reached exactly the read position
            # and nothing beyond it came, so egress saw no sign of the recreate (no reset,
            # no record to name). Its records below the position are read once a record
            # comes (the naming sees the new id and reads the topic from its oldest
            # record) or the partition is assigned again; none was fetched meanwhile.
            # ``test_recreate_to_the_read_position_and_idle`` keeps the strong form.
            want = set()
        assert set(archived.get(live, {})) >= want, "the live topic in full"
        assert set(archived.get(live, {})) <= set(range(count)), "the live topic's own"
        # Replay as ingress does: every archived record once, in incarnation order.
        out: list[bytes] = []
        label = chain.labels[0] if chain.labels else ""
        position: int | None = None
        for _ in range(len(chain.labels) + 1):
            rows = sorted(set(by_label.get(label, [])))
            for o, v in rows:
                if position is None or o > position:
                    out.append(v)
                    position = o
            moves = advance(label, position, chain, has_segments=bool(rows))
            if not moves:
                break
            label, position = moves[0].entered, moves[0].position
        expected = [v for t in listed for _, v in sorted(archived.get(t, {}).items())]
        assert out == expected


Incarnations.TestCase.settings = settings(
    max_examples=20, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestIncarnations = Incarnations.TestCase


# The orders Hypothesis found, kept as they were found. Both are documented limits
# (docs/architecture.md, "Topic incarnations"): strict xfails, so a fix makes them pass and
# fail here until the limit is lifted from the docs and the model.


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "limit: the topic recreated at read position 0 (the new log cannot go back), its "
    "records fetched in the epoch whose id was read at assignment, then recreated again "
    "with a reset before they are named: archived under the first topic's id"))
def test_recreate_at_position_0_then_again() -> None:
    state = Incarnations()
    try:
        state.recreate(n=0)
        state.close_segment(fail=False)
        state.produce(n=1)
        state.fetch(n=1)
        state.recreate(n=0)        # the model's precondition leaves this order out
    finally:
        state.teardown()


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "limit: the topic recreated with a new log reaching exactly the read position and "
    "idle: egress sees no reset and no record, so the new topic's records below the "
    "position wait for a later record or an assignment"))
def test_recreate_to_the_read_position_and_idle() -> None:
    state = Incarnations()
    state.strict_live = True
    try:
        state.produce(n=1)
        state.restart()
        state.recreate(n=1)
    finally:
        state.teardown()


def test_a_failed_copy_of_the_earlier_topics_segment_after_the_reset_is_counted_lost(
) -> None:
    # The reset closes the earlier topic's segment; its copy fails after the reset. Its
    # records are no longer in the log: the rewind cannot read them again (it used to seek
    # to their offsets in the new log, losing them silently).
    state = Incarnations()
    try:
        state.produce(n=1)
        state.fetch(n=1)
        state.recreate(n=0)
        state.fetch(n=1)
        state.close_segment(fail=True)
    finally:
        state.teardown()


def test_records_rewound_then_deleted_with_their_topic_are_not_egress_s_loss() -> None:
    # Found by Hypothesis (a model error, not the product's): the copy fails, the rewind
    # is to read offset 0 again, and the topic is deleted and created empty first.
    state = Incarnations()
    try:
        state.produce(n=1)
        state.fetch(n=1)
        state.close_segment(fail=True)
        state.recreate(n=0)
    finally:
        state.teardown()


def test_the_first_segment_after_a_reset_commits_the_new_logs_position() -> None:
    # Found by Hypothesis: the earlier topic read up to 11, recreated with 10 records; the
    # new topic's first segment (0..0) committed 11 (the position was the earlier log's,
    # a high-water mark), so a restart skipped its records 1..10, not archived nor counted.
    state = Incarnations()
    try:
        state.produce(n=8)
        state.restart()
        state.produce(n=3)
        state.fetch(n=3)
        state.recreate(n=10)
        state.fetch(n=1)
        state.close_segment(fail=False)
        state.restart()
        state.produce(n=1)
    finally:
        state.teardown()
