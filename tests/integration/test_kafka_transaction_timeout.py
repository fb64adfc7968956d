"""A transaction that outlives ``transaction.timeout.ms``, on Apache Kafka.

The transaction coordinator aborts it and bumps the producer's epoch, so the producer is
fenced although no other owner exists. The partition must go on replaying (a new session
fences in turn and resumes from the committed checkpoint) instead of staying stopped until
the next rebalance, and the copy must equal the source. Tansu has no transaction timeout,
so this needs ``KAFKA_HOME``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from egress.controller import Egress
from ingress.sink import KafkaSink, ReplaySink
from replicator.core.kafka import Producer
from replicator.core.settings import IngressSourceSettings
from tests.integration.pipeline import (
    Pipeline,
    report_text,
    running_egress,
    wait_for,
)
from tests.integration.test_ingress import running

pytestmark = pytest.mark.apache

RECORDS = 300
STALL = 14.0   # > transaction.timeout.ms (2 s) + the coordinator's abort check (10 s)


class SlowOnceSink(KafkaSink):
    """Stalls before its first commit for longer than the transaction may stay open."""

    stalled = threading.Event()

    def commit(self) -> None:
        if not SlowOnceSink.stalled.is_set():
            SlowOnceSink.stalled.set()
            time.sleep(STALL)
        super().commit()


def test_a_timed_out_transaction_does_not_stop_the_partition(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    pipe.create_source(1)
    p = Producer(pipe.source_kafka)
    for i in range(RECORDS):
        p.produce(pipe.topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=0,
                  timestamp=int(time.time() * 1000))
    assert p.flush(30) == 0
    settings = pipe.ingress_settings(kafka_config={"transaction.timeout.ms": 2000},
                                     batch_size=50)
    ingress_cfg = settings.ingress
    assert ingress_cfg is not None

    def make_sink(src: IngressSourceSettings, topic: str, partition: int) -> ReplaySink:
        return SlowOnceSink(settings.kafka, topic=topic, partition=partition,
                            checkpoint_topic=ingress_cfg.checkpoint_topic,
                            transactional_id=f"{ingress_cfg.group_id}.{topic}.{partition}")

    egress = Egress(pipe.egress_settings(max_segment_messages=100), store=pipe.store)
    with caplog.at_level(logging.WARNING, logger="ingress.worker"), running_egress(egress), \
            running(settings, make_sink=make_sink) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing) == {0: RECORDS - 1}, 90,
                 "the partition to be replayed to its end")
        assert SlowOnceSink.stalled.is_set()
        fenced = ing.metrics.total("replicator_ingress_worker_errors_total", kind="fenced")
        errors = [r.getMessage() for r in caplog.records if "fenced" in r.getMessage()]
        assert ing.ready()
    report = pipe.verify()
    assert report.ok, report_text(report)
    assert report.totals()["destination_records"] == RECORDS
    print(f"fenced sessions: {fenced}; {errors[:1]}")


def test_a_timed_out_shared_transaction_recreates_the_producer_and_goes_on(
        pipe: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with the process's shared producer: its first transaction stalls right
    before the commit for longer than transaction.timeout.ms; the coordinator aborts it,
    the producer is fenced and recreated (with backoff), and the partition goes on from its
    committed checkpoint: the copy equals the source."""
    from ingress.ownership import Ownership

    stalled = threading.Event()
    guard = Ownership.commit_guard

    def slow_once(self: Ownership, batches: Any) -> Any:
        if not stalled.is_set():
            stalled.set()
            time.sleep(STALL)
        return guard(self, batches)

    monkeypatch.setattr(Ownership, "commit_guard", slow_once)
    pipe.create_source(1)
    p = Producer(pipe.source_kafka)
    for i in range(RECORDS):
        p.produce(pipe.topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=0,
                  timestamp=int(time.time() * 1000))
    assert p.flush(30) == 0
    settings = pipe.ingress_settings(kafka_config={"transaction.timeout.ms": 2000},
                                     batch_size=50)
    egress = Egress(pipe.egress_settings(max_segment_messages=100), store=pipe.store)
    with running_egress(egress), running(settings) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing) == {0: RECORDS - 1}, 90,
                 "the partition to be replayed to its end")
        assert stalled.is_set()
        assert ing.metrics.total("replicator_ingress_transactions_total",
                                 outcome="fenced") >= 1
        assert ing.ready()
    report = pipe.verify()
    assert report.ok, report_text(report)
    assert report.totals()["destination_records"] == RECORDS
