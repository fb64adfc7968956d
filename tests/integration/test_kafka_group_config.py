"""A group setting the broker refuses stops egress and ingress as a configuration error.

Apache Kafka refuses a member whose ``session.timeout.ms`` lies outside the broker's
``group.min.session.timeout.ms`` .. ``group.max.session.timeout.ms`` (6 s .. 30 min by
default; 1 s .. 30 min on the test brokers). Without a check the consumer retries its
JoinGroup forever and never owns a partition; now the controller stops with a
``ConfigError`` naming ``kafka.config`` (exit code 2 from the CLIs). Tansu accepts any
session timeout, so this needs ``KAFKA_HOME``.
"""

from __future__ import annotations

import threading

import pytest

from egress.controller import Egress
from ingress.controller import Ingress
from replicator.core.errors import ConfigError, ReplicatorError
from replicator.core.kafka import Producer
from tests.conftest import RECENT_MS
from tests.integration.pipeline import Pipeline, running_egress, wait_for

pytestmark = pytest.mark.apache

REFUSED = {"session.timeout.ms": 500, "heartbeat.interval.ms": 100}


def run_until_error(ctl: Egress | Ingress) -> Exception | None:
    errors: list[Exception] = []

    def run() -> None:
        try:
            ctl.run()
        except ReplicatorError as e:
            errors.append(e)

    ctl.start()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    ctl.stop()
    t.join(30)
    ctl.close()
    return errors[0] if errors else None


def test_egress_stops_on_a_session_timeout_the_broker_refuses(pipe: Pipeline) -> None:
    pipe.create_source(1)
    err = run_until_error(Egress(pipe.egress_settings(kafka_config=REFUSED),
                                 store=pipe.store))
    assert isinstance(err, ConfigError) and err.key == "kafka.config", err
    assert "session.timeout.ms" in str(err)


def test_ingress_stops_on_a_session_timeout_the_broker_refuses(pipe: Pipeline) -> None:
    pipe.create_source(1)
    p = Producer(pipe.source_kafka)
    p.produce(pipe.topic, b"v", partition=0, timestamp=RECENT_MS)
    assert p.flush(30) == 0
    # Egress (with a valid timeout) writes _topic.json, so ingress subscribes and joins.
    with running_egress(Egress(pipe.egress_settings(), store=pipe.store)):
        wait_for(lambda: bool(list(pipe.store.list(f"data/us-east-1/{pipe.topic}/"))), 30,
                 "_topic.json")
    err = run_until_error(Ingress(pipe.ingress_settings(kafka_config=REFUSED)))
    assert isinstance(err, ConfigError) and err.key == "kafka.config", err
