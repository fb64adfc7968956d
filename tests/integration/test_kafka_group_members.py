"""Two egress and two ingress members join and leave under load, on Apache Kafka.

A real group coordinator runs the rebalances the way production does, with the eager
``range`` assignor and with ``cooperative-sticky`` (egress's default; both set through
``kafka.config`` here): egress members hand partitions over at segment boundaries (close,
make durable, commit, release), ingress members hand workers over through the
destination topic's group, the newer transactional producer fencing the older one. The
copy must hold every source record exactly once, in order (exactly-once delivery).
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import pytest

from egress.controller import Egress
from ingress.controller import Ingress
from replicator.core.kafka import Producer
from tests.integration.pipeline import (
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 6


class Load:
    """Produces about 600 records/s over every partition until stopped."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        p = Producer(self.pipe.source_kafka)
        while not self.stop.is_set():
            for _ in range(30):
                p.produce(self.pipe.topic, value=f"v{self.sent}".encode(),
                          key=f"k{self.sent}".encode(), partition=self.sent % PARTITIONS,
                          timestamp=int(time.time() * 1000))
                self.sent += 1
            p.poll(0)
            time.sleep(0.05)
        assert p.flush(30) == 0


def owned_by_egress(eg: Egress) -> int:
    return len(eg._writers)


def owned_by_ingress(pipe: Pipeline, ing: Ingress) -> int:
    return sum(1 for (_r, t, _p) in ing.workers if t == pipe.topic)


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_members_join_and_leave_under_load(pipe: Pipeline, assignor: str) -> None:
    pipe.create_source(PARTITIONS)
    conf = {"partition.assignment.strategy": assignor}
    eg_settings = pipe.egress_settings(kafka_config=conf, max_segment_messages=100)
    in_settings = pipe.ingress_settings(kafka_config=conf, batch_size=50)
    load = Load(pipe)
    with ExitStack() as first, ExitStack() as second:
        eg_a = first.enter_context(running_egress(Egress(eg_settings, store=pipe.store)))
        in_x = first.enter_context(running_ingress(in_settings))
        load.thread.start()
        wait_for(lambda: owned_by_ingress(pipe, in_x) == PARTITIONS
                 and min(pipe.checkpoint_offsets(in_x).values(), default=-1) >= 0, 60,
                 "the first members to replicate every partition")
        # Two members join while records flow.
        eg_b = second.enter_context(running_egress(Egress(eg_settings, store=pipe.store)))
        in_y = second.enter_context(running_ingress(in_settings))
        wait_for(lambda: owned_by_egress(eg_a) + owned_by_egress(eg_b) == PARTITIONS
                 and owned_by_egress(eg_a) > 0 and owned_by_egress(eg_b) > 0, 60,
                 "egress split over two members")
        wait_for(lambda: owned_by_ingress(pipe, in_x) + owned_by_ingress(pipe, in_y)
                 == PARTITIONS and owned_by_ingress(pipe, in_y) > 0
                 and owned_by_ingress(pipe, in_x) > 0, 60, "ingress split over two members")
        time.sleep(3)  # both pairs replicate side by side for a while
        # The first two leave (close: open segments made durable, workers stopped).
        first.close()
        wait_for(lambda: owned_by_egress(eg_b) == PARTITIONS, 60,
                 "the remaining egress member to own every partition")
        wait_for(lambda: owned_by_ingress(pipe, in_y) == PARTITIONS, 60,
                 "the remaining ingress member to own every partition")
        time.sleep(2)
        load.stop.set()
        load.thread.join(60)
        wait_for(lambda: pipe.verify().ok, 120, "the copy to equal the source")
        assert in_y.metrics.total("replicator_ingress_segments_lost_total") == 0
        assert eg_b.metrics.total("egress_source_lost_messages_total") == 0
    report = pipe.verify()
    assert report.ok, report_text(report)
    assert report.totals()["destination_records"] == load.sent
