"""``_topic.json``: content, and rewritten only when the partition count changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from egress.metrics import EgressMetrics
from egress.topic_meta import TopicMetadataPublisher
from replicator.core.metrics import Metrics
from replicator.core.retry import RetryPolicy
from replicator.core.storage import MemoryObjectStore
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
    assert admin.config_calls == 1                         # unchanged: not rewritten
    admin.partitions = {"a": 6, "b": 2}
    pub.check()
    assert json.loads(store.get("data/r1/a/_topic.json"))["partitions"] == 6
    assert json.loads(store.get("data/r1/b/_topic.json"))["partitions"] == 2
    assert metrics.total("egress_topic_metadata_writes_total") == 3
