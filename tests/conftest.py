"""Shared fixtures: one Kafka broker per region and one moto server per test session.

The broker kind follows ``KAFKA_HOME``: set (``.ci/run`` sets it when ``../shared/kafka``
exists), the integration and chaos tiers run on Apache Kafka from that distribution;
unset, on Tansu (the pip-installable embedded broker). A test marked ``tansu`` stays on
Tansu either way (the demo and a smoke test keep the default covered); a test marked
``apache`` needs a real broker and is skipped, naming ``KAFKA_HOME``, without one. Brokers
of a kind start on first use, both regions at once, and live for the session.

Integration tests use unique topic, bucket and prefix names (``unique_name``), so the
session-scoped servers are shared safely; Apache Kafka creates no topic by accident
(``auto.create.topics.enable=false``), so tests create theirs explicitly. Settings follow
docs/testing.md: short session timeouts (or every rebalance waits ~session.timeout.ms / 2 on
Tansu, and a killed member holds its partitions that long on Kafka), explicit AWS
credentials.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

# Never let the AWS SDK look for real credentials or the instance-metadata endpoint.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from replicator.core.errors import FatalError
from replicator.devstack.processes import (
    KAFKA_HOME_ENV,
    BrokerKind,
    ServerProcess,
    start_broker,
    start_moto,
    stop_seconds,
)

# librdkafka settings that make group joins and rebalances fast (docs/testing.md).
BROKER_KIND: BrokerKind = "apache" if os.environ.get(KAFKA_HOME_ENV) else "tansu"
"""The broker of the integration and chaos tiers: Apache Kafka whenever KAFKA_HOME is set."""

TANSU_ASSIGNOR: dict[str, str] = (
    {"partition.assignment.strategy": "range"} if BROKER_KIND == "tansu" else {})
"""Tansu leaves partitions unowned for seconds per cooperative rebalance (docs/testing.md):
tests give it the eager assignor; on Apache Kafka egress keeps its cooperative default."""

FAST_GROUP_CONFIG = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "topic.metadata.refresh.interval.ms": 1000,
    **TANSU_ASSIGNOR,
}

NEEDS_KAFKA = (f"needs Apache Kafka: set {KAFKA_HOME_ENV} to an Apache Kafka distribution "
               "(e.g. ../shared/kafka; .ci/run does when it exists)")

# Apache Kafka's periodic log tasks, fast enough to be seen within a test: retention and
# the log cleaner run every second from the start (defaults: 5 min, 15 s, after a 30 s
# initial delay). Test records carry recent timestamps (``RECENT_MS``), so only topics a
# test configures for it (a short retention.ms, compaction with small segments) lose any.
APACHE_TEST_PROPERTIES = {
    # Tests that kill group members use session timeouts of 3-4 s, so a dead member's
    # partitions move on quickly; the broker's own floor is 6 s.
    "group.min.session.timeout.ms": "1000",
    "log.initial.task.delay.ms": "0",
    "log.retention.check.interval.ms": "1000",
    "log.cleaner.backoff.ms": "500",
}

Region = Literal["source", "destination"]

RECENT_MS = (int(time.time()) - 3600) * 1000
"""A timestamp base for test records: an hour before the session started, fixed for the
session so expected contents are deterministic within a run. Records with old timestamps
would be deleted by time retention on Apache Kafka (7 days by default, a copied
``retention.ms`` on a destination topic), and Kafka refuses timestamps more than an hour
in the future (``log.message.timestamp.after.max.ms``)."""


def unique_name(prefix: str = "t") -> str:
    """A name no other test uses (topics, buckets, groups, key prefixes)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("apache") is not None and BROKER_KIND != "apache":
        pytest.skip(NEEDS_KAFKA)


class SessionBrokers:
    """The session's brokers: per kind, one per region, started together on first use."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.started: dict[tuple[BrokerKind, Region], ServerProcess] = {}
        self._lock = threading.Lock()

    def get(self, kind: BrokerKind, region: Region) -> ServerProcess:
        with self._lock:
            if (kind, region) not in self.started:
                self._start_pair(kind)
            return self.started[(kind, region)]

    def _start_pair(self, kind: BrokerKind) -> None:
        # Both regions in parallel: an Apache Kafka broker takes 3-5 s to start.
        errors: list[Exception] = []

        def start(region: Region) -> None:
            try:
                name = f"{'kafka' if kind == 'apache' else 'tansu'}-{region}"
                self.started[(kind, region)] = start_broker(
                    kind, name, self.dir, extra_properties=APACHE_TEST_PROPERTIES)
            except (FatalError, OSError) as e:
                errors.append(e)

        threads = [threading.Thread(target=start, args=(r,)) for r in ("source", "destination")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def close(self) -> None:
        stoppers = [threading.Thread(target=p.stop, args=(stop_seconds(kind),))
                    for (kind, _), p in self.started.items()]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()


@pytest.fixture(scope="session")
def servers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def moto_server(servers_dir: Path) -> Iterator[ServerProcess]:
    proc = start_moto(servers_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def moto_endpoint(moto_server: ServerProcess) -> str:
    """``http://127.0.0.1:PORT`` of the session's moto server (S3 and SQS)."""
    return f"http://{moto_server.address}"


@pytest.fixture(scope="session")
def session_brokers(servers_dir: Path) -> Iterator[SessionBrokers]:
    brokers = SessionBrokers(servers_dir)
    yield brokers
    brokers.close()


@pytest.fixture
def broker_kind(request: pytest.FixtureRequest) -> BrokerKind:
    """The broker this test runs on: ``tansu`` if marked so, else the session's kind."""
    if request.node.get_closest_marker("tansu") is not None:
        return "tansu"
    return BROKER_KIND


@pytest.fixture
def source_broker(session_brokers: SessionBrokers, broker_kind: BrokerKind) -> ServerProcess:
    return session_brokers.get(broker_kind, "source")


@pytest.fixture
def dest_broker(session_brokers: SessionBrokers, broker_kind: BrokerKind) -> ServerProcess:
    return session_brokers.get(broker_kind, "destination")


@pytest.fixture
def source_brokers(source_broker: ServerProcess) -> str:
    """bootstrap.servers of the source-region broker."""
    return source_broker.address


@pytest.fixture
def dest_brokers(dest_broker: ServerProcess) -> str:
    """bootstrap.servers of the destination-region broker."""
    return dest_broker.address
