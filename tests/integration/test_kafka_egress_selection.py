"""Egress topic selection on Apache Kafka: ``[egress.select]`` patterns pick up a topic
created while egress runs, from its first record; a topic they do not match is never read;
a selected topic that is deleted is released; the topics already flowing keep their open
segments through the subscription changes (cooperative assignor).

Topic names carry a unique prefix (the session's broker is shared), so the pattern is
``<prefix>\\.sensor\\..*`` rather than the documentation's ``sensor\\..*``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from egress.controller import Egress
from replicator.core.errors import ObjectNotFound
from replicator.core.kafka import Admin, Producer
from replicator.core.keys import PartitionRef, SegmentKey, topic_meta_key, topic_prefix
from replicator.core.settings import Settings, load_settings
from replicator.core.storage import ObjectStore
from replicator.core.wire import TopicMetadata
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import (
    CREDS,
    SOURCE_REGION,
    Pipeline,
    running_egress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 2
PER_PARTITION = 15


def _settings(pipe: Pipeline, base: str, explicit: str, interval: str = "1s",
              defaults: dict[str, Any] | None = None) -> Settings:
    return load_settings(data={
        "region": SOURCE_REGION,
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, **CREDS},
        "kafka": {"brokers": pipe.source_brokers, "config": dict(pipe.source_kafka.config)},
        "metrics": {"port": 0},
        "egress": {"group_id": pipe.egress_group, "shutdown_timeout": "10s",
                   "topic_metadata_interval": interval,
                   "select": {"include": [re.escape(base) + r"\.sensor\..*"]},
                   # Small segments: the ranges show where each partition started.
                   "topic_defaults": defaults or {"max_segment_messages": 5,
                                                  "max_segment_age": "500ms"},
                   # Matched by the pattern too; its table wins: segments of 15 records,
                   # open for an hour unless full.
                   "topics": {explicit: {"max_segment_messages": PER_PARTITION,
                                         "max_segment_age": "1h"}}},
    }, environ={})


def _produce(pipe: Pipeline, topic: str, per_partition: int = PER_PARTITION) -> None:
    p = Producer(pipe.source_kafka)
    for i in range(per_partition * PARTITIONS):
        p.produce(topic, value=f"{topic}-{i}".encode(), partition=i % PARTITIONS,
                  timestamp=RECENT_MS + i)
    p.flush(30)


def _ranges(store: ObjectStore, topic: str) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for p in range(PARTITIONS):
        prefix = PartitionRef("data", SOURCE_REGION, topic, p).segments_prefix()
        keys = [SegmentKey.try_parse(o.key) for o in store.list(prefix)]
        out[p] = sorted((k.start, k.end) for k in keys if k is not None)
    return out


def _covered_from_zero(ranges: list[tuple[int, int]], count: int) -> bool:
    nxt = 0
    for start, end in ranges:
        if start != nxt:
            return False
        nxt = end + 1
    return nxt == count


def test_a_topic_created_while_running_is_replicated_from_its_first_record(
        pipe: Pipeline) -> None:
    base = unique_name("sel")
    a, b, other = f"{base}.sensor.a", f"{base}.sensor.b", f"{base}.other.c"
    admin = Admin(pipe.source_kafka)
    assert admin.create_topic(a, PARTITIONS)
    _produce(pipe, a)
    egress = Egress(_settings(pipe, base, a), store=pipe.store)
    with running_egress(egress):
        wait_for(lambda: all(_covered_from_zero(r, PER_PARTITION)
                             for r in _ranges(pipe.store, a).values()), 30,
                 f"{a} segmented")
        # sensor.a's partitions now get open segments (5 records, 1 h) that must survive
        # the subscription changes.
        _produce(pipe, a, 5)
        wait_for(lambda: all(w.segment is not None and w.segment.count == 5
                             for (t, _), w in egress._writers.items() if t == a), 30,
                 f"open segments of {a}")
        # Created while egress runs, records produced at once: the subscription is
        # extended within topic_metadata_interval and reads from offset 0.
        assert admin.create_topic(b, PARTITIONS)
        assert admin.create_topic(other, PARTITIONS)
        _produce(pipe, b)
        _produce(pipe, other)
        wait_for(lambda: all(_covered_from_zero(r, PER_PARTITION)
                             for r in _ranges(pipe.store, b).values()), 30,
                 f"{b} segmented from its first record")
        meta = TopicMetadata.parse(pipe.store.get(topic_meta_key("data", SOURCE_REGION, b)),
                                   where=b)
        assert meta.partitions == PARTITIONS
        assert meta.first_positions == {p: 0 for p in range(PARTITIONS)}
        # Not matched: nothing of it in the bucket, never assigned.
        assert list(pipe.store.list(topic_prefix("data", SOURCE_REGION, other))) == []
        assert not any(t == other for t, _ in egress._writers)
        # The subscription change moved none of sensor.a's partitions: their segments are
        # still open (an eager assignor would have closed them, reason "revoke").
        assert egress.metrics.total("egress_segments_total", topic=a, reason="revoke") == 0
        assert all(w.segment is not None and w.segment.count == 5
                   for (t, _), w in egress._writers.items() if t == a)
        assert egress.metrics.total("egress_selected_topics") == 2

        # A deleted topic leaves the selection: its partitions are released, its
        # _topic.json stays (ingress keeps what was replicated).
        admin.delete_topics([b])
        wait_for(lambda: not any(t == b for t, _ in egress._writers), 30,
                 f"{b}'s partitions released")
        wait_for(lambda: egress.metrics.total("egress_selected_topics") == 1, 30,
                 "the selection without the deleted topic")
        try:
            pipe.store.get(topic_meta_key("data", SOURCE_REGION, b))
        except ObjectNotFound:  # pragma: no cover - the assertion's message
            pytest.fail(f"{b}/_topic.json was deleted")
        assert egress.metrics.total("egress_segments_total", topic=a, reason="revoke") == 0
        assert all(w.segment is not None and w.segment.count == 5
                   for (t, _), w in egress._writers.items() if t == a)
    # At shutdown the open segments of sensor.a are closed: all 20 records per partition.
    assert all(_covered_from_zero(r, PER_PARTITION + 5)
               for r in _ranges(pipe.store, a).values())


def test_a_deleted_topic_the_client_reports_lost_is_closed_durably(pipe: Pipeline) -> None:
    # The selection is checked once an hour, so the client (metadata refreshed every
    # second in tests) notices the deletion first and calls the partitions lost.
    base = unique_name("sel")
    d = f"{base}.sensor.d"
    admin = Admin(pipe.source_kafka)
    assert admin.create_topic(d, PARTITIONS)
    egress = Egress(_settings(pipe, base, f"{base}.unused", interval="1h",
                              defaults={"max_segment_messages": 1000, "max_segment_age": "1h"}),
                    store=pipe.store)
    with running_egress(egress):
        wait_for(lambda: sum(t == d for t, _ in egress._writers) == PARTITIONS, 30,
                 f"{d} assigned")
        _produce(pipe, d, 5)
        wait_for(lambda: all(w.segment is not None and w.segment.count == 5
                             for (t, _), w in egress._writers.items() if t == d), 30,
                 f"open segments of {d}")
        admin.delete_topics([d])
        wait_for(lambda: not any(t == d for t, _ in egress._writers), 30,
                 f"{d}'s partitions released")
        # What was read before the deletion is in the bucket, not aborted.
        assert all(_covered_from_zero(r, 5) for r in _ranges(pipe.store, d).values()), \
            _ranges(pipe.store, d)
