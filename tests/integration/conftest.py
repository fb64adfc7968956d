"""Everything under tests/integration is marked ``integration``; the ``pipe`` fixture; an
S3 client of the session's moto server and a fresh bucket on it."""

from __future__ import annotations

from typing import Any

import pytest

from replicator.core.s3 import make_s3_client
from replicator.devstack.aws import create_bucket
from tests.conftest import unique_name
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


@pytest.fixture(scope="module")
def s3_client(moto_endpoint: str) -> Any:
    """An S3 client of the session's moto server (us-east-1)."""
    return make_s3_client(endpoint_url=moto_endpoint, region="us-east-1",
                          access_key_id="test", secret_access_key="test")


@pytest.fixture
def bucket(s3_client: Any) -> str:
    """A new, empty bucket of ``s3_client``."""
    name = unique_name("b")
    create_bucket(s3_client, name, "us-east-1")
    return name
