"""Shared fixtures: one Tansu broker per region and one moto server per test session.

Integration tests use unique topic, bucket and prefix names (``unique_name``), so the
session-scoped servers are shared safely. Settings follow TEST-INFRA.md: short session
timeouts (or every rebalance waits ~session.timeout.ms / 2), explicit AWS credentials.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Never let the AWS SDK look for real credentials or the instance-metadata endpoint.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from replicator.core.processes import ServerProcess, start_moto, start_tansu

# librdkafka settings that make group joins and rebalances fast on Tansu (TEST-INFRA.md).
FAST_GROUP_CONFIG = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "topic.metadata.refresh.interval.ms": 1000,
}


def unique_name(prefix: str = "t") -> str:
    """A name no other test uses (topics, buckets, groups, key prefixes)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


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
def source_broker(servers_dir: Path) -> Iterator[ServerProcess]:
    proc = start_tansu("tansu-source", servers_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def dest_broker(servers_dir: Path) -> Iterator[ServerProcess]:
    proc = start_tansu("tansu-destination", servers_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def source_brokers(source_broker: ServerProcess) -> str:
    """bootstrap.servers of the source-region broker."""
    return source_broker.address


@pytest.fixture(scope="session")
def dest_brokers(dest_broker: ServerProcess) -> str:
    """bootstrap.servers of the destination-region broker."""
    return dest_broker.address
