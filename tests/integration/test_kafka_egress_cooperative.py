"""Cooperative rebalancing in egress, on Apache Kafka: a member joining under load moves
only the partitions it takes; the others keep their open segments and keep flowing.

With the eager ``range`` assignor every member closes and flushes every open segment of
every partition inside each rebalance; egress now defaults to ``cooperative-sticky``.
"""

from __future__ import annotations

import threading
import time

import pytest

from egress.controller import Egress
from replicator.core.kafka import Producer
from tests.integration.pipeline import Pipeline, running_egress, wait_for

pytestmark = pytest.mark.apache

PARTITIONS = 4


def test_a_member_joining_closes_only_the_partitions_that_move(pipe: Pipeline) -> None:
    pipe.create_source(PARTITIONS)
    stop = threading.Event()

    def load() -> None:
        p = Producer(pipe.source_kafka)
        n = 0
        while not stop.is_set():
            for _ in range(20):
                p.produce(pipe.topic, value=f"v{n}".encode(), partition=n % PARTITIONS,
                          timestamp=int(time.time() * 1000))
                n += 1
            p.poll(0)
            time.sleep(0.05)
        p.flush(30)

    # Segments close only on a rebalance (or at shutdown): long age, huge counts.
    settings = pipe.egress_settings(max_segment_messages=10_000_000,
                                    max_segment_age="1h")
    producer = threading.Thread(target=load, daemon=True)
    producer.start()
    try:
        with running_egress(Egress(settings, store=pipe.store)) as a:
            wait_for(lambda: len(a._writers) == PARTITIONS and all(
                w.segment is not None for w in a._writers.values()), 60,
                "open segments on every partition")
            with running_egress(Egress(settings, store=pipe.store)) as b:
                wait_for(lambda: len(b._writers) == PARTITIONS // 2
                         and len(a._writers) == PARTITIONS // 2, 60,
                         "the partitions split between the two members")
                moved = {p for _, p in b._writers}
                kept = {p for _, p in a._writers}
                wait_for(lambda: all(w.segment is not None and w.segment.count > 0
                                     for w in [*a._writers.values(), *b._writers.values()]),
                         30, "both members flowing")
                closed = {p: a.metrics.total("egress_segments_total", partition=str(p),
                                             reason="revoke") for p in range(PARTITIONS)}
                # Only what moved was closed early; the kept partitions' first segments
                # are still open, never closed by the rebalance.
                assert {p for p, n in closed.items() if n} == moved, closed
                assert all(a._writers[(pipe.topic, p)].segment is not None for p in kept)
                assert all(a._writers[(pipe.topic, p)].committed_offset is None
                           for p in kept)
    finally:
        stop.set()
        producer.join(30)
