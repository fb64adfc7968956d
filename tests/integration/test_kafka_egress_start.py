"""Where egress starts a partition without a committed offset (``[egress.topics."name"]
start``), on Apache Kafka: a new deployment on a live cluster copies the whole retention
window by default, only new records with ``latest``, or from a time."""

from __future__ import annotations

import json
import time

import pytest

from egress.controller import Egress
from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import Admin, Producer
from tests.integration.pipeline import Pipeline, running_egress, wait_for
from tests.integration.test_egress import read_partition, segment_keys

pytestmark = pytest.mark.apache


def produce(pipe: Pipeline, lo: int, hi: int, timestamp: int = 0) -> None:
    p = Producer(pipe.source_kafka)
    for i in range(lo, hi):
        p.produce(pipe.topic, value=f"v{i}".encode(), partition=0,
                  timestamp=timestamp + i if timestamp else 0)
    assert p.flush(30) == 0


def test_latest_copies_only_records_produced_after_the_start(pipe: Pipeline) -> None:
    pipe.create_source(1)
    produce(pipe, 0, 20)
    settings = pipe.egress_settings(max_segment_messages=5, start="latest")
    admin = Admin(pipe.source_kafka)

    def committed() -> int | None:
        try:
            return admin.group_offsets(pipe.egress_group).get((pipe.topic, 0))
        except KafkaRetriableError:       # the coordinator still loading, say
            return None

    with running_egress(Egress(settings, store=pipe.store)):
        # The end of the log is resolved to an offset and committed at once ...
        wait_for(lambda: committed() == 20, 60, "the start committed at the end of the log")
    # ... so records produced while no member holds the partition (a restart, a rebalance
    # before the first segment) are copied: the next start is the commit, not a later end.
    produce(pipe, 20, 30)
    with running_egress(Egress(settings, store=pipe.store)) as eg:
        wait_for(lambda: sum(k.end - k.start + 1 for k in segment_keys(pipe.store, pipe.topic,
                                                                        0)) == 10,
                 60, "the new records in segments")
        assert eg.metrics.total("egress_source_lost_messages_total") == 0
    keys = segment_keys(pipe.store, pipe.topic, 0)
    assert keys[0].start == 20
    assert [r.value for r in read_partition(pipe.store, pipe.topic, 0)] == [
        f"v{i}".encode() for i in range(20, 30)]


def test_a_time_starts_at_the_first_record_at_or_after_it(pipe: Pipeline) -> None:
    pipe.create_source(1)
    base = int(time.time() * 1000) - 3_600_000
    produce(pipe, 0, 30, timestamp=base)            # record i at base + i ms
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((base + 10_000) / 1000))
    # A whole second after the records' times: none is at or after it ...
    settings = pipe.egress_settings(max_segment_messages=5, start=f"{when}Z")
    produce(pipe, 30, 40, timestamp=base + 20_000)  # ... but these are
    with running_egress(Egress(settings, store=pipe.store)):
        wait_for(lambda: sum(k.end - k.start + 1 for k in segment_keys(pipe.store, pipe.topic,
                                                                        0)) == 10,
                 60, "the records from that time in segments")
    assert [r.value for r in read_partition(pipe.store, pipe.topic, 0)] == [
        f"v{i}".encode() for i in range(30, 40)]


def test_a_partition_added_later_is_copied_from_its_oldest_record(pipe: Pipeline) -> None:
    # `start = "latest"` seeded the topic when it had one partition. Partition 1 is added
    # while egress is down (or before its metadata refresh sees it) and receives records at
    # once: they are new data of a replicated topic, not history to pass over.
    pipe.create_source(1)
    produce(pipe, 0, 20)
    settings = pipe.egress_settings(max_segment_messages=5, start="latest")
    admin = Admin(pipe.source_kafka)

    def committed() -> int | None:
        try:
            return admin.group_offsets(pipe.egress_group).get((pipe.topic, 0))
        except KafkaRetriableError:
            return None

    with running_egress(Egress(settings, store=pipe.store)):
        wait_for(lambda: committed() == 20, 60, "the start committed at the end of the log")
    admin.grow_topic(pipe.topic, 2)
    p = Producer(pipe.source_kafka)
    for i in range(10):
        p.produce(pipe.topic, value=f"new{i}".encode(), partition=1)
    assert p.flush(30) == 0
    with running_egress(Egress(settings, store=pipe.store)):
        wait_for(lambda: sum(k.end - k.start + 1
                             for k in segment_keys(pipe.store, pipe.topic, 1)) == 10,
                 60, "partition 1's records in segments")
    assert [r.value for r in read_partition(pipe.store, pipe.topic, 1)] == [
        f"new{i}".encode() for i in range(10)]
    meta = json.loads(pipe.store.get(f"data/us-east-1/{pipe.topic}/_topic.json"))
    assert (meta["partitions"], meta["partitions_at_start"]) == (2, 1)
    assert meta["first_positions"] == {"0": 20, "1": 0}
