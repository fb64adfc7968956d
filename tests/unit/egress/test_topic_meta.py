"""``_topic.json``: content, and rewritten only when the partition count changes."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from egress.metrics import EgressMetrics
from egress.topic_meta import TopicMetadataPublisher
from replicator.core.errors import PreconditionFailed, ReplicatorError
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.retry import RetryPolicy
from replicator.core.storage import MemoryObjectStore, ObjectInfo
from replicator.core.wire import TopicMetadata


def test_body_keeps_only_copyable_configs() -> None:
    body = json.loads(TopicMetadata.of(
        "t", "r1", 12, {"cleanup.policy": "compact", "retention.ms": "1000",
                        "leader.replication.throttled.replicas": "x"},
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)).encode())
    assert body == {"topic": "t", "region": "r1", "partitions": 12,
                    "configs": {"cleanup.policy": "compact", "retention.ms": "1000"},
                    "updated_at": "2026-01-02T03:04:05.000000Z"}


class FakeAdmin:
    def __init__(self) -> None:
        self.partitions: dict[str, int | None] = {"a": 3, "b": None}
        self.config_calls = 0

    def partition_count(self, topic: str) -> int | None:
        return self.partitions[topic]

    def topic_config(self, topic: str) -> dict[str, str]:
        self.config_calls += 1
        return {"retention.ms": "5"}

    def topic_id(self, topic: str) -> str | None:
        return None


def test_written_at_start_and_when_the_partition_count_changes() -> None:
    store = MemoryObjectStore()
    admin = FakeAdmin()
    metrics = Metrics()
    pub = TopicMetadataPublisher(
        ["a", "b"], admin, store, prefix="data", region="r1", metrics=EgressMetrics(metrics),
        wall=lambda: datetime(2026, 1, 1, tzinfo=UTC), retry_policy=RetryPolicy(attempts=1),
        interval=timedelta(minutes=1))
    pub.check()
    assert json.loads(store.get("data/r1/a/_topic.json"))["partitions"] == 3
    assert store.keys() == ["data/r1/a/_topic.json"]       # b does not exist yet
    pub.check()
    assert metrics.total("egress_topic_metadata_writes_total") == 1   # unchanged: not rewritten
    admin.partitions = {"a": 6, "b": 2}
    pub.check()
    assert json.loads(store.get("data/r1/a/_topic.json"))["partitions"] == 6
    assert json.loads(store.get("data/r1/b/_topic.json"))["partitions"] == 2
    assert metrics.total("egress_topic_metadata_writes_total") == 3


def publisher(store: MemoryObjectStore, topics: tuple[str, ...] = ("a",)
              ) -> TopicMetadataPublisher:
    admin = FakeAdmin()
    admin.partitions = {t: 3 for t in topics}
    return TopicMetadataPublisher(
        list(topics), admin, store, prefix="data", region="r1",
        metrics=EgressMetrics(Metrics()), wall=lambda: datetime(2026, 1, 1, tzinfo=UTC),
        retry_policy=RetryPolicy(attempts=1), interval=timedelta(minutes=1))


def with_admin(store: MemoryObjectStore, admin: FakeAdmin) -> TopicMetadataPublisher:
    return TopicMetadataPublisher(
        ["a"], admin, store, prefix="data", region="r1",
        metrics=EgressMetrics(Metrics()), wall=lambda: datetime(2026, 1, 1, tzinfo=UTC),
        retry_policy=RetryPolicy(attempts=1), interval=timedelta(minutes=1))


def first_positions(store: MemoryObjectStore, topic: str = "a") -> object:
    return json.loads(store.get(f"data/r1/{topic}/_topic.json")).get("first_positions")


def ref(partition: int) -> PartitionRef:
    return PartitionRef("data", "r1", "a", partition)


def test_the_field_is_always_written_and_entries_never_change() -> None:
    store = MemoryObjectStore()
    pub = publisher(store)
    pub.check()
    assert first_positions(store) == {}      # "this egress records them; none yet"
    pub.record_first_position(ref(1), 40, resumed=False)
    assert first_positions(store) == {"1": 40}
    pub.record_first_position(ref(1), 90, resumed=False)   # a later segment: no change
    other = publisher(store)                  # another member, same object
    other.record_first_position(ref(1), 70, resumed=False)
    other.record_first_position(ref(2), 5, resumed=False)
    assert first_positions(store) == {"1": 40, "2": 5}
    # A partition count change rewrites the object and keeps every entry.
    pub._partition_counts.clear()
    pub.check()
    assert first_positions(store) == {"1": 40, "2": 5}


class RacingStore(MemoryObjectStore):
    """Another member writes its entry between this writer's read and its put, once."""

    def __init__(self) -> None:
        super().__init__()
        self.raced = False
        self.refused = 0

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        if kw.get("if_match") and not self.raced:
            self.raced = True
            doc = json.loads(self.get(key))
            doc["first_positions"]["7"] = 700
            super().put(key, json.dumps(doc).encode())
        try:
            return super().put(key, data, **kw)
        except PreconditionFailed:
            self.refused += 1
            raise


