"""Ingress sources named by pattern on Apache Kafka: egress selects ``<base>.sensor.*``,
ingress replays ``topic_pattern = "<base>\\.sensor\\..*"`` into ``"{topic}.copy"``. A topic
created while both run appears in the destination as ``<topic>.copy`` without a restart,
an exact copy (docs/topologies.md; docs/architecture.md, "Topic metadata").

Topic names carry a unique prefix (the session's brokers are shared).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from replicator.core.settings import Settings, load_settings
from replicator.ops.verify import verify_topics
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import (
    CREDS,
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 2


def _egress(pipe: Pipeline, pattern: str) -> Settings:
    return load_settings(data={
        "region": SOURCE_REGION,
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, **CREDS},
        "kafka": {"brokers": pipe.source_brokers, "config": dict(pipe.source_kafka.config)},
        "metrics": {"port": 0},
        "egress": {"group_id": pipe.egress_group, "shutdown_timeout": "10s",
                   "topic_metadata_interval": "1s", "select": {"include": [pattern]},
                   "topic_defaults": {"max_segment_messages": 40,
                                      "max_segment_age": "500ms"}},
    }, environ={})


def _ingress(pipe: Pipeline, pattern: str, **extra: Any) -> Settings:
    settings = pipe.ingress_settings()
    data = settings.model_dump(mode="json")
    data["ingress"]["sources"] = [{"region": SOURCE_REGION, "topic_pattern": pattern,
                                   "destination_topic": "{topic}.copy",
                                   "lost_segment_timeout": "60s",
                                   "first_segment_delay": "2s"}]
    data["ingress"]["topic_check_interval"] = "30s"   # events, not the interval, find b
    data["ingress"].update(extra)
    return load_settings(data=data, environ={})


def _produce(pipe: Pipeline, topic: str, n: int) -> None:
    p = Producer(pipe.source_kafka)
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=f"{topic}-{i}".encode(),
                  partition=i % PARTITIONS, timestamp=RECENT_MS + i,
                  headers=[("h", str(i).encode())] if i % 3 else None)
    p.flush(30)


def test_a_topic_created_while_running_is_replicated_into_its_template(
        pipe: Pipeline) -> None:
    base = unique_name("pat")
    a, b, other = f"{base}.sensor.a", f"{base}.sensor.b", f"{base}.other"
    pattern = re.escape(base) + r"\.sensor\..*"
    admin = Admin(pipe.source_kafka)
    for t in (a, other):
        assert admin.create_topic(t, PARTITIONS)
    _produce(pipe, a, 100)
    _produce(pipe, other, 10)
    # Egress replicates every topic of the base (so the bucket holds `other` too); ingress
    # takes only those its pattern matches.
    with running_egress(Egress(_egress(pipe, re.escape(base) + r"\..*"), store=pipe.store)), \
            running_ingress(_ingress(pipe, pattern)) as ing:
        wait_for(lambda: verify_topics(pipe.source_kafka, a, pipe.dest_kafka,
                                       f"{a}.copy").ok, 45, f"{a}.copy equal to {a}")
        assert admin.create_topic(b, PARTITIONS)
        _produce(pipe, b, 150)
        wait_for(lambda: Admin(pipe.dest_kafka).partition_count(f"{b}.copy") is not None,
                 25, f"{b}.copy created")
        wait_for(lambda: verify_topics(pipe.source_kafka, b, pipe.dest_kafka,
                                       f"{b}.copy").ok, 25, f"{b}.copy equal to {b}")
        report = verify_topics(pipe.source_kafka, b, pipe.dest_kafka, f"{b}.copy")
        assert report.ok, report_text(report)
        assert report.totals()["source_records"] == 150
        assert sorted(t for _r, t in ing.sources) == [a, b]
        assert Admin(pipe.dest_kafka).partition_count(f"{other}.copy") is None
        assert Admin(pipe.dest_kafka).partition_count(other) is None
