"""One node of a three-node cluster down is routine, not an outage: the reachability probe
answers through another node, and the client's transport failures to the dead node are
WARNINGs; only every broker down is an ERROR."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka.config import CLIENT_LOG, TransportToWarning
from replicator.core.metrics import Metrics
from replicator.core.reachability import Dependency, DependencyWatch, probe_kafka

GAUGE = "replicator_dependency_unreachable"


class ThreeNodes:
    """An admin of a cluster whose DescribeCluster went to a dead node: it times out, while
    Metadata (sent to a live node) answers, unless ``all_down``."""

    def __init__(self, *, dead_node_asked: bool = True, all_down: bool = False) -> None:
        self.dead_node_asked = dead_node_asked
        self.all_down = all_down
        self.asked: list[str] = []

    def cluster(self) -> object:
        self.asked.append("DescribeCluster")
        if self.dead_node_asked or self.all_down:
            raise KafkaRetriableError("describe cluster: no answer within 5s")
        return object()

    def topic_partitions(self) -> dict[str, int]:
        self.asked.append("Metadata")
        if self.all_down:
            raise KafkaRetriableError("list topics: Local: Broker transport failure")
        return {"orders": 3}


def test_one_node_down_keeps_kafka_reachable_and_ready(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = ThreeNodes()
    m = Metrics()
    watch = DependencyWatch([Dependency("kafka", "n1:9092,n2:9092,n3:9092",
                                       lambda: probe_kafka(admin))], m, service="ingress")
    with caplog.at_level(logging.INFO, "replicator.core.reachability"):
        watch.check()
    assert watch.reachable and m.value(GAUGE, {"dependency": "kafka"}) == 0
    assert admin.asked == ["DescribeCluster", "Metadata"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_describe_cluster_answering_needs_no_metadata() -> None:
    admin = ThreeNodes(dead_node_asked=False)
    probe_kafka(admin)
    assert admin.asked == ["DescribeCluster"]


def test_every_node_down_is_unreachable_with_describe_clusters_error(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = ThreeNodes(all_down=True)
    m = Metrics()
    watch = DependencyWatch([Dependency("kafka", "n1:9092", lambda: probe_kafka(admin))], m,
                            service="ingress")
    with caplog.at_level(logging.INFO, "replicator.core.reachability"):
        watch.check()
    assert watch.unreachable == ["kafka"] and m.value(GAUGE, {"dependency": "kafka"}) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "describe cluster: no answer within 5s" in errors[0]


def _line(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("librdkafka", level, "", 0, message, None, None)


NODE = "[rdkafka#producer-1] [thrd:127.0.0.1:29093/2]: 127.0.0.1:29093/2: "


@pytest.mark.parametrize("text", [
    "FAIL " + NODE + "Connect to ipv4#127.0.0.1:29093 failed: Connection refused (after 0ms "
    "in state CONNECT)",
    "ERROR " + NODE + "Connect to ipv4#127.0.0.1:29093 failed: Connection refused (after 0ms "
    "in state CONNECT, 3 identical error(s) suppressed)",
    "FAIL " + NODE + "Disconnected (after 1520ms in state UP)",
    "ERROR " + NODE + "Local: Broker transport failure: Disconnected (after 1520ms in state UP)",
    "REQTMOUT " + NODE + "Timed out 2 in-flight, 0 retry-queued, 0 out-queue, 0 partially-sent "
    "requests",
    "FAIL " + NODE + "Receive failed: Connection reset by peer",
])
def test_one_nodes_transport_failure_is_a_warning(text: str) -> None:
    r = _line(text)
    assert TransportToWarning().filter(r)
    assert (r.levelno, r.levelname) == (logging.WARNING, "WARNING")


@pytest.mark.parametrize("text", [
    "ERROR [rdkafka#producer-1] [thrd:app]: rdkafka#producer-1: 3/3 brokers are down",
    "ERROR [rdkafka#consumer-2] [thrd:app]: Local: All broker connections are down "
    "(_ALL_BROKERS_DOWN)",
    # Not transport: a refusal, an authentication failure, a config error stay ERROR.
    "ERROR [rdkafka#producer-1] [thrd:app]: Fatal error: Broker: Producer fenced",
    "ERROR " + NODE + "SASL authentication error: Authentication failed during authentication",
])
def test_all_brokers_down_and_other_errors_stay_errors(text: str) -> None:
    r = _line(text)
    assert TransportToWarning().filter(r)
    assert r.levelno == logging.ERROR


def test_other_levels_are_untouched() -> None:
    r = _line("FAIL " + NODE + "Disconnected", logging.INFO)
    TransportToWarning().filter(r)
    assert r.levelno == logging.INFO


def test_the_client_logger_downgrades_before_it_drops_repeats(
        caplog: pytest.LogCaptureFixture) -> None:
    kinds = [type(f).__name__ for f in CLIENT_LOG.filters]
    assert kinds.index("TransportToWarning") < kinds.index("RepeatsToDebug")
    with caplog.at_level(logging.INFO, "librdkafka"):
        CLIENT_LOG.error("%s", "FAIL " + NODE.replace("29093", "29193")
                         + "Connect to ipv4#127.0.0.1:29193 failed: Connection refused")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_an_admin_question_without_an_answer_is_retriable_not_a_raw_timeout() -> None:
    """Two of three nodes down: DescribeConfigs got no answer within the timeout. Was: the
    future's bare TimeoutError escaped the seam and ended ingress's run loop (its topic
    check catches ReplicatorError only)."""
    from replicator.core.kafka import Admin
    from replicator.core.settings import KafkaSettings

    admin = Admin(KafkaSettings(brokers="127.0.0.1:1"), timeout=0.3)
    for ask in (lambda: admin.effective_topic_config("t"), lambda: admin.topic_config("t"),
                lambda: admin.alter_topic_config("t", {"retention.ms": "1"})):
        with pytest.raises(KafkaRetriableError, match="no answer within"):
            ask()


def test_retriable_session_failures_are_warnings_for_a_minute_then_errors(
        caplog: pytest.LogCaptureFixture) -> None:
    """One node restarting moved the coordinator of ingress's placement group
    (tests/cluster/test_node_failures.py, egress's group coordinator killed, the same node
    coordinating ingress's group): every partition's sessions failed "in no generation"
    for ~15 s, each logged at ERROR (15 lines), though redone from the checkpoint and
    nothing lost. Now WARNINGs while they last under a minute; a run that lasts, or a
    fatal or unexpected failure, is an ERROR; a checkpoint ends the run."""
    from ingress.metrics import IngressMetrics
    from ingress.status import QUIET_RETRIABLE, PartitionStatus
    from replicator.core.errors import GenerationFenced, KafkaFatalError, NotAuthorized
    from replicator.core.wire import Checkpoint

    now = [0.0]
    status = PartitionStatus("src[0]", IngressMetrics.create(Metrics()),
                             {"region": "us-east-1", "topic": "src", "partition": "0"},
                             clock=lambda: now[0])
    fenced = GenerationFenced("this process is in no generation of the placement group")

    def levels() -> list[tuple[int, str]]:
        out = [(r.levelno, r.getMessage()) for r in caplog.records
               if "replay session failed" in r.getMessage()]
        caplog.clear()
        return out

    with caplog.at_level(logging.INFO, "ingress.status"):
        for t in (0.0, 0.5, 1.4, 3.1, 6.4, 15.5):
            now[0] = t
            status.session_failed(fenced, "retriable")
        assert [level for level, _ in levels()] == [logging.WARNING] * 6
        now[0] = QUIET_RETRIABLE
        status.session_failed(fenced, "retriable")
        ((level, message),) = levels()               # still failing after a minute
        assert level == logging.ERROR and "(failing for 60s)" in message, message
        status.checkpointed(Checkpoint(5, "seg", datetime.now(UTC)))
        now[0] += 1
        status.session_failed(fenced, "retriable")
        status.session_failed(KafkaFatalError("boom"), "fatal")
        assert [level for level, _ in levels()] == [logging.WARNING, logging.ERROR]
        # A missing grant waits for an operator: ERROR from the first failure (the TLS/SASL
        # test waits for it naming the principal and the grant).
        status.checkpointed(Checkpoint(6, "seg", datetime.now(UTC)))
        status.session_failed(NotAuthorized("User:x is not allowed: grant it Read"),
                              "retriable")
        assert [level for level, _ in levels()] == [logging.ERROR]
