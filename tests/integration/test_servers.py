"""The embedded servers start, answer and keep their data per session."""

from __future__ import annotations

import boto3
import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.conftest import unique_name


def test_moto_answers_s3(moto_endpoint: str) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = unique_name("b")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_both_brokers_accept_records(source_brokers: str, dest_brokers: str) -> None:
    assert source_brokers != dest_brokers
    for brokers in (source_brokers, dest_brokers):
        topic = unique_name("topic")
        # Created first: Apache Kafka here, like production clusters, creates no topic on
        # produce (auto.create.topics.enable=false).
        admin = AdminClient({"bootstrap.servers": brokers})
        admin.create_topics([NewTopic(topic, 1)])[topic].result(10)
        p = ck.Producer({"bootstrap.servers": brokers})
        p.produce(topic, b"hello")
        assert p.flush(10) == 0
        md = admin.list_topics(topic, timeout=10)
        assert topic in md.topics


def test_partition_count_of_a_missing_topic_does_not_create_it(source_brokers: str) -> None:
    from replicator.core.kafka import Admin
    from replicator.core.settings import KafkaSettings

    admin = Admin(KafkaSettings(brokers=source_brokers))
    topic = unique_name("absent")
    assert admin.partition_count(topic) is None
    assert topic not in admin.list_topics()
    admin.create_topic(topic, 3)
    assert admin.partition_count(topic) == 3
