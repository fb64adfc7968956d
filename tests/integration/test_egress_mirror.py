"""The low-RPO mode against moto server with two buckets: egress with ``[egress.mirror]``
copies each segment into the destination bucket, and keeps replicating into its own when
the destination cannot be written.

Cost: about 25 s on the 2-core machine (three egress runs on the session's broker; the
unreachable endpoint's copies fail after botocore's retries).
"""

from __future__ import annotations

import json
import logging

import pytest

from egress.controller import Egress
from replicator.core.keys import SegmentKey, chain_key, topic_meta_key
from replicator.devstack.aws import create_bucket
from replicator.devstack.processes import free_port
from tests.conftest import unique_name
from tests.integration.test_egress import (
    REGION,
    create_topic,
    egress_settings,
    new_bucket,
    produce,
    read_partition,
    running,
    sample_records,
    segment_keys,
    wait_for,
)

DEST_REGION = "us-west-2"


def test_each_segment_appears_in_the_destination_bucket_with_identical_bytes(
        source_brokers: str, moto_endpoint: str) -> None:
    bucket, store = new_bucket(moto_endpoint)
    dest = unique_name("dest")
    create_bucket(store.client, dest, REGION)
    topic = create_topic(source_brokers, 2)
    recs = {p: sample_records(p, 120) for p in range(2)}
    for p in range(2):
        produce(source_brokers, topic, p, recs[p])
    settings = egress_settings(
        source_brokers, moto_endpoint, bucket,
        {topic: {"max_segment_messages": 50, "max_segment_age": "1s"}},
        mirror={"bucket": dest, "region": DEST_REGION, "endpoint_url": moto_endpoint})
    eg = Egress(settings, store=store)
    with running(eg):
        wait_for(lambda: all(read_partition(store, topic, p) == recs[p] for p in range(2)),
                 what="every record in the source bucket")
        wait_for(lambda: eg.metrics.total("egress_mirror_copies_total") >= 6,
                 what="the copies")
    keys = [k.to_key() for p in range(2) for k in segment_keys(store, topic, p)]
    assert len(keys) == 6
    copied = sorted(o["Key"] for o in store.client.list_objects_v2(
        Bucket=dest, Prefix="data/").get("Contents", []))
    # The segments, and the topic's metadata copied before them (egress/mirror.py): the
    # destination's _topic.json records both partitions' first positions.
    meta = {topic_meta_key("data", REGION, topic), chain_key("data", REGION, topic)}
    assert sorted(set(copied) - meta) == sorted(keys)
    assert topic_meta_key("data", REGION, topic) in copied
    body = store.client.get_object(Bucket=dest, Key=topic_meta_key("data", REGION, topic))
    assert json.loads(body["Body"].read())["first_positions"] == {"0": 0, "1": 0}
    for k in keys:
        assert store.client.get_object(Bucket=dest, Key=k)["Body"].read() == store.get(k)
        # The level-0 storage class of [s3] storage_class, as in the source bucket.
        assert store.client.head_object(Bucket=dest, Key=k).get("StorageClass") \
            == "STANDARD_IA"
    assert eg.metrics.total("egress_mirror_copies_total", topic=topic) == 6
    assert eg.metrics.total("egress_mirror_failures_total") == 0
    assert eg.metrics.total("egress_mirror_copy_seconds_count") == 6


@pytest.mark.parametrize("destination", ["missing bucket", "unreachable endpoint"])
def test_a_destination_that_cannot_be_written_never_stops_replication(
        source_brokers: str, moto_endpoint: str, destination: str,
        caplog: pytest.LogCaptureFixture) -> None:
    bucket, store = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 1)
    recs = sample_records(0, 90)
    produce(source_brokers, topic, 0, recs[:60])
    mirror = ({"bucket": unique_name("absent"), "region": DEST_REGION,
               "endpoint_url": moto_endpoint} if destination == "missing bucket"
              else {"bucket": "dest", "region": DEST_REGION,
                    "endpoint_url": f"http://127.0.0.1:{free_port()}",
                    "shutdown_timeout": "0s"})
    settings = egress_settings(
        source_brokers, moto_endpoint, bucket,
        {topic: {"max_segment_messages": 30, "max_segment_age": "1s"}}, mirror=mirror)
    eg = Egress(settings, store=store)
    with caplog.at_level(logging.WARNING, logger="egress.mirror"), running(eg):
        wait_for(lambda: read_partition(store, topic, 0) == recs[:60],
                 what="the first records in the own bucket")
        produce(source_brokers, topic, 0, recs[60:])
        wait_for(lambda: read_partition(store, topic, 0) == recs,
                 what="later records too: the failing copies hold nothing up")
        wait_for(lambda: eg.metrics.total("egress_mirror_failures_total", topic=topic) >= 1,
                 what="a failed copy counted")
    keys: list[SegmentKey] = segment_keys(store, topic, 0)
    assert [(k.start, k.end) for k in keys] == [(0, 29), (30, 59), (60, 89)]
    warned = [r.getMessage() for r in caplog.records if r.name == "egress.mirror"
              and r.levelno == logging.WARNING]
    assert any(k.to_key() in w and "failed" in w for k in keys for w in warned)
    assert not [r for r in caplog.records if r.name == "egress.mirror"
                and r.levelno >= logging.ERROR]
    assert eg.metrics.total("egress_mirror_copies_total") == 0
    assert eg.metrics.total("egress_segment_failures_total") == 0