def test_a_concurrent_writers_entry_is_kept() -> None:
    store = RacingStore()
    pub = publisher(store)
    pub.check()
    pub.record_first_position(ref(1), 40, resumed=False)
    assert store.refused == 1
    assert first_positions(store) == {"1": 40, "7": 700}


def test_an_upgraded_partition_records_its_lowest_segment_start(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryObjectStore()
    for level, start, end in [(1, 100, 199), (0, 200, 249), (0, 250, 260)]:
        store.put(SegmentKey("data", "r1", "a", 0, level, start, end).to_key(), b"x")
    pub = publisher(store)
    pub.check()
    pub.record_first_position(ref(0), 250, resumed=True)
    assert first_positions(store) == {"0": 100}
    # No segments at all (a commit set by an offset reset or a start egress chose, or the
    # segments before it deleted): the history in the bucket begins at the resume point.
    # Recording nothing left ingress waiting for an entry that never came.
    with caplog.at_level(logging.INFO):
        pub.record_first_position(ref(3), 50, resumed=True)
    assert first_positions(store) == {"0": 100, "3": 50}
    assert "its history in the bucket begins there" in caplog.text


def test_without_topic_json_the_first_position_waits() -> None:
    store = MemoryObjectStore()
    pub = publisher(store)
    with pytest.raises(ReplicatorError):
        pub.record_first_position(ref(0), 0, resumed=False)


def test_partitions_at_start_is_written_once_and_names_the_partitions_added_later() -> None:
    store = MemoryObjectStore()
    admin = FakeAdmin()
    pub = with_admin(store, admin)
    pub.check()
    meta = TopicMetadata.parse(store.get("data/r1/a/_topic.json"), where="x")
    assert (meta.partitions, meta.partitions_at_start) == (3, 3)
    admin.partitions["a"] = 5                   # the topic grows
    pub.check()
    meta = TopicMetadata.parse(store.get("data/r1/a/_topic.json"), where="x")
    assert (meta.partitions, meta.partitions_at_start) == (5, 3)
    assert [pub.added_later("a", p) for p in range(5)] == [False] * 3 + [True] * 2
    # Another process reads it from the bucket; a topic without _topic.json is new.
    other = with_admin(store, admin)
    assert other.added_later("a", 4) and not other.added_later("a", 2)
    assert not other.added_later("never-written", 9)


def test_a_file_an_older_egress_wrote_keeps_its_count_as_the_start() -> None:
    store = MemoryObjectStore()
    store.put("data/r1/a/_topic.json", b'{"partitions": 2, "first_positions": {"0": 0}}')
    admin = FakeAdmin()                          # a has 3 partitions now
    pub = with_admin(store, admin)
    assert pub.added_later("a", 2) and not pub.added_later("a", 1)
    pub.check()
    meta = TopicMetadata.parse(store.get("data/r1/a/_topic.json"), where="x")
    assert (meta.partitions, meta.partitions_at_start) == (3, 2)
    assert meta.first_positions == {0: 0}


def test_a_changed_topic_config_is_written_within_one_check() -> None:
    """A raised retention.ms reaches _topic.json (and so the destination's comparison and
    alignment) at the next check, not only when the partition count changes."""
    store = MemoryObjectStore()
    admin = FakeAdmin()
    configs = {"retention.ms": "5"}
    admin.topic_config = lambda topic: dict(configs)  # type: ignore[method-assign]
    metrics = Metrics()
    pub = TopicMetadataPublisher(
        ["a"], admin, store, prefix="data", region="r1", metrics=EgressMetrics(metrics),
        wall=lambda: datetime(2026, 1, 1, tzinfo=UTC), retry_policy=RetryPolicy(attempts=1),
        interval=timedelta(minutes=1))
    admin.partitions = {"a": 3}
    pub.check()
    pub.check()
    assert metrics.total("egress_topic_metadata_writes_total") == 1
    configs["retention.ms"] = "604800000"
    pub.check()
    meta = json.loads(store.get("data/r1/a/_topic.json"))
    assert meta["configs"]["retention.ms"] == "604800000" and meta["partitions"] == 3
    assert metrics.total("egress_topic_metadata_writes_total") == 2


def test_the_mirror_is_told_after_each_write_settles_and_sees_the_write() -> None:
    """``on_written`` (the low-RPO mirror copies the metadata again before the topic's
    next segment) comes after the object holds the change, for every write path."""
    store = MemoryObjectStore()
    pub = publisher(store)
    told: list[tuple[tuple[str, str, str], object]] = []
    pub.on_written = lambda *t: told.append((t, first_positions(store)))
    pub.check()
    pub.record_first_position(ref(1), 40, resumed=False)
    assert told[-1] == (("data", "r1", "a"), {"1": 40})
    n = len(told)
    other = publisher(store)                  # another member wrote the entry first
    other.record_first_position(ref(2), 5, resumed=False)
    pub.record_first_position(ref(2), 9, resumed=False)   # nothing written, still told
    assert len(told) == n + 1 and told[-1][1] == {"1": 40, "2": 5}
