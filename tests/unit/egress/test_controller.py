"""The egress controller's assignment: fetch from the positions read, owners of commits."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest

from egress.commits import FIRST_POSITION, NotOwner
from egress.controller import Egress
from replicator.core.kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition
from replicator.core.settings import load_settings
from tests.unit.egress.fakes import Harness
from tests.unit.egress.test_commits import CommitRecorder, commit_in_thread, serve_until


class AssignConsumer:
    """What ``_on_assign`` sees: committed offsets, and the assignment it makes."""

    def __init__(self, committed: dict[int, int], metadata: dict[int, str] | None = None
                 ) -> None:
        self._committed = committed
        self._metadata = metadata or {}
        self.assigned: list[TopicPartition] = []

    def committed(self, tps: Sequence[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition,
                               self._committed.get(tp.partition, OFFSET_INVALID),
                               self._metadata.get(tp.partition, ""))
                for tp in tps]

    def assign_added(self, tps: Sequence[TopicPartition]) -> None:
        self.assigned.extend(tps)


@pytest.fixture
def egress() -> Iterator[Egress]:
    h = Harness()
    settings = load_settings(data={
        "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "localhost:1"},
        "egress": {"group_id": "g", "topics": {"t": {}}}}, environ={})
    eg = Egress(settings, store=h.store)
    eg._ctx = h.ctx
    yield eg
    h.close()


def test_assignment_fetches_from_the_offsets_it_read(egress: Egress) -> None:
    consumer = AssignConsumer({0: 40})
    egress._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])  # type: ignore[arg-type]
    # A commit landing after the read cannot move where the fetch starts: the partition
    # with a commit starts there, the one without from its beginning (what its segment's
    # name, the first record's offset, assumes).
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [
        (0, 40), (1, OFFSET_BEGINNING)]
    assert egress._writers[("t", 0)].expected == 40
    assert egress._writers[("t", 1)].expected is None


def test_a_commit_marking_a_chosen_start_is_not_taken_for_a_resume(egress: Egress) -> None:
    # Partition 0 was started at 2500 by `start = "latest"` on another member (or before a
    # restart), and no segment was written since; partition 1 resumes after segments.
    consumer = AssignConsumer({0: 2500, 1: 40}, {0: FIRST_POSITION})
    egress._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])  # type: ignore[arg-type]
    assert not egress._writers[("t", 0)].resumed
    assert egress._writers[("t", 0)].expected == 2500
    assert egress._writers[("t", 1)].resumed


def test_a_lost_partitions_writer_can_no_longer_commit(egress: Egress) -> None:
    consumer = AssignConsumer({0: 40})
    egress._on_assign(consumer, [TopicPartition("t", 0)])  # type: ignore[arg-type]
    zombie = egress._writers[("t", 0)]
    egress._on_lost(consumer, [TopicPartition("t", 0)])  # type: ignore[arg-type]
    recorder = CommitRecorder()
    t, result = commit_in_thread(zombie._commit, 50)
    serve_until(egress._commits, recorder, t)
    assert recorder.commits == [] and isinstance(result[0], NotOwner)


class SubscribeConsumer:
    """Records the subscriptions the controller makes."""

    def __init__(self) -> None:
        self.subscriptions: list[list[str]] = []

    def subscribe(self, topics: Sequence[str], **_callbacks: object) -> None:
        self.subscriptions.append(list(topics))

    def unsubscribe(self) -> None:
        self.subscriptions.append([])


class ListAdmin:
    def __init__(self, topics: list[str]) -> None:
        self.topics = topics

    def list_topics(self) -> list[str]:
        return list(self.topics)


class MetaRecorder:
    def __init__(self) -> None:
        self.topics: list[str] = []
        self.checks = 0
        self.running = False

    def set_topics(self, topics: frozenset[str]) -> None:
        self.topics = sorted(topics)

    def check(self) -> None:
        self.checks += 1


def test_the_subscription_follows_the_selection() -> None:
    settings = load_settings(data={
        "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "localhost:1"},
        "egress": {"group_id": "g", "select": {"include": ["s\\..*"], "exclude": ["s\\.x"]},
                   "topic_defaults": {"max_segment_messages": 9},
                   "topics": {"_schemas": {"max_segment_messages": 3}}}}, environ={})
    eg = Egress(settings, store=Harness().store)
    consumer, admin = SubscribeConsumer(), ListAdmin(["s.a", "s.x", "o.c", "__consumer_offsets",
                                                      "_schemas", "replicator.checkpoint"])
    meta = MetaRecorder()
    eg._consumer, eg._admin, eg._meta = consumer, admin, meta  # type: ignore[assignment]
    eg._wanted = eg._selected_topics()
    eg._subscribe(eg._wanted)
    assert consumer.subscriptions == [["_schemas", "s.a"]]
    assert eg._limits["s.a"].max_messages == 9 and eg._limits["_schemas"].max_messages == 3

    admin.topics += ["s.b", "s.c"]
    admin.topics.remove("s.a")
    eg._maybe_check_topics(0.0)  # nothing new found yet: no change
    assert consumer.subscriptions == [["_schemas", "s.a"]]
    eg._check_topics()  # the pool's task: select, then write _topic.json ...
    assert meta.topics == ["_schemas", "s.b", "s.c"] and meta.checks == 1
    assert consumer.subscriptions == [["_schemas", "s.a"]]
    eg._maybe_check_topics(0.0)  # ... and only then the poll thread subscribes
    assert consumer.subscriptions[-1] == ["_schemas", "s.b", "s.c"]
    assert eg._limits["s.b"].max_messages == 9
    assert eg.metrics.total("egress_selected_topics") == 3

    admin.topics = ["o.c"]  # everything selected by pattern deleted: the table's topic stays
    eg._check_topics()
    eg._maybe_check_topics(0.0)
    assert consumer.subscriptions[-1] == ["_schemas"]


@pytest.mark.parametrize(("start", "expected"), [
    ("earliest", OFFSET_BEGINNING), ("latest", 25), ("2026-11-01T00:00:00Z", 7),
    ("2026-11-20T00:00:00Z", 25)])
def test_a_partition_without_a_commit_starts_where_the_topic_says(
        start: str, expected: int) -> None:
    # A new deployment on a live cluster: without a commit, the topic's `start` decides
    # (the whole retention window, only new records, or from a time); a commit always wins.
    h = Harness()
    settings = load_settings(data={
        "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "localhost:1"},
        "egress": {"group_id": "g", "topics": {"t": {"start": start}}}}, environ={})
    eg = Egress(settings, store=h.store)
    eg._ctx = h.ctx

    class TimedConsumer(AssignConsumer):
        asked: list[TopicPartition] = []

        def offsets_for_times(self, tps: Sequence[TopicPartition], timeout: float
                              ) -> list[TopicPartition]:
            self.asked.extend(tps)
            # No record at or after the 20th: the end of the log.
            at = 7 if tps[0].offset < 1_795_000_000_000 else -1
            return [TopicPartition(tp.topic, tp.partition, at) for tp in tps]

    class EndsAdmin:
        def log_ends(self, partitions: Sequence[tuple[str, int]], *, timeout: float
                     ) -> dict[tuple[str, int], int]:
            return dict.fromkeys(partitions, 25)

    consumer = TimedConsumer({0: 40})
    eg._admin = EndsAdmin()  # type: ignore[assignment]
    recorder = CommitRecorder()
    try:
        eg._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])  # type: ignore[arg-type]
        writer = eg._writers[("t", 1)]
        if start == "earliest":
            assert writer.expected is None     # named from its first record
        else:
            # The start is an offset, committed at once: a partition that moves, or a
            # process that restarts, before the first segment's commit resumes here and
            # not at a later end of the log.
            assert writer.expected == expected
            deadline = time.monotonic() + 10
            while writer.committed_offset != expected or not recorder.commits:
                eg._commits.serve(recorder)  # type: ignore[arg-type]
                assert time.monotonic() < deadline, "the start was never committed"
                time.sleep(0.01)
            assert recorder.commits == [("t", 1, expected)]
    finally:
        h.close()
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 40), (1, expected)]
    if start == "2026-11-01T00:00:00Z":
        # 2026-11-01T00:00:00Z in milliseconds, asked for the partition without a commit.
        assert [(tp.partition, tp.offset) for tp in consumer.asked] == [(1, 1_793_491_200_000)]


def test_a_partition_added_after_the_start_is_copied_from_its_oldest_record() -> None:
    # start = "latest" seeds a new deployment; a partition the topic gained later (here 4,
    # while partition 0 was there from the start) holds records produced before egress
    # noticed it: starting it at its end would pass them over.
    h = Harness()
    settings = load_settings(data={
        "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "localhost:1"},
        "egress": {"group_id": "g", "topics": {"t": {"start": "latest"}}}}, environ={})
    eg = Egress(settings, store=h.store)
    eg._ctx = h.ctx

    class Added:
        def added_later(self, topic: str, partition: int) -> bool:
            return partition >= 4

        def topic_id(self, topic: str) -> str | None:
            return None

        def archived_start(self, ref: object, topic_id: str | None) -> None:
            return None                          # nothing of the topic archived yet

    class EndsAdmin:
        def log_ends(self, partitions: Sequence[tuple[str, int]], *, timeout: float
                     ) -> dict[tuple[str, int], int]:
            return dict.fromkeys(partitions, 25)

    eg._meta = Added()  # type: ignore[assignment]
    eg._admin = EndsAdmin()  # type: ignore[assignment]
    consumer = AssignConsumer({})
    try:
        eg._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 4)])  # type: ignore[arg-type]
        assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [
            (0, 25), (4, OFFSET_BEGINNING)]
        assert eg._writers[("t", 4)].expected is None     # named from its first record
        assert not eg._writers[("t", 0)].resumed
    finally:
        # No poll loop serves the start commit of partition 0 here: end it at once
        # instead of after the commit's wait (two minutes with its retry).
        eg._commits.close()
        h.close()


def test_the_replicators_own_topics_are_never_selected_by_a_pattern() -> None:
    # Active-active: ingress writes its checkpoint, segment-event and offset-map topics into
    # the cluster egress reads; default and configured names alike stay out of ".*".
    settings = load_settings(data={
        "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "localhost:1"},
        "egress": {"group_id": "g", "select": {"include": [".*"]}},
        "ingress": {"group_id": "i", "sqs_queue": "q", "checkpoint_topic": "ops.cp",
                    "offset_map_topic": "ops.map", "segment_events_topic": "ops.events",
                    "sources": [{"region": "r2", "topic": "orders"}]}}, environ={})
    eg = Egress(settings, store=Harness().store)
    eg._admin = ListAdmin(["orders", "replicator.offsetmap", "replicator.checkpoint",  # type: ignore[assignment]
                           "replicator.segmentevents", "ops.cp", "ops.map", "ops.events"])
    assert eg._selected_topics() == {"orders"}
