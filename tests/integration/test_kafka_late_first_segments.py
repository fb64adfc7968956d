"""First segments that reach the destination bucket after later ones, on Apache Kafka.

S3 replication keeps no order. Egress writes into a source bucket; a copier plays
replication into ingress's bucket, holding back the first segment of each partition for a
different time (one of them until after ingress restarted). ``_topic.json`` carries each
partition's first position (``first_positions``, the field an egress that records them
writes before a partition's first segment), so ingress waits for exactly that position:
the copy must equal the source, nothing skipped, nothing lost. (Without the field the
first replay starts at the earliest segment known after ``first_segment_delay`` and the
held-back records were never replayed.)
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from egress.controller import Egress
from replicator.core.kafka import Producer
from replicator.core.keys import SegmentKey, topic_meta_key
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.devstack.aws import create_bucket
from tests.conftest import unique_name
from tests.integration.pipeline import (
    CREDS,
    DEST_REGION,
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 3
RECORDS = 600
HOLD = {0: 4.0, 1: 9.0}     # seconds after ingress started; partition 2: after the restart


def test_late_first_segments_are_waited_for_across_a_restart(pipe: Pipeline) -> None:
    s3 = make_s3_client(endpoint_url=pipe.moto, region=DEST_REGION, **CREDS)
    source_bucket = unique_name("srcbucket")
    create_bucket(s3, source_bucket, DEST_REGION)
    source_store = S3ObjectStore(s3, source_bucket)
    source_side = replace(pipe, bucket=source_bucket, store=source_store)

    pipe.create_source(PARTITIONS)
    p = Producer(pipe.source_kafka)
    for i in range(RECORDS):
        p.produce(pipe.topic, value=f"v{i}".encode(), key=f"k{i}".encode(),
                  partition=i % PARTITIONS, timestamp=int(time.time() * 1000))
    assert p.flush(30) == 0
    per_partition = RECORDS // PARTITIONS
    egress = Egress(source_side.egress_settings(max_segment_messages=50), store=source_store)
    with running_egress(egress) as eg:
        wait_for(lambda: eg.metrics.total("replicator_egress_segments_total")
                 >= RECORDS // 50, 60, "egress to write every segment")

    segments = sorted(k for info in source_store.list(f"data/{SOURCE_REGION}/{pipe.topic}/")
                      if (k := SegmentKey.try_parse(info.key)) is not None)
    first = {part: min(s for s in segments if s.partition == part) for part in
             range(PARTITIONS)}
    # What replication delivers first: _topic.json with the first positions, then every
    # segment except each partition's first one.
    meta_key = topic_meta_key("data", SOURCE_REGION, pipe.topic)
    meta = json.loads(source_store.get(meta_key))
    meta["first_positions"] = {str(part): seg.start for part, seg in first.items()}
    pipe.store.put(meta_key, json.dumps(meta).encode())

    def copy(seg: SegmentKey) -> None:
        pipe.store.put(seg.to_key(), source_store.get(seg.to_key()))

    for seg in segments:
        if seg not in first.values():
            copy(seg)
    last = {part: per_partition - 1 for part in range(PARTITIONS)}
    settings = pipe.ingress_settings(batch_size=20)
    with running_ingress(settings) as ing:
        started = time.monotonic()
        for part in sorted(HOLD, key=HOLD.__getitem__):
            time.sleep(max(0.0, started + HOLD[part] - time.monotonic()))
            copy(first[part])
        wait_for(lambda: all(ing.positions().get((SOURCE_REGION, pipe.topic, part)) ==
                             last[part] for part in HOLD), 60, "partitions 0 and 1")
        assert ing.positions().get((SOURCE_REGION, pipe.topic, 2)) is None   # still waits
    # Restarted while partition 2's first segment is still held back.
    with running_ingress(settings) as ing:
        time.sleep(3)
        assert ing.positions().get((SOURCE_REGION, pipe.topic, 2)) is None
        copy(first[2])
        wait_for(lambda: pipe.checkpoint_offsets(ing) == last, 60, "every partition")
        assert ing.metrics.total("replicator_ingress_messages_skipped_total") == 0
        assert ing.metrics.total("replicator_ingress_messages_lost_total") == 0
    report = pipe.verify()
    assert report.ok, report_text(report)
    assert report.totals()["destination_records"] == RECORDS
