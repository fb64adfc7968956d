"""The cluster tier: everything under tests/cluster runs on a three-node Apache Kafka
cluster (``apache`` and ``integration``), skipped with a reason without ``$KAFKA_HOME``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.cluster.cluster import KafkaCluster, new_workdir, remove


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.apache)
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    """One three-node cluster for the module's scenarios (each uses its own topics)."""
    if not os.environ.get("KAFKA_HOME"):
        pytest.skip("the cluster tier needs Apache Kafka: set KAFKA_HOME")
    workdir = new_workdir()
    c = KafkaCluster(workdir)
    try:
        c.start()
        yield c
    finally:
        c.close()
        remove(workdir)
