"""A dependency lost while a service runs: S3 (a moto server of this test, stopped and
started again on the same port) under a running egress; ``/readyz`` goes false with
``replicator_dependency_unreachable{dependency="s3"}`` and one ERROR naming the endpoint,
then true again by itself. Kafka: a cluster that is not there, named by host:port.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from replicator.core.metrics import Metrics
from replicator.core.reachability import DependencyWatch, kafka_dependency
from replicator.core.s3 import make_s3_client
from replicator.core.settings import KafkaSettings
from replicator.devstack.aws import create_bucket
from replicator.devstack.processes import start_moto
from tests.conftest import RECENT_MS
from tests.integration.pipeline import CREDS, DEST_REGION, new_pipeline, running_egress, wait_for

GAUGE = "replicator_dependency_unreachable"


def test_egress_is_not_ready_while_s3_is_down_and_ready_again_by_itself(
        tmp_path: Path, source_brokers: str, dest_brokers: str,
        caplog: pytest.LogCaptureFixture) -> None:
    moto = start_moto(tmp_path)
    try:
        endpoint = f"http://{moto.address}"
        pipe = new_pipeline(endpoint, source_brokers, dest_brokers)
        assert Admin(pipe.source_kafka).create_topic(pipe.topic, 1)
        p = Producer(pipe.source_kafka)
        for i in range(5):
            p.produce(pipe.topic, value=b"v%d" % i, partition=0, timestamp=RECENT_MS + i)
        p.flush(30)
        eg = Egress(pipe.egress_settings())
        with running_egress(eg), caplog.at_level(logging.INFO, "replicator.core.reachability"):
            wait_for(eg.ready, 60, "egress ready")
            assert eg.metrics.value(GAUGE, {"dependency": "s3"}) == 0
            moto.stop()
            wait_for(lambda: not eg.ready(), 30, "egress not ready with S3 down")
            assert eg.metrics.value(GAUGE, {"dependency": "s3"}) == 1
            assert eg.metrics.value(GAUGE, {"dependency": "kafka"}) == 0
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert any(f"cannot reach S3 at {endpoint} (bucket {pipe.bucket})" in m
                       and "/readyz is false" in m for m in errors), errors
            moto = start_moto(tmp_path, port=moto.port, name="moto-again")
            create_bucket(make_s3_client(endpoint_url=endpoint, region=DEST_REGION, **CREDS),
                          pipe.bucket, DEST_REGION)
            wait_for(eg.ready, 30, "egress ready again")
            assert eg.metrics.value(GAUGE, {"dependency": "s3"}) == 0
            assert any(r.getMessage().startswith(f"reached S3 at {endpoint}")
                       for r in caplog.records)
    finally:
        moto.stop()


def test_a_kafka_cluster_that_does_not_answer_is_named_by_host_and_port(
        caplog: pytest.LogCaptureFixture) -> None:
    # Bound and held, never listening: connections are refused, and no other process (a
    # broker of another test worker) can take the port meanwhile.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        m = Metrics()
        watch = DependencyWatch(
            [kafka_dependency(KafkaSettings(brokers=f"127.0.0.1:{port}"))], m,
            service="egress")
        with caplog.at_level(logging.ERROR, "replicator.core.reachability"):
            watch.check()
    assert watch.unreachable == ["kafka"]
    assert m.value(GAUGE, {"dependency": "kafka"}) == 1
    [msg] = [r.getMessage() for r in caplog.records if r.name == "replicator.core.reachability"]
    assert msg.startswith(f"cannot reach Kafka at 127.0.0.1:{port}: ")
    assert "Connection refused" in msg and "egress /readyz is false" in msg
