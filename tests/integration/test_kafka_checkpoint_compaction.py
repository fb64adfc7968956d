"""The checkpoint topic compacted by the broker, on Apache Kafka; a restarted ingress still
resumes exactly.

Ingress writes one checkpoint per batch (with the batch, in one transaction) to a
log-compacted topic. Here the topic has small segments and an eager cleaner, so the
broker really compacts it between two runs: offsets get holes, transaction markers and
old checkpoints disappear, and the newest checkpoint of a key may sit after the cleaned
part. The second run must load the newest checkpoint of each partition and continue right
after it: the copy ends up exactly equal to the source (no duplicate, no loss). Tansu has
no log compaction, so this needs ``KAFKA_HOME``.
"""

from __future__ import annotations

import time

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from replicator.ops.verify import read_partition
from tests.integration.pipeline import (
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 2


def produce(pipe: Pipeline, lo: int, hi: int) -> dict[int, int]:
    p = Producer(pipe.source_kafka)
    for i in range(lo, hi):
        p.produce(pipe.topic, value=f"v{i}".encode(), key=f"k{i}".encode(),
                  partition=i % PARTITIONS, timestamp=int(time.time() * 1000))
    assert p.flush(30) == 0
    return {part: (hi - 1 - (hi - 1 - part) % PARTITIONS) // PARTITIONS
            for part in range(PARTITIONS)}


def checkpoint_records(pipe: Pipeline) -> list[int]:
    """Offsets of the committed records in the checkpoint topic (one partition)."""
    return [o for m in read_partition(pipe.dest_kafka, pipe.checkpoint_topic, 0)
            if (o := m.offset()) is not None]


def replay(pipe: Pipeline, last: dict[int, int]) -> None:
    egress = Egress(pipe.egress_settings(max_segment_messages=50), store=pipe.store)
    with running_egress(egress), running_ingress(pipe.ingress_settings(batch_size=20)) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing) == last, 90, f"checkpoints at {last}")
        assert ing.metrics.total("replicator_ingress_segments_lost_total") == 0


def test_restart_resumes_exactly_from_a_compacted_checkpoint_topic(pipe: Pipeline) -> None:
    pipe.create_source(PARTITIONS)
    # Created before ingress starts (ingress uses an existing topic as it is): compacted,
    # with segments that roll every 100 ms of record time and a cleaner that takes any
    # dirty segment at once (the session brokers run the cleaner every 0.5 s).
    assert Admin(pipe.dest_kafka).create_topic(pipe.checkpoint_topic, 1, {
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "100"})
    replay(pipe, produce(pipe, 0, 2000))
    # One checkpoint per batch of 20 (100 in all) and a commit marker per transaction were
    # written (how many transactions depends on how many batches each gathers); the broker
    # cleans while ingress writes, so wait until little more than the newest ones are left.
    def compacted() -> bool:
        left = checkpoint_records(pipe)
        return bool(left) and len(left) <= (left[-1] + 1) // 8

    wait_for(compacted, 90, "the broker to compact the checkpoint topic")
    left = checkpoint_records(pipe)
    # Compacted: offsets below the first left are gone, or holes inside (the cleaner may
    # leave only the newest records, contiguous at the end: [177, 178] was seen).
    assert left[0] > 0 or left[-1] - left[0] + 1 > len(left), f"not compacted: {left}"

    replay(pipe, produce(pipe, 2000, 3000))
    report = pipe.verify()
    assert report.ok, report_text(report)
    assert report.totals()["destination_records"] == 3000
