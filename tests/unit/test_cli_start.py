"""A service that cannot reach its Kafka cluster at start: one clear ERROR per attempt
naming the broker and the reason, never "started" before the first metadata answer, and
librdkafka's own repeated lines kept at DEBUG (the process itself:
tests/integration/test_cli_start.py)."""

from __future__ import annotations

import logging
import threading

import pytest

from replicator.cli.common import wait_for_kafka
from replicator.core.errors import KafkaRetriableError, ReplicatorError
from replicator.core.kafka import Admin
from replicator.core.kafka.config import CLIENT_LOG, RepeatsToDebug
from replicator.core.settings import KafkaSettings
from replicator.devstack.processes import free_port

REFUSED = ("FAIL [rdkafka#consumer-2] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: "
           "Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state "
           "CONNECT)")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("librdkafka", level, "", 0, message, None, None)


def test_repeated_client_lines_go_to_debug() -> None:
    clock = Clock()
    f = RepeatsToDebug(window=60, clock=clock)
    logger = logging.getLogger("librdkafka")
    before = logger.level
    try:
        logger.setLevel(logging.INFO)
        assert f.filter(record(REFUSED))
        # The same failure from another client, thread and timing: a repeat, dropped.
        clock.now = 1
        assert not f.filter(record(REFUSED.replace("consumer-2", "producer-1")
                                   .replace("after 0ms", "after 3ms")))
        # Another failure is a line of its own.
        other = REFUSED.replace("127.0.0.1:1", "127.0.0.1:2")
        assert f.filter(record(other))
        # With DEBUG on, a repeat is kept as DEBUG.
        logger.setLevel(logging.DEBUG)
        r = record(REFUSED)
        assert f.filter(r) and (r.levelno, r.levelname) == (logging.DEBUG, "DEBUG")
        # Still true a window later: at its level again, once.
        logger.setLevel(logging.INFO)
        clock.now = 61
        r = record(REFUSED)
        assert f.filter(r) and r.levelno == logging.ERROR
        assert not f.filter(record(REFUSED))
        # DEBUG lines are never touched.
        assert f.filter(record(REFUSED, logging.DEBUG))
    finally:
        logger.setLevel(before)


def test_the_client_logger_has_the_filter() -> None:
    assert any(isinstance(f, RepeatsToDebug) for f in CLIENT_LOG.filters)


class FlakyCluster:
    """Refuses ``failures`` metadata requests, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def list_topics(self) -> list[str]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaRetriableError("list topics: Local: Broker transport failure")
        return ["t"]

    def client_errors(self) -> list[str]:
        return [REFUSED.split("]: ", 1)[1], "1/1 brokers are down"]


def test_one_error_per_attempt_until_the_cluster_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="replicator.cli.common")
    cluster = FlakyCluster(2)
    assert wait_for_kafka(KafkaSettings(brokers="127.0.0.1:1"), "egress", threading.Event(),
                          every=0.01, admin=cluster)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["cannot reach Kafka at 127.0.0.1:1: Connect to ipv4#127.0.0.1:1 "
                      "failed: Connection refused; egress not started, retrying every 0s"] * 2
    assert "reached Kafka at 127.0.0.1:1 after 2 failed attempt(s)" in caplog.messages
    assert cluster.calls == 3


def test_a_reachable_cluster_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="replicator.cli.common")
    assert wait_for_kafka(KafkaSettings(brokers="k:1"), "ingress", threading.Event(),
                          admin=FlakyCluster(0))
    assert caplog.records == []


def test_a_stop_ends_the_wait_on_a_real_client(caplog: pytest.LogCaptureFixture) -> None:
    """The real client against a port where nothing listens: the reason is named, and
    a stop (SIGTERM) ends the wait."""
    caplog.set_level(logging.INFO, logger="replicator.cli.common")
    port = free_port()
    stopping = threading.Event()
    timer = threading.Timer(2.5, stopping.set)
    timer.start()
    try:
        reached = wait_for_kafka(KafkaSettings(brokers=f"127.0.0.1:{port}"), "egress",
                                 stopping, every=1.0, request_timeout=0.5)
    finally:
        timer.cancel()
    assert not reached
    errors = [r.getMessage() for r in caplog.records
              if r.levelno == logging.ERROR and r.name == "replicator.cli.common"]
    assert 1 <= len(errors) <= 3, errors       # one per second at most
    # librdkafka's own line about it once, its repeats (several a second) at DEBUG.
    client = [r for r in caplog.records if r.name == "librdkafka" and r.levelno > logging.DEBUG]
    assert len(client) == 1, [r.getMessage() for r in client]
    assert errors[0] == (f"cannot reach Kafka at 127.0.0.1:{port}: Connect to "
                         f"ipv4#127.0.0.1:{port} failed: Connection refused; egress not "
                         "started, retrying every 1s")


def test_client_errors_are_collected_only_on_request() -> None:
    """A long-lived admin never polls, so its client would queue error events forever."""
    port = free_port()
    for collect in (True, False):
        admin = Admin(KafkaSettings(brokers=f"127.0.0.1:{port}"), timeout=0.5,
                      collect_errors=collect)
        with pytest.raises(ReplicatorError):      # _TRANSPORT: no retriable flag
            admin.list_topics()
        errors = admin.client_errors()
        if collect:
            assert any(e.startswith(f"127.0.0.1:{port}/bootstrap: Connect to") for e in errors)
        else:
            assert errors == []
