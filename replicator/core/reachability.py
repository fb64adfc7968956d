"""The dependencies of a running service, asked every few seconds: Kafka, S3, SQS.

A service that started (it reached Kafka first: ``replicator.cli.common.wait_for_kafka``)
can lose a dependency later. ``DependencyWatch`` asks each one a cheap question every
``PROBE_SECONDS`` on its own thread (Kafka: DescribeCluster, then Metadata if that got no
answer, ``probe_kafka``; S3: HEAD of a key that need
not exist; SQS: GetQueueAttributes) and, while one does not answer:

* ``replicator_dependency_unreachable{dependency}`` is 1 and ``/readyz`` is false (the
  service asks ``reachable``);
* one ERROR names it, where it was asked (``host:port``, the endpoint) and the error, when
  it stops answering, and again at most once per ``REPEAT_SECONDS`` while it lasts;
* when it answers again: the gauge back to 0, one INFO, ``/readyz`` true by itself.

An answer that is a refusal (access denied, a missing key or queue) counts as reached: the
dependency is there, and the refusal is the service's own error to report. Only what may
pass (``RetriableError``: no connection, a timeout, 5xx) counts as unreachable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from replicator.core.errors import ReplicatorError, RetriableError
from replicator.core.metrics import Metrics

log = logging.getLogger(__name__)

PROBE_SECONDS = 5.0
"""How often each dependency is asked."""
REPEAT_SECONDS = 60.0
"""While a dependency stays unreachable, its ERROR is repeated at most this often."""
KAFKA_PROBE_TIMEOUT = 5.0
"""Seconds the Kafka question may take."""
S3_PROBE_KEY = "_reachability"
"""The key (under the prefix) whose HEAD asks S3: it need not exist (404 is an answer)."""


def dependency_gauge(metrics: Metrics) -> Any:
    """Register ``replicator_dependency_unreachable`` in ``metrics``."""
    return metrics.gauge(
        "dependency_unreachable",
        "1 while a dependency (kafka, s3, sqs) does not answer the question asked of it "
        "every 5 s (no connection, a timeout, 5xx); /readyz is false meanwhile.",
        ("dependency",))


@dataclass(frozen=True)
class Dependency:
    """One thing the service needs, and how to ask whether it answers.

    ``probe`` raises ``RetriableError`` when the dependency cannot be reached; any other
    outcome (including another ``ReplicatorError``: a refusal) means it answered.
    """

    name: str
    """``kafka``, ``s3`` or ``sqs`` (the metric's label)."""
    where: str
    """What an operator checks: ``host:port`` of the brokers, the endpoint and bucket."""
    probe: Callable[[], None]
    detail: Callable[[], str] | None = None
    """More about a failure (the Kafka client's own reason per broker), or ``None``."""


@dataclass
class _State:
    down_since: float | None = None
    last_error_log: float = 0.0


class DependencyWatch:
    """Asks each dependency every ``every`` seconds on a daemon thread (``start``), or
    once per ``check`` (tests).
    """

    def __init__(self, deps: Sequence[Dependency], metrics: Metrics, *, service: str,
                 every: float = PROBE_SECONDS, repeat: float = REPEAT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deps = list(deps)
        self.service = service
        self.every = every
        self.repeat = repeat
        self.clock = clock
        self.gauge = dependency_gauge(metrics)
        self._state = {d.name: _State() for d in self.deps}
        for d in self.deps:
            self.gauge.labels(d.name).set(0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def unreachable(self) -> list[str]:
        """Names of the dependencies not answering now."""
        return [n for n, s in self._state.items() if s.down_since is not None]

    @property
    def reachable(self) -> bool:
        """True while every dependency answers."""
        return not self.unreachable

    def check(self) -> None:
        """Ask every dependency once."""
        for d in self.deps:
            try:
                d.probe()
            except RetriableError as e:
                self._down(d, e)
            except ReplicatorError:
                self._up(d)          # a refusal is an answer
            else:
                self._up(d)

    def _down(self, d: Dependency, e: BaseException) -> None:
        s, now = self._state[d.name], self.clock()
        first = s.down_since is None
        if first:
            s.down_since = now
            self.gauge.labels(d.name).set(1)
        if first or now - s.last_error_log >= self.repeat:
            s.last_error_log = now
            detail = d.detail() if d.detail is not None else ""
            down = now if s.down_since is None else s.down_since
            since = "" if first else f" for {now - down:.0f}s"
            log.error("cannot reach %s at %s%s: %s%s; %s /readyz is false, asking again "
                      "every %.0fs", _LABELS.get(d.name, d.name), d.where, since, e,
                      f" ({detail})" if detail else "", self.service, self.every)

    def _up(self, d: Dependency) -> None:
        s = self._state[d.name]
        if s.down_since is None:
            return
        log.info("reached %s at %s again after %.0fs; %s /readyz follows its other checks",
                 _LABELS.get(d.name, d.name), d.where, self.clock() - s.down_since,
                 self.service)
        s.down_since = None
        self.gauge.labels(d.name).set(0)

    def start(self) -> None:
        """Ask on a daemon thread until ``close``."""
        self._thread = threading.Thread(target=self._run, name="dependency-watch",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.check()

    def close(self) -> None:
        """Stop the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * KAFKA_PROBE_TIMEOUT)


_LABELS = {"kafka": "Kafka", "s3": "S3", "sqs": "SQS"}


def probe_kafka(admin: Any) -> None:
    """Ask a cluster whether any of its nodes answers: DescribeCluster, and if that got no
    answer, a Metadata request.

    librdkafka sends DescribeCluster to one node it believes up, and a node that just died
    (one of three, a rolling restart) still looks up until its connection fails: the
    question times out although two nodes would answer. A Metadata request goes to a node
    whose connection is up (librdkafka moves it to another on failure), so one node down
    is not read as the cluster being unreachable. Only when neither answers is the
    cluster unreachable, with DescribeCluster's error.

    Raises:
        RetriableError: no node answered either question.
    """
    try:
        admin.cluster()
    except RetriableError as first:
        try:
            admin.topic_partitions()
        except ReplicatorError:
            # No node answered this either (a Metadata request with every connection
            # refused fails as a transport error the client does not flag retriable).
            raise first from None


def kafka_dependency(kafka: Any) -> Dependency:
    """The Kafka cluster of ``kafka`` (``KafkaSettings``), asked by a client of its own
    (``probe_kafka``).
    """
    from replicator.core.kafka import Admin

    admin = Admin(kafka, timeout=KAFKA_PROBE_TIMEOUT, collect_errors=True)

    def detail() -> str:
        errors = admin.client_errors()
        return errors[-1] if errors else ""

    return Dependency("kafka", kafka.brokers, lambda: probe_kafka(admin), detail)


def s3_dependency(store: Any, prefix: str, endpoint: str | None) -> Dependency:
    """The bucket of ``store`` (an ``ObjectStore``), asked with a HEAD of
    ``S3_PROBE_KEY`` under ``prefix`` (a missing key is an answer).
    """
    bucket = getattr(store, "bucket", "?")
    where = f"{endpoint or 'AWS S3'} (bucket {bucket})"
    key = f"{prefix.rstrip('/')}/{S3_PROBE_KEY}" if prefix else S3_PROBE_KEY
    return Dependency("s3", where, lambda: _ignore(store.head(key)))


def sqs_dependency(queue: Any, endpoint: str | None) -> Dependency:
    """The queue (``SqsQueue``), asked with GetQueueAttributes."""
    name = getattr(queue, "name", "?")
    attributes = getattr(queue, "attributes", None)
    # A queue that cannot be asked (an in-memory one in tests) always answers.
    return Dependency("sqs", f"{endpoint or 'AWS SQS'} (queue {name})",
                      lambda: _ignore(attributes() if callable(attributes) else None))


def _ignore(_: object) -> None:
    return None
