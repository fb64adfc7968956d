"""SQS relay: publish first, delete after; invalid messages are logged, counted, deleted."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from ingress.metrics import IngressMetrics
from ingress.relay import SqsRelay
from ingress.segment_events import MemorySegmentEvents
from replicator.core.errors import KafkaRetriableError
from replicator.core.keys import SegmentKey
from replicator.core.metrics import Metrics

KEY = SegmentKey("data", "us-east-1", "t", 0, 0, 0, 9)


@dataclass(frozen=True)
class Msg:
    message_id: str
    body: str
    receive_count: int = 1


@dataclass
class FakeQueue:
    pending: list[Msg] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def receive(self, max_messages: int = 10, wait_seconds: int = 20) -> list[Msg]:
        return [m for m in self.pending if m.message_id not in self.deleted][:max_messages]

    def delete(self, messages: Sequence[Any]) -> list[str]:
        self.deleted.extend(m.message_id for m in messages)
        return []


def body(*names: str, key: str = KEY.to_key()) -> str:
    return json.dumps({"Records": [{"eventName": n, "s3": {"bucket": {"name": "b"},
                                                           "object": {"key": key}}}
                                   for n in names]})


def make(queue: FakeQueue) -> tuple[SqsRelay, MemorySegmentEvents, Metrics]:
    metrics = Metrics()
    events = MemorySegmentEvents()
    relay = SqsRelay(queue, events, IngressMetrics.create(metrics), bucket="b", prefix="data",
                     sources=[("us-east-1", "t")])
    return relay, events, metrics


def test_publishes_then_deletes_and_dedupes() -> None:
    q = FakeQueue([Msg("1", body("ObjectCreated:Put", "ObjectCreated:CompleteMultipartUpload")),
                   Msg("2", body("ObjectCreated:Put"))])
    relay, events, metrics = make(q)
    assert relay.run_once() == 1
    assert [e.kind for e in events.log] == ["created"]
    assert q.deleted == ["1", "2"]
    assert metrics.total("replicator_ingress_sqs_events_received_total") == 3


def test_publish_failure_deletes_nothing_and_redelivery_publishes() -> None:
    q = FakeQueue([Msg("1", body("ObjectCreated:Put"))])
    relay, events, _ = make(q)
    events.fail_publish = 1
    with pytest.raises(KafkaRetriableError):
        relay.run_once()
    assert q.deleted == [] and events.log == []
    assert relay.run_once() == 1  # not mistaken for a repeat
    assert q.deleted == ["1"] and len(events.log) == 1


def test_malformed_message_is_logged_counted_and_deleted(
        caplog: pytest.LogCaptureFixture) -> None:
    q = FakeQueue([Msg("bad", "{{{ not json", 3),
                   Msg("test", json.dumps({"Event": "s3:TestEvent"})),
                   Msg("other", body("ObjectCreated:Put", key="data/us-east-1/t/_topic.json"))])
    relay, _, metrics = make(q)
    with caplog.at_level(logging.ERROR):
        assert relay.run_once() == 0
    assert q.deleted == ["bad", "test", "other"]
    assert metrics.value("replicator_ingress_sqs_events_invalid_total",
                         {"reason": "not_json"}) == 1
    assert metrics.total("replicator_ingress_sqs_events_ignored_total") == 2
    assert any("{{{ not json" in r.message for r in caplog.records)
