"""Egress → S3 → ingress end to end on the session's servers, for the Apache Kafka tests.

Egress (region ``us-east-1``, the source broker) and ingress (region ``us-west-1``, the
destination broker) share one bucket: egress writes ``data/us-east-1/...``, which is where
ingress looks for that source, and the bucket's notifications of ``data/`` reach ingress's
SQS queue (what S3 replication plus the destination bucket's notifications do in AWS).
Everything gets unique names, so tests share the session's brokers and moto.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingress.controller import Ingress
from replicator.core.kafka import Admin
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import KafkaSettings, Settings, load_settings
from replicator.core.sqs import SqsQueue, make_sqs_client
from replicator.devstack.aws import create_bucket, create_queue, set_bucket_notifications
from replicator.ops.verify import VerifyReport, verify_topics
from tests.conftest import FAST_GROUP_CONFIG, unique_name
from tests.integration import test_egress, test_ingress

SOURCE_REGION = "us-east-1"
DEST_REGION = "us-west-1"
CREDS: dict[str, Any] = {"access_key_id": "test", "secret_access_key": "test"}


@dataclass
class Pipeline:
    """One test's topic, bucket, queue and controller settings."""

    moto: str
    source_brokers: str
    dest_brokers: str
    topic: str
    bucket: str
    queue: str
    store: S3ObjectStore
    egress_group: str = field(default_factory=lambda: unique_name("egress"))
    ingress_group: str = field(default_factory=lambda: unique_name("ingress"))
    checkpoint_topic: str = field(default_factory=lambda: unique_name("checkpoints"))
    events_topic: str = field(default_factory=lambda: unique_name("events"))

    @property
    def dest_topic(self) -> str:
        return self.topic + ".copy"

    @property
    def source_kafka(self) -> KafkaSettings:
        return KafkaSettings(brokers=self.source_brokers, config=dict(FAST_GROUP_CONFIG))

    @property
    def dest_kafka(self) -> KafkaSettings:
        return KafkaSettings(brokers=self.dest_brokers, config=dict(FAST_GROUP_CONFIG))

    def egress_settings(self, *, kafka_config: Mapping[str, Any] | None = None,
                        egress: Mapping[str, Any] | None = None, **limits: Any) -> Settings:
        topic_limits = {"max_segment_messages": 200, "max_segment_age": "500ms", **limits}
        return load_settings(data={
            "region": SOURCE_REGION,
            "s3": {"bucket": self.bucket, "endpoint_url": self.moto, **CREDS},
            "kafka": {"brokers": self.source_brokers,
                      "config": {**FAST_GROUP_CONFIG, **(kafka_config or {})}},
            "metrics": {"port": 0},
            "egress": {"group_id": self.egress_group, "shutdown_timeout": "10s",
                       "topic_metadata_interval": "1s",
                       "topics": {self.topic: topic_limits}, **(egress or {})},
        }, environ={})

    def ingress_settings(self, *, kafka_config: Mapping[str, Any] | None = None,
                         **ingress: Any) -> Settings:
        return load_settings(data={
            "region": DEST_REGION,
            "s3": {"bucket": self.bucket, "endpoint_url": self.moto, **CREDS},
            "kafka": {"brokers": self.dest_brokers,
                      "config": {**FAST_GROUP_CONFIG, **(kafka_config or {})}},
            "metrics": {"port": 0},
            "ingress": {
                "group_id": self.ingress_group, "sqs_queue": self.queue,
                "segment_events_topic": self.events_topic,
                "checkpoint_topic": self.checkpoint_topic, "batch_size": 200,
                "sqs_wait_time": "1s", "topic_check_interval": "1s",
                "rescan_interval": "30s", "revoke_timeout": "10s",
                "sources": [{"region": SOURCE_REGION, "topic": self.topic,
                             "destination_topic": self.dest_topic,
                             "lost_segment_timeout": "60s", "late_segment_retries": 5,
                             "first_segment_delay": "2s"}],
                **ingress},
        }, environ={})

    def create_source(self, partitions: int, config: Mapping[str, str] | None = None) -> None:
        assert Admin(self.source_kafka).create_topic(self.topic, partitions, config)

    def ingress_config_file(self, directory: Path, *, destination_topic: str,
                            **ingress: str) -> Path:
        """An ingress config file of this pipeline for the operator commands
        (``directory/ingress.toml``): its bucket, destination cluster, queue, the given
        ``[ingress]`` keys and its one source, into ``destination_topic``."""
        keys = "".join(f'{k} = "{v}"\n' for k, v in ingress.items())
        config = directory / "ingress.toml"
        config.write_text(f'''region = "us-west-1"
[s3]
bucket = "{self.bucket}"
endpoint_url = "{self.moto}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "{self.dest_brokers}"
[ingress]
{keys}sqs_queue = "{self.queue}"
[[ingress.sources]]
region = "us-east-1"
topic = "{self.topic}"
destination_topic = "{destination_topic}"
''')
        return config

    def verify(self) -> VerifyReport:
        """The destination compared with the source, record by record (read_committed)."""
        return verify_topics(self.source_kafka, self.topic, self.dest_kafka, self.dest_topic)

    def checkpoint_offsets(self, ingress: Ingress) -> dict[int, int]:
        return {p: pos for (_r, t, p), pos in ingress.positions().items()
                if t == self.topic and pos is not None}


def new_pipeline(moto: str, source_brokers: str, dest_brokers: str) -> Pipeline:
    bucket, queue = unique_name("bucket"), unique_name("queue")
    s3 = make_s3_client(endpoint_url=moto, region=DEST_REGION, **CREDS)
    sqs = make_sqs_client(endpoint_url=moto, region=DEST_REGION, **CREDS)
    create_bucket(s3, bucket, DEST_REGION)
    create_queue(sqs, queue)
    set_bucket_notifications(s3, bucket, SqsQueue(sqs, queue).arn, prefix="data/")
    return Pipeline(moto, source_brokers, dest_brokers, unique_name("src"), bucket, queue,
                    S3ObjectStore(s3, bucket))


running_egress = test_egress.running


@contextmanager
def running_ingress(settings: Settings) -> Iterator[Ingress]:
    with test_ingress.running(settings) as ing:
        yield ing


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def topic_id_of(admin: Admin, topic: str) -> str:
    """The topic's id once the broker answers with one (just after CreateTopics, its
    metadata may not carry the topic yet)."""
    wait_for(lambda: admin.topic_id(topic) is not None, 30, f"the id of {topic}")
    tid = admin.topic_id(topic)
    assert tid is not None
    return tid


def report_text(report: VerifyReport) -> str:
    return json.dumps(report.totals()) + " " + "; ".join(report.problems) + " " + "; ".join(
        f"[{p.partition}] {p.first_difference}" for p in report.partitions
        if p.first_difference is not None)
