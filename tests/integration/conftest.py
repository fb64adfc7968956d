"""Everything under tests/integration is marked ``integration``; the ``pipe`` fixture."""

from __future__ import annotations

import pytest

from tests.integration.pipeline import Pipeline, new_pipeline


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def pipe(moto_endpoint: str, source_brokers: str, dest_brokers: str) -> Pipeline:
    """A fresh egress → bucket → ingress pipeline (own bucket, queue and source topic) on
    the session's brokers and moto server."""
    return new_pipeline(moto_endpoint, source_brokers, dest_brokers)
