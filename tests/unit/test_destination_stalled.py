"""Fewer in-sync replicas than ``min.insync.replicas`` on the destination
(NOT_ENOUGH_REPLICAS): the transaction loop waits with one ERROR naming the partition and
the cause, and ``replicator_ingress_destination_stalled`` at 1; nothing is committed
without its records, and once the replicas are back the transaction commits by itself and
the gauge goes back to 0. With a fake producer whose records stay unacknowledged and a fake
destination (the real one: tests/cluster/test_node_failures.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingress import offsets_deadline, transactions
from ingress.replica_stall import (
    Replicas,
    ReplicaStallWatch,
    UnacknowledgedWatch,
    stalled_gauge,
    under_min_isr,
)
from replicator.core.kafka import Producer
from replicator.core.metrics import Metrics
from tests.promql import fires, scrape
from tests.unit.test_ingress_acks import CPS, Acks, cp, rows
from tests.unit.test_ingress_shared import FakeProducer, Harness, T

GAUGE = "replicator_ingress_destination_stalled"
ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


class Destination:
    """In-sync replicas per partition of ``T`` (of 3), ``min.insync.replicas=2``."""

    def __init__(self) -> None:
        self.in_sync = 3
        self.asked = 0

    def partition_replicas(self, topic: str) -> dict[int, tuple[int, int]]:
        self.asked += 1
        return {0: (self.in_sync, 3), 1: (self.in_sync, 3)}

    def effective_topic_config(self, topic: str) -> dict[str, str]:
        return {"min.insync.replicas": "2", "retention.ms": "-1"}


class Unacknowledged(FakeProducer):
    """Records stay unacknowledged until ``acked`` is set (the broker retries them)."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.acked = threading.Event()

    def flush(self, timeout: float) -> int:
        if self.acked.wait(timeout):
            return super().flush(0)
        return 5


def wait(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def stalled(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Harness, Destination]]:
    monkeypatch.setattr(transactions, "CHECK_AFTER", 0.05)
    monkeypatch.setattr(transactions, "CHECK_EVERY", 0.05)
    h = Harness()
    dest = Destination()
    h.loop.replica_watch = ReplicaStallWatch(lambda: dest, h.loop.metrics.destination_stalled)

    def make() -> Producer:
        p = Unacknowledged(h.log)
        h.producers.append(p)
        return cast("Producer", p)

    h.loop._make = make
    h.ownership.grant([(T, 0), (T, 1)])
    yield h, dest
    h.loop.close()


def test_below_min_isr_one_error_a_gauge_nothing_committed_then_resumes_by_itself(
        stalled: tuple[Harness, Destination], caplog: pytest.LogCaptureFixture) -> None:
    h, dest = stalled
    dest.in_sync = 1                       # two of three destination nodes down
    h.loop.start()
    producer = h.producer
    assert isinstance(producer, Unacknowledged)
    b0 = h.batch(0, 0, 3)
    with caplog.at_level(logging.INFO, "ingress.replica_stall"):
        h.loop.submit(b0)
        wait(lambda: h.metrics.value(GAUGE, {"topic": T, "partition": "0",
                                             "reason": "not_enough_replicas"}) == 1,
             "the gauge")
        asked = dest.asked
        wait(lambda: dest.asked >= asked + 3, "more questions while it lasts")
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors        # once, not once per question
        assert "NOT_ENOUGH_REPLICAS" in errors[0]
        assert "dest[0] has 1 of 3 replica(s) in sync, min.insync.replicas=2" in errors[0]
        assert not b0.done.is_set() and producer.committed == []   # nothing committed
        dest.in_sync = 3                       # the nodes are back
        producer.acked.set()
        assert h.outcome(b0) is None
    assert producer.committed == [(T, 0, 0), (T, 0, 1), (T, 0, 2)]
    assert h.metrics.value(GAUGE, {"topic": T, "partition": "0",
                                   "reason": "not_enough_replicas"}) == 0
    assert any(r.levelno == logging.INFO and "accepts ingress's records again" in r.getMessage()
               for r in caplog.records)


