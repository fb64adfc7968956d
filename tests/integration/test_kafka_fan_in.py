"""Aggregation (N→1): two source regions replicated into one destination topic (docs/topologies.md,
fan-in).

Regions ``us-east-1`` and ``eu-west-1`` run an egress each (on the session's source broker,
each with its own topic and group) into one bucket; ingress in ``us-west-1`` replays both
into ``<base>.all``. Each source's records arrive once each, in their source order per
partition (``replicator verify --fan-in``), exactly once: every source has its own
checkpoints and transactional producer.
"""

from __future__ import annotations

from typing import Any

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer, read_to_end
from replicator.core.settings import Settings, load_settings
from replicator.ops.verify import verify_topics
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import (
    CREDS,
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

OTHER_REGION = "eu-west-1"
PARTITIONS = 2


def _egress(pipe: Pipeline, region: str, topic: str) -> Settings:
    return load_settings(data={
        "region": region,
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, **CREDS},
        "kafka": {"brokers": pipe.source_brokers, "config": dict(pipe.source_kafka.config)},
        "metrics": {"port": 0},
        "egress": {"group_id": unique_name("egress"), "shutdown_timeout": "10s",
                   "topic_metadata_interval": "1s",
                   "topics": {topic: {"max_segment_messages": 30,
                                      "max_segment_age": "500ms"}}},
    }, environ={})


def _ingress(pipe: Pipeline, sources: list[dict[str, Any]]) -> Settings:
    data = pipe.ingress_settings().model_dump(mode="json")
    data["ingress"]["sources"] = [{**s, "lost_segment_timeout": "60s",
                                   "first_segment_delay": "2s"} for s in sources]
    return load_settings(data=data, environ={})


def _produce(pipe: Pipeline, topic: str, start: int, n: int) -> None:
    p = Producer(pipe.source_kafka)
    for i in range(start, start + n):
        p.produce(topic, key=f"k{i % 7}".encode(), value=f"{topic}-{i}".encode(),
                  partition=i % PARTITIONS, timestamp=RECENT_MS + i)
    p.flush(30)


def test_two_regions_into_one_topic_each_source_once_and_in_order(pipe: Pipeline) -> None:
    base = unique_name("fan")
    east, west, dest = f"{base}.orders.east", f"{base}.orders.west", f"{base}.all"
    admin = Admin(pipe.source_kafka)
    for t in (east, west):
        assert admin.create_topic(t, PARTITIONS)
    _produce(pipe, east, 0, 120)
    _produce(pipe, west, 0, 80)
    ingress = _ingress(pipe, [
        {"region": SOURCE_REGION, "topic": east, "destination_topic": dest},
        {"region": OTHER_REGION, "topic": west, "destination_topic": dest}])
    with running_egress(Egress(_egress(pipe, SOURCE_REGION, east), store=pipe.store)), \
            running_egress(Egress(_egress(pipe, OTHER_REGION, west), store=pipe.store)), \
            running_ingress(ingress):
        # More while everything runs: the two sources interleave in the destination.
        _produce(pipe, east, 120, 80)
        _produce(pipe, west, 80, 120)

        def done() -> bool:
            return all(verify_topics(pipe.source_kafka, t, pipe.dest_kafka, dest,
                                     fan_in=True).ok for t in (east, west))

        wait_for(done, 45, f"{east} and {west} in {dest}")
    for t in (east, west):
        report = verify_topics(pipe.source_kafka, t, pipe.dest_kafka, dest, fan_in=True)
        assert report.ok, report_text(report)
        assert report.totals()["destination_records"] == 200
    # Nothing else in it: 200 + 200 records, read_committed.
    assert sum(1 for _ in read_to_end(pipe.dest_kafka, dest, timeout=30)) == 400
    # Both sources wrote to the same partitions (interleaved), each with its checkpoints.
    per_partition = {p: {(m.value() or b"").rsplit(b".", 1)[1].split(b"-")[0]
                         for m in read_to_end(pipe.dest_kafka, dest, partitions=[p],
                                              timeout=30)}
                     for p in range(PARTITIONS)}
    assert all(v == {b"east", b"west"} for v in per_partition.values()), per_partition
