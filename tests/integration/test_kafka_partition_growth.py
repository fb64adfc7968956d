"""A source topic grows from 4 to 6 partitions while it is replicated, on Apache Kafka.

Egress notices the new partitions (its consumer group rebalances onto them, and
``_topic.json`` records the new count), ingress grows the destination topic with
CreatePartitions and replays the new partitions too. Nothing is lost, duplicated or
reordered. Tansu implements no CreatePartitions, so this needs ``KAFKA_HOME``.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache


class LoadProducer:
    """Produces to every partition the topic has (``partitions``), round-robin."""

    def __init__(self, pipe: Pipeline, partitions: int) -> None:
        self.pipe = pipe
        self.partitions = partitions
        self.stop = threading.Event()
        self.sent = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        p = Producer(self.pipe.source_kafka)
        while not self.stop.is_set():
            for _ in range(60):
                part = self.sent % self.partitions
                p.produce(self.pipe.topic, value=f"v{self.sent}".encode(), partition=part,
                          key=f"k{self.sent}".encode(), timestamp=int(time.time() * 1000))
                self.sent += 1
            p.poll(0)
            time.sleep(0.05)
        assert p.flush(30) == 0
        self.errors.extend(f.reason for f in p.take_failures())


def test_source_grows_from_4_to_6_partitions_while_replicating(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    pipe.create_source(4)
    producer = LoadProducer(pipe, 4)
    egress = Egress(pipe.egress_settings(max_segment_messages=300), store=pipe.store)
    with caplog.at_level(logging.INFO), running_egress(egress), \
            running_ingress(pipe.ingress_settings()) as ing:
        producer.thread.start()
        wait_for(lambda: len(pipe.checkpoint_offsets(ing)) == 4, 60,
                 "ingress replaying the 4 partitions")
        Admin(pipe.source_kafka).grow_topic(pipe.topic, 6)
        wait_for(lambda: Admin(pipe.source_kafka).partition_count(pipe.topic) == 6, 30,
                 "the source to have 6 partitions")
        time.sleep(2)  # the producer's metadata refresh (1 s) sees them too
        producer.partitions = 6
        wait_for(lambda: len(pipe.checkpoint_offsets(ing)) == 6, 90,
                 "ingress replaying all 6 partitions")
        time.sleep(3)
        producer.stop.set()
        producer.thread.join(60)
        assert not producer.errors, producer.errors[:3]
        wait_for(lambda: pipe.verify().ok, 90, "the copy to equal the source")
        assert ing.metrics.total("replicator_ingress_segments_lost_total") == 0
        assert egress.metrics.total("egress_source_lost_messages_total") == 0
    report = pipe.verify()
    assert report.ok, report_text(report)
    totals = report.totals()
    assert totals["destination_records"] == producer.sent
    assert all(p.source_records > 0 for p in report.partitions)  # the new ones have data
    assert Admin(pipe.dest_kafka).partition_count(pipe.dest_topic) == 6
    meta = json.loads(pipe.store.get(f"data/{SOURCE_REGION}/{pipe.topic}/_topic.json"))
    assert meta["partitions"] == 6
    assert any(f"grew destination topic {pipe.dest_topic} from 4 to 6" in r.getMessage()
               for r in caplog.records)
