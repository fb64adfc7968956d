"""Checkpoint keys name the destination topic, on Apache Kafka.

Two deployments replay one source into two destination topics with the same checkpoint
topic (the default name): each resumes from its own checkpoints only, so the second copy is
complete too (with keys that had no destination it read the first one's checkpoints and
skipped every record). A checkpoint written by an earlier version (key without the
destination) is taken over once, so an upgrade resumes where it was.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from replicator.core.wire import Checkpoint, checkpoint_key
from replicator.ops.verify import read_partition, verify_topics
from tests.conftest import unique_name
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 2
RECORDS = 400
LAST = {p: RECORDS // PARTITIONS - 1 for p in range(PARTITIONS)}


def segment_the_source(pipe: Pipeline) -> None:
    pipe.create_source(PARTITIONS)
    p = Producer(pipe.source_kafka)
    for i in range(RECORDS):
        p.produce(pipe.topic, value=f"v{i}".encode(), key=f"k{i}".encode(),
                  partition=i % PARTITIONS, timestamp=int(time.time() * 1000))
    assert p.flush(30) == 0
    egress = Egress(pipe.egress_settings(max_segment_messages=50), store=pipe.store)
    with running_egress(egress) as eg:
        wait_for(lambda: eg.metrics.total("replicator_egress_segments_total")
                 >= RECORDS // 50, 60, "egress to write every segment")


def replay_into(pipe: Pipeline, dest: str) -> None:
    src = pipe.ingress_settings().ingress.sources[0]  # type: ignore[union-attr]
    settings = pipe.ingress_settings(group_id=unique_name("ingress"), sources=[
        {**src.model_dump(mode="json", exclude_none=True), "destination_topic": dest}])
    with running_ingress(settings) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing) == LAST, 90, f"{dest} replayed")


def test_two_destinations_share_a_checkpoint_topic_and_both_are_complete(
        pipe: Pipeline) -> None:
    segment_the_source(pipe)
    other = pipe.dest_topic + ".second"
    replay_into(pipe, pipe.dest_topic)
    replay_into(pipe, other)
    for dest in (pipe.dest_topic, other):
        report = verify_topics(pipe.source_kafka, pipe.topic, pipe.dest_kafka, dest)
        assert report.ok, report_text(report)
        assert report.totals()["destination_records"] == RECORDS
    keys = {m.key() for m in read_partition(pipe.dest_kafka, pipe.checkpoint_topic, 0)}
    assert {checkpoint_key(SOURCE_REGION, pipe.topic, p, d).encode()
            for p in range(PARTITIONS) for d in (pipe.dest_topic, other)} <= keys


def test_a_checkpoint_of_an_earlier_version_is_resumed_from(pipe: Pipeline) -> None:
    segment_the_source(pipe)
    # What an earlier version left: partition 0 replayed up to 99 (its records are in the
    # destination), under the key without the destination.
    assert Admin(pipe.dest_kafka).create_topic(pipe.checkpoint_topic, 1,
                                               {"cleanup.policy": "compact"})
    p = Producer(pipe.dest_kafka)
    p.produce(pipe.checkpoint_topic, Checkpoint(99, "s", datetime.now(UTC)).encode(),
              checkpoint_key(SOURCE_REGION, pipe.topic, 0).encode(), partition=0)
    assert p.flush(10) == 0
    replay_into(pipe, pipe.dest_topic)
    got = [m.offset() for m in read_partition(pipe.dest_kafka, pipe.dest_topic, 0)]
    assert len(got) == RECORDS // PARTITIONS - 100   # resumed after 99: nothing twice
    got1 = list(read_partition(pipe.dest_kafka, pipe.dest_topic, 1))
    assert len(got1) == RECORDS // PARTITIONS
