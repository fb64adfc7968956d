"""Destination topics with a small ``max.message.bytes``, on Apache Kafka, in both delivery
modes (ingress/README.md, "Destination limits").

* A topic limited to 100 KB replicates beside an ordinary one through the same shared
  producer: its batches are cut to fit (librdkafka alone would send ~1 MB batches the
  broker refuses, and fail every partition of the shared transaction with them).
* A destination that refuses one record (larger than its limit) stops only that record's
  partition, reported by a metric, while the other partition of the same producer goes
  on; once the limit is raised the stopped partition resumes by itself, and the copy ends
  exact (exactly-once) or complete (at-least-once: duplicates allowed, nothing lost).
"""

from __future__ import annotations

import random
import time

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from replicator.ops.verify import verify_topics
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

LIMIT = 100_000
MODES = ["exactly-once", "at-least-once"]


def _fill(pipe: Pipeline, topic: str, partitions: int, per_partition: int,
          big: dict[int, int] | None = None) -> None:
    """Records of 10-300 bytes; ``big``: partition -> index of a 150 KB record."""
    rnd = random.Random(topic)
    # The source topic may be limited too: batches below its limit.
    p = Producer(pipe.source_kafka, overrides={"linger.ms": 5, "batch.size": 50_000})
    now = int(time.time() * 1000)
    for part in range(partitions):
        for i in range(per_partition):
            size = 150_000 if (big or {}).get(part) == i else rnd.randint(10, 300)
            p.produce(topic, value=rnd.randbytes(size), key=b"k%d" % i, partition=part,
                      timestamp=now + i)
    assert p.flush(60) == 0
    p.check_deliveries(topic)


def _settings(pipe: Pipeline, mode: str, topics: list[str], per_partition: int
              ) -> tuple[object, object]:
    # One segment per partition (the records are all there before egress starts), so
    # ingress replays each partition as one batch: far above the 100 KB limit.
    egress = pipe.egress_settings(egress={"topics": {
        t: {"max_segment_messages": per_partition, "max_segment_age": "30s"}
        for t in topics}})
    ingress = pipe.ingress_settings(
        delivery=mode, batch_size=4000,
        sources=[{"region": SOURCE_REGION, "topic": t, "destination_topic": t + ".copy",
                  "lost_segment_timeout": "60s", "first_segment_delay": "1s"}
                 for t in topics])
    return egress, ingress


@pytest.mark.parametrize("mode", MODES)
def test_a_topic_limited_to_100_kb_replicates_beside_an_ordinary_one(
        pipe: Pipeline, mode: str) -> None:
    ordinary = pipe.topic + "-plain"
    pipe.create_source(2, {"max.message.bytes": str(LIMIT)})
    assert Admin(pipe.source_kafka).create_topic(ordinary, 2)
    for t in (pipe.topic, ordinary):
        _fill(pipe, t, 2, 1500)
    egress_s, ingress_s = _settings(pipe, mode, [pipe.topic, ordinary], 1500)
    egress = Egress(egress_s, store=pipe.store)  # type: ignore[arg-type]
    with running_egress(egress), running_ingress(ingress_s) as ing:  # type: ignore[arg-type]
        wait_for(lambda: all(ing.positions().get((SOURCE_REGION, t, p)) == 1499
                             for t in (pipe.topic, ordinary) for p in (0, 1)),
                 90, "both topics replicated")
        assert ing.refused() == {}
    conf = Admin(pipe.dest_kafka).effective_topic_config(pipe.dest_topic)
    assert conf["max.message.bytes"] == str(LIMIT)
    for t in (pipe.topic, ordinary):
        report = verify_topics(pipe.source_kafka, t, pipe.dest_kafka, t + ".copy")
        assert report.totals()["lost"] == 0, report_text(report)
        if mode == "exactly-once":
            assert report.ok, report_text(report)


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_record_stops_only_its_partition_until_the_limit_is_raised(
        pipe: Pipeline, mode: str) -> None:
    pipe.create_source(2)
    _fill(pipe, pipe.topic, 2, 1000, big={0: 600})
    admin = Admin(pipe.dest_kafka)
    assert admin.create_topic(pipe.dest_topic, 2, {"max.message.bytes": str(LIMIT)})
    egress_s, ingress_s = _settings(pipe, mode, [pipe.topic], 1000)
    egress = Egress(egress_s, store=pipe.store)  # type: ignore[arg-type]
    with running_egress(egress), running_ingress(ingress_s) as ing:  # type: ignore[arg-type]
        labels = {"region": SOURCE_REGION, "topic": pipe.topic, "partition": "0"}

        def refused() -> bool:
            return ing.metrics.value("replicator_ingress_partition_refused", labels) == 1

        wait_for(refused, 60, "partition 0 stopped at the refused record")
        # The other partition of the same producer replicates to its end meanwhile.
        wait_for(lambda: ing.positions().get((SOURCE_REGION, pipe.topic, 1)) == 999, 60,
                 "partition 1 replicated")
        assert (ing.positions().get((SOURCE_REGION, pipe.topic, 0)) or -1) < 600
        why = ing.refused()[(SOURCE_REGION, pipe.topic, 0)]
        assert "source offset 600" in why and f"max.message.bytes={LIMIT}" in why, why
        assert ing.ready()
        admin.alter_topic_config(pipe.dest_topic, {"max.message.bytes": "1048588"})
        wait_for(lambda: ing.positions().get((SOURCE_REGION, pipe.topic, 0)) == 999, 60,
                 "partition 0 resumed once the limit was raised")
        assert ing.metrics.value("replicator_ingress_partition_refused", labels) == 0
        assert (ing.metrics.value("replicator_ingress_records_refused_total", labels)
                or 0) >= 1
    report = pipe.verify()
    assert report.totals()["lost"] == 0, report_text(report)
    if mode == "exactly-once":
        assert report.ok, report_text(report)
