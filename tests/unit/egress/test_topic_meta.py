"""``_topic.json``: content, and rewritten only when the partition count changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from egress.controller import Egress
from replicator.core.settings import load_settings
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
    settings = load_settings(data={
        "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "127.0.0.1:1"},
        "egress": {"topics": {"a": {}, "b": {}}}}, environ={})
    store = MemoryObjectStore()
    eg = Egress(settings, store=store)
    admin = FakeAdmin()
    eg._admin = admin  # type: ignore[assignment]
    eg._check_topics()
    assert json.loads(store.get("data/r1/a/_topic.json"))["partitions"] == 3
    assert store.keys() == ["data/r1/a/_topic.json"]       # b does not exist yet
    eg._check_topics()
    assert admin.config_calls == 1                         # unchanged: not rewritten
    admin.partitions = {"a": 6, "b": 2}
    eg._check_topics()
    assert json.loads(store.get("data/r1/a/_topic.json"))["partitions"] == 6
    assert json.loads(store.get("data/r1/b/_topic.json"))["partitions"] == 2
    assert eg.metrics.total("egress_topic_metadata_writes_total") == 3
