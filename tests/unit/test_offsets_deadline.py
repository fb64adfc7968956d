"""``send_offsets_to_transaction`` stuck on a coordinator that left (librdkafka 2.16 keeps a
broker that shut down cleanly cached as the group's coordinator; every rolling restart of
tests/cluster moved the placement group's coordinator that way and ingress waited 70 s):
once the group's coordinator answers a fresh client, the call is given up ``SETTLE``
seconds later as ``StaleCoordinator`` (a WARNING), not at its long deadline."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from ingress import offsets_deadline
from ingress.offsets_deadline import OffsetsHung, StaleCoordinator, send_offsets_within
from replicator.core.errors import KafkaFatalError, KafkaRetriableError
from replicator.core.kafka import Admin, Producer, TopicPartition, group_id_of
from replicator.core.kafka.producer import GroupMetadata
from replicator.core.settings import KafkaSettings
from tests.unit.test_ingress_shared import IN_GENERATION, Harness, T


class Stuck:
    """A producer whose ``send_offsets_to_transaction`` returns once ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def send_offsets_to_transaction(self, offsets: Any, meta: Any, timeout: float) -> None:
        self.calls += 1
        self.release.wait(60)


@pytest.fixture
def stuck(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stuck]:
    monkeypatch.setattr(offsets_deadline, "PROBE_AFTER", 0.05)
    monkeypatch.setattr(offsets_deadline, "PROBE_EVERY", 0.05)
    monkeypatch.setattr(offsets_deadline, "SETTLE", 0.2)
    monkeypatch.setattr(offsets_deadline, "SEND_OFFSETS_GRACE", 0.0)
    s = Stuck()
    yield s
    s.release.set()


def send(p: Stuck, probe: Callable[[], bool] | None, timeout: float = 3.0) -> None:
    send_offsets_within(cast("Producer", p), [TopicPartition(T, 0, 0)], IN_GENERATION,
                        timeout, name="t", transactional_id="g.a", coordinator_answers=probe)


def test_a_coordinator_that_answers_others_gives_the_stuck_call_up_as_stale(
        stuck: Stuck) -> None:
    """Without the question the call ends only at its deadline (OffsetsHung, 3 s here;
    70 s with the defaults)."""
    asked: list[int] = []

    def probe() -> bool:
        asked.append(1)
        return len(asked) >= 2          # moving at first, then answering

    with pytest.raises(StaleCoordinator, match="coordinator answered another client"):
        send(stuck, probe)
    assert len(asked) == 2


def test_no_coordinator_answering_waits_for_the_deadline(stuck: Stuck) -> None:
    """The coordinator still moving or loading: a wait that ends by itself, so the call
    keeps its whole deadline; a probe that fails counts as no answer."""
    asked: list[int] = []

    def probe() -> bool:
        asked.append(1)
        if len(asked) % 2:
            raise KafkaRetriableError("no broker")
        return False

    with pytest.raises(OffsetsHung) as e:
        send(stuck, probe, timeout=0.5)
    assert not isinstance(e.value, StaleCoordinator)
    assert len(asked) >= 2


def test_a_call_that_returns_once_the_coordinator_answers_is_not_given_up(
        stuck: Stuck) -> None:
    def probe() -> bool:
        stuck.release.set()             # the producer's own retry finds it too
        return True

    send(stuck, probe)
    assert stuck.calls == 1


def test_the_group_id_is_read_from_the_group_metadata() -> None:
    assert group_id_of(IN_GENERATION) == "grp"
    with pytest.raises(KafkaFatalError):
        group_id_of(GroupMetadata(b"other"))


def test_no_cluster_is_no_coordinator_answering() -> None:
    admin = Admin(KafkaSettings(brokers="127.0.0.1:1"), timeout=0.5)
    assert admin.group_coordinator("grp") is None


def test_the_loop_recreates_the_producer_with_a_warning_and_the_batch_is_redone(
        stuck: Stuck, caplog: pytest.LogCaptureFixture) -> None:
    """The transaction loop asks the placement group's coordinator (the group id from its
    metadata), logs a WARNING (an expected step of a rolling restart, not an ERROR),
    counts the transaction aborted, abandons the producer and commits the redone batch
    with a new one."""
    h = Harness()
    groups: list[str] = []

    def answers(meta: GroupMetadata) -> bool:
        groups.append(group_id_of(meta))
        return True

    h.loop.coordinator_answers = answers  # type: ignore[method-assign]
    h.ownership.grant([(T, 0)])
    try:
        h.loop.start()
        hung = h.producer

        def block() -> None:
            stuck.release.wait(30)

        hung.on_offsets = block
        b0 = h.batch(0, 0, 3)
        with caplog.at_level(logging.INFO, "ingress.transactions"):
            h.loop.submit(b0)
            err = h.outcome(b0)
        assert isinstance(err, StaleCoordinator)
        assert groups and set(groups) == {"grp"}
        ours = [r for r in caplog.records if r.name == "ingress.transactions"]
        assert not [r for r in ours if r.levelno >= logging.ERROR]
        assert [r for r in ours if r.levelno == logging.WARNING
                and "coordinator answered another client" in r.getMessage()]
        assert h.log.count("abort") == 0
        again = h.batch(0, 0, 3)
        h.loop.submit(again)
        assert h.outcome(again) is None
        assert h.producer is not hung and h.producer.committed == [(T, 0, 0), (T, 0, 1),
                                                                   (T, 0, 2)]
        assert h.metrics.total("ingress_transactions_total", outcome="aborted") == 1
    finally:
        stuck.release.set()
        h.loop.close()
