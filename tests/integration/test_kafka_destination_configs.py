"""An existing destination topic whose configs can lose what the source keeps, on Apache
Kafka: created earlier with the broker's defaults (7-day retention, delete policy, 1 MB
records, here also LogAppendTime), it is reported at ERROR with a metric per config, and
the metric falls back to 0 once an operator aligns the topic. Tansu describes no
effective configs, so this needs ``KAFKA_HOME``.
"""

from __future__ import annotations

import logging
import time

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from tests.integration.pipeline import (
    Pipeline,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

SOURCE_CONFIGS = {"cleanup.policy": "compact", "max.message.bytes": "4000000"}


def test_existing_destination_with_broker_defaults_is_reported(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    pipe.create_source(1, SOURCE_CONFIGS)
    p = Producer(pipe.source_kafka)
    for i in range(10):
        p.produce(pipe.topic, value=b"v", key=b"k%d" % i, partition=0,
                  timestamp=int(time.time() * 1000))
    assert p.flush(30) == 0
    admin = Admin(pipe.dest_kafka)
    assert admin.create_topic(pipe.dest_topic, 1, {"message.timestamp.type": "LogAppendTime"})
    egress = Egress(pipe.egress_settings(), store=pipe.store)
    with caplog.at_level(logging.ERROR, logger="ingress.topics"), running_egress(egress), \
            running_ingress(pipe.ingress_settings()) as ing:
        def mismatch(config: str) -> float | None:
            return ing.metrics.value("replicator_ingress_destination_config_mismatch",
                                     {"topic": pipe.dest_topic, "config": config})

        wait_for(lambda: mismatch("cleanup.policy") == 1, 60, "the mismatch report")
        assert mismatch("max.message.bytes") == 1
        assert mismatch("message.timestamp.type") == 1
        errors = [r.getMessage() for r in caplog.records if pipe.dest_topic in r.getMessage()]
        assert any("cleanup.policy" in e and "source compact, destination delete" in e
                   for e in errors), errors
        # Aligned by an operator: the metric goes back to 0 at the next check.
        admin.alter_topic_config(pipe.dest_topic, {**SOURCE_CONFIGS,
                                                   "message.timestamp.type": "CreateTime"})
        wait_for(lambda: mismatch("cleanup.policy") == 0, 60, "the fix to be seen")
        assert mismatch("max.message.bytes") == 0
        assert mismatch("message.timestamp.type") == 0


def test_align_destination_configs_sets_them_like_the_source(pipe: Pipeline) -> None:
    pipe.create_source(1, SOURCE_CONFIGS)
    admin = Admin(pipe.dest_kafka)
    assert admin.create_topic(pipe.dest_topic, 1, {"message.timestamp.type": "LogAppendTime"})
    egress = Egress(pipe.egress_settings(), store=pipe.store)
    settings = pipe.ingress_settings(align_destination_configs=True)
    with running_egress(egress), running_ingress(settings):
        want = {**SOURCE_CONFIGS, "message.timestamp.type": "CreateTime"}

        def aligned() -> bool:
            conf = admin.effective_topic_config(pipe.dest_topic)
            return all(conf.get(k) == v for k, v in want.items())

        wait_for(aligned, 60, "the destination configs to be aligned")
