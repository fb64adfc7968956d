"""Group-offset export on Apache Kafka: the source groups' committed offsets for the
replicated topic reach the bucket under ``_groups/`` (docs/failover.md), exactly, whether
the group has members or not; changes are written again; egress's own group, excluded
groups and other topics' commits are not exported.
"""

from __future__ import annotations

import pytest

from egress.controller import Egress
from replicator.core.errors import ObjectNotFound
from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition
from replicator.core.keys import group_export_key, group_exports_prefix
from replicator.core.wire import GroupExport
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import SOURCE_REGION, Pipeline, running_egress, wait_for

pytestmark = pytest.mark.apache

PARTITIONS = 3


def _exported(pipe: Pipeline, group: str) -> dict[int, int] | None:
    key = group_export_key("data", SOURCE_REGION, pipe.topic, group)
    try:
        return GroupExport.parse(pipe.store.get(key), where=key).offsets
    except ObjectNotFound:
        return None


def test_source_group_offsets_are_exported_exactly(pipe: Pipeline) -> None:
    pipe.create_source(PARTITIONS)
    producer = Producer(pipe.source_kafka)
    for i in range(60):
        producer.produce(pipe.topic, value=b"v%d" % i, partition=i % PARTITIONS,
                         timestamp=RECENT_MS + i)
    producer.flush(30)
    admin = Admin(pipe.source_kafka)
    idle, excluded, elsewhere = unique_name("app"), unique_name("skip"), unique_name("other")
    admin.alter_group_offsets(idle, {(pipe.topic, 0): 4, (pipe.topic, 2): 19})
    admin.alter_group_offsets(excluded, {(pipe.topic, 0): 1})
    other_topic = unique_name("other")
    assert admin.create_topic(other_topic, 1)
    # A commit for a topic the broker's metadata does not show yet is refused with
    # UNKNOWN_TOPIC_OR_PARTITION (seen once on a loaded machine).
    wait_for(lambda: admin.partition_count(other_topic) == 1, 30, "the other topic")
    admin.alter_group_offsets(elsewhere, {(other_topic, 0): 0})
    # A group with a live member: its commits are exported too.
    live = unique_name("live")
    consumer = Consumer(pipe.source_kafka, live, {"enable.partition.eof": False})
    consumer.subscribe([pipe.topic])
    try:
        wait_for(lambda: (consumer.poll(0.2), len(consumer.assignment()) == PARTITIONS)[1],
                 30, "the live group's assignment")
        consumer.commit([TopicPartition(pipe.topic, 1, 11)])
        assert admin.group_members(live) == 1

        settings = pipe.egress_settings(egress={"group_export": {
            "interval": "1s", "exclude": [r"skip-.*"]}})
        egress = Egress(settings, store=pipe.store)
        with running_egress(egress):
            wait_for(lambda: _exported(pipe, idle) is not None
                     and _exported(pipe, live) is not None, 30, "the exports")
            assert _exported(pipe, idle) == {0: 4, 2: 19}
            assert _exported(pipe, live) == {1: 11}
            # Moved on in the source: written again within the interval.
            admin.alter_group_offsets(idle, {(pipe.topic, 0): 20})
            wait_for(lambda: _exported(pipe, idle) == {0: 20, 2: 19}, 30, "the new offsets")
            # Egress's own group commits this topic too, but is never exported.
            wait_for(lambda: admin.group_offsets(pipe.egress_group) != {}, 30,
                     "egress's own commits")
            exported_groups = {o.key.rsplit("/", 1)[1] for o in pipe.store.list(
                group_exports_prefix("data", SOURCE_REGION, pipe.topic))}
            assert exported_groups == {f"{idle}.json", f"{live}.json"}
            assert egress.metrics.total("egress_group_exports_total") == 3
    finally:
        consumer.close()