def test_a_slow_flush_with_enough_replicas_is_no_stall(
        stalled: tuple[Harness, Destination], caplog: pytest.LogCaptureFixture) -> None:
    h, dest = stalled
    h.loop.start()
    producer = h.producer
    assert isinstance(producer, Unacknowledged)
    b0 = h.batch(0, 0, 2)
    with caplog.at_level(logging.INFO, "ingress.replica_stall"):
        h.loop.submit(b0)
        wait(lambda: dest.asked >= 2, "questions")
        producer.acked.set()
        assert h.outcome(b0) is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert h.metrics.value(GAUGE, {"topic": T, "partition": "0",
                                   "reason": "not_enough_replicas"}) in (None, 0)


@given(st.integers(0, 5), st.integers(1, 5), st.integers(1, 5))
def test_under_min_isr_is_exactly_fewer_in_sync_than_the_minimum(
        in_sync: int, replicas: int, least: int) -> None:
    r = Replicas("t", 0, in_sync, replicas, least)
    assert under_min_isr(r) == (in_sync < least)


def test_repeats_at_most_once_per_window_and_an_unanswered_question_says_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    dest = Destination()
    dest.in_sync = 1
    m = Metrics()
    w = ReplicaStallWatch(lambda: dest, stalled_gauge(m), repeat=60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "ingress.replica_stall"):
        for t in range(0, 125, 5):
            now[0] = float(t)
            assert w.check([(T, 0)])
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 3

    class Silent(Destination):
        def partition_replicas(self, topic: str) -> dict[int, tuple[int, int]]:
            raise TimeoutError("no answer")

    w2 = ReplicaStallWatch(Silent, stalled_gauge(Metrics()))
    assert w2.check([(T, 0)]) == [] and w2.stalled == []


def _rule(path: Path) -> str:
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the alert rules")
    doc = yaml.safe_load(path.read_text())
    groups = doc["spec"]["groups"] if "spec" in doc else doc["groups"]
    exprs = [r["expr"] for g in groups for r in g["rules"]
             if r.get("alert") == "ReplicatorIngressDestinationStalled"]
    assert len(exprs) == 1, path
    return str(exprs[0])


@pytest.mark.parametrize("path", [ALERTS / "replicator-alerts.yaml",
                                  ALERTS / "prometheusrule.yaml"])
def test_the_alert_fires_while_a_partition_is_stalled_and_not_after(path: Path) -> None:
    expr = _rule(path)
    dest = Destination()
    dest.in_sync = 1
    m = Metrics()
    w = ReplicaStallWatch(lambda: dest, stalled_gauge(m))
    assert not fires(expr, scrape(m.render().decode()), 0.0)
    w.check([(T, 0)])
    assert fires(expr, scrape(m.render().decode()), 0.0)
    w.clear([(T, 0)])
    assert not fires(expr, scrape(m.render().decode()), 0.0)


