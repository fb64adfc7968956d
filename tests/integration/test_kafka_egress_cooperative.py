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


def test_a_member_of_the_old_eager_protocol_is_reported_and_the_new_one_joins_after_it(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    """A rolling update from a version that used the eager ``range`` assignor: the broker
    refuses the new cooperative member's join while an old member is in the group. The new
    member must say why and what to do (an ERROR at a bounded rate, not ready), keep the
    old member replicating, and join by itself once the old member has left."""
    import logging

    from replicator.core.kafka import Consumer
    from tests.conftest import FAST_GROUP_CONFIG

    pipe.create_source(2)
    old = Consumer(pipe.source_kafka, pipe.egress_group,
                   {**FAST_GROUP_CONFIG, "partition.assignment.strategy": "range"})
    old.subscribe([pipe.topic])
    deadline = time.monotonic() + 30
    while not old.assignment() and time.monotonic() < deadline:
        old.fetch(10, 0.2)
    assert old.assignment(), "premise: the old member owns the partitions"
    p = Producer(pipe.source_kafka)
    for i in range(10):
        p.produce(pipe.topic, value=f"v{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    settings = pipe.egress_settings(max_segment_messages=5)
    try:
        with caplog.at_level(logging.WARNING), \
                running_egress(Egress(settings, store=pipe.store)) as eg:
            end = time.monotonic() + 10
            while time.monotonic() < end:
                old.fetch(10, 0.2)       # the old member stays in the group
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            refused = [m for m in errors if "partition.assignment.strategy" in m]
            assert len(refused) == 1, errors            # clear, and not once per join
            assert "docs/upgrades.md" in refused[0]
            assert not eg.ready() and not eg._writers
            old.close()                                 # the rolling update completes
            wait_for(lambda: len(eg._writers) == 2 and eg.ready(), 60,
                     "the new member to own both partitions")
            wait_for(lambda: eg.metrics.total("egress_messages_total") == 10, 30,
                     "the records replicated")
    finally:
        try:
            old.close()
        except Exception:  # noqa: BLE001 (closed above already)
            pass