def test_send_offsets_that_never_returns_abandons_the_producer_and_the_batch_is_redone(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka's send_offsets_to_transaction may ignore its timeout when the group
    coordinator moved (seen in tests/cluster's rolling restart: ingress waited in silence
    for minutes). Now the loop waits its timeout plus a grace, logs one ERROR, abandons the
    producer without calling it again, and the next producer commits the batch redone."""
    monkeypatch.setattr(offsets_deadline, "SEND_OFFSETS_GRACE", 0.2)
    h = Harness()
    h.loop.timeout = 0.3
    h.ownership.grant([(T, 0)])
    release = threading.Event()
    try:
        h.loop.start()
        hung = h.producer

        def block() -> None:
            release.wait(30)

        hung.on_offsets = block
        b0 = h.batch(0, 0, 3)
        with caplog.at_level(logging.INFO, "ingress.transactions"):
            h.loop.submit(b0)
            err = h.outcome(b0)
        assert isinstance(err, offsets_deadline.OffsetsHung)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "did not return within 0s" not in errors[0]
        assert "the producer is abandoned and recreated" in errors[0]
        assert h.log.count("abort") == 0           # the hung producer is not called again
        again = h.batch(0, 0, 3)                   # the worker redoes it from its checkpoint
        h.loop.submit(again)
        assert h.outcome(again) is None
        assert h.producer is not hung and h.producer.committed == [(T, 0, 0), (T, 0, 1),
                                                                   (T, 0, 2)]
        assert hung.committed == []
    finally:
        release.set()
        h.loop.close()


def test_at_least_once_below_min_isr_one_error_a_gauge_no_checkpoint_then_resumes(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The at-least-once path (the shared idempotent producer, ``ingress.acks``): its
    records wait unacknowledged while the destination refuses them. Was: silent until the
    worker's acknowledgement timeout. Now the same ERROR and gauge as the transaction
    loop's, no checkpoint past the unacknowledged records, and once the replicas are back
    the records are acknowledged, the checkpoint follows and the gauge is 0 again."""
    acks = Acks(monkeypatch, auto=False, ack_timeout=30.0)
    dest = Destination()
    dest.in_sync = 1                       # two of three destination nodes down
    m = Metrics()
    acks.shared.unacknowledged = UnacknowledgedWatch(
        ReplicaStallWatch(lambda: dest, stalled_gauge(m)), after=0.05, every=0.05)
    sink = acks.sink(0)
    d = acks.delivery(sink, "src")
    labels = {"topic": sink.topic, "partition": "0", "reason": "not_enough_replicas"}
    settled: list[BaseException | None] = []

    def settle() -> None:
        try:
            d.deliver(rows(0, 3), cp(2))
            d.settle()
            settled.append(None)
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            settled.append(e)

    with caplog.at_level(logging.INFO, "ingress.replica_stall"):
        t = threading.Thread(target=settle, daemon=True)
        t.start()
        wait(lambda: m.value(GAUGE, labels) == 1, "the gauge")
        asked = dest.asked
        wait(lambda: dest.asked >= asked + 3, "more questions while it lasts")
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors
        assert "NOT_ENOUGH_REPLICAS" in errors[0]
        assert (f"{sink.topic}[0] has 1 of 3 replica(s) in sync, min.insync.replicas=2"
                in errors[0])
        with acks.client.lock:             # nothing checkpointed, not even queued
            assert not settled and not [q for q in acks.client.queued + acks.client.log
                                        if q.topic == CPS]
        dest.in_sync = 3                   # the nodes are back: the broker answers
        acks.client.auto = True
        t.join(10)
    assert settled == [None]
    assert acks.checkpoints("src") == [2]
    assert [q.value for q in acks.client.log if q.topic == sink.topic] == [b"v"] * 3
    assert m.value(GAUGE, labels) == 0
    assert any(r.levelno == logging.INFO and "accepts ingress's records again"
               in r.getMessage() for r in caplog.records)


def test_at_least_once_asks_only_about_records_waiting_without_progress() -> None:
    """A sink whose records keep being acknowledged (a busy, healthy destination: always
    some unanswered) is never asked about; one with no progress for ``after`` is, at most
    once per ``every``; progress clears its gauge."""
    now = [0.0]
    dest = Destination()
    dest.in_sync = 1
    m = Metrics()
    w = UnacknowledgedWatch(ReplicaStallWatch(lambda: dest, stalled_gauge(m)),
                            after=3, every=5, clock=lambda: now[0])
    for t in range(20):                    # 10 unanswered throughout, 10 more end each second
        now[0] = float(t)
        w.note("busy", (T, 0), 10, 10 * t)
    assert dest.asked == 0
    for t in range(20, 31):                # stuck from 20 s on
        now[0] = float(t)
        w.note("busy", (T, 0), 10, 200)
    assert dest.asked == 2                 # at 23 s and 28 s
    assert m.value(GAUGE, {"topic": T, "partition": "0", "reason": "not_enough_replicas"}) == 1
    now[0] = 31.0
    w.note("busy", (T, 0), 10, 210)        # records acknowledged again
    assert m.value(GAUGE, {"topic": T, "partition": "0", "reason": "not_enough_replicas"}) == 0
