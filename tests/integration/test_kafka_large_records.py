"""Records of 8 MiB on Apache Kafka: egress archives them, compaction merges the segments,
ingress replays them and a restore copies them back, each byte for byte, with budgets
smaller than one record (egress's segment share, ingress's batch_bytes and
max_bytes_in_flight): a record larger than its share is carried alone, never wedged.

The source topic's max.message.bytes (9 MiB) is set on the topic only: the broker default
(1 MiB) stays, as on most clusters; ingress copies the setting to the destination topic it
creates (``_topic.json``), and restore's target is created with it too.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from compaction.merge import TaskSpec, merge_segments
from egress.controller import Egress
from egress.flow import encode_reservation, segment_budget
from formats.base import WriterOptions
from formats.parquet import ENCODE_UNIT
from formats.registry import get_format
from replicator.core.kafka import Producer
from replicator.core.keys import SegmentKey
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    running_egress,
    running_ingress,
    wait_for,
)
from tests.integration.test_restore import config, content, restore_cmd, rows, run

pytestmark = pytest.mark.apache

MiB = 1024**2
LIMIT = 9 * MiB
EGRESS_BUDGET = 24 * MiB
"""Egress's whole memory budget: its segments' share (about 19 MiB) is smaller than three
records, and smaller than what one record's encode needs (RELIABILITY.md, "Large
records")."""


def sizes() -> list[int]:
    # Small and large records mixed; three of exactly 8 MiB of value.
    return [10, 8 * MiB, 100, 8 * MiB - 1, 3 * MiB, 0, 8 * MiB, 5]


def test_records_of_8_mib_through_egress_compaction_ingress_and_restore(
        pipe: Pipeline, tmp_path: Path) -> None:
    pipe.create_source(1, {"max.message.bytes": str(LIMIT), "cleanup.policy": "delete"})
    rng = random.Random(8)
    p = Producer(pipe.source_kafka)
    for i, n in enumerate(sizes()):
        p.produce(pipe.topic, rng.randbytes(n) if n else b"", f"k{i}".encode(), partition=0,
                  timestamp=RECENT_MS + i, headers=[("h", os.urandom(16))])
    assert p.flush(60) == 0
    n = len(sizes())

    # 1. Egress, two records per segment, budget smaller than what three records hold.
    egress = Egress(pipe.egress_settings(max_segment_messages=2, max_segment_size="64MiB",
                                         egress={"max_buffered_bytes": EGRESS_BUDGET}),
                    store=pipe.store)

    def level0() -> list[SegmentKey]:
        return sorted(k for o in pipe.store.list(f"data/{SOURCE_REGION}/{pipe.topic}/0/0/")
                      if (k := SegmentKey.try_parse(o.key)) is not None)

    with running_egress(egress):
        wait_for(lambda: max((k.end for k in level0()), default=-1) == n - 1, 120,
                 "egress to archive every record")

    # 2. Compaction's merge: one level-1 segment over the first six records.
    inputs = [k for k in level0() if k.end < 6]
    output = SegmentKey("data", SOURCE_REGION, pipe.topic, 0, 1, inputs[0].start,
                        inputs[-1].end)
    spec = TaskSpec([k.to_key() for k in inputs],
                    [pipe.store.head(k.to_key()).size for k in inputs], output.to_key(), 1000)
    assert merge_segments(pipe.store, get_format("parquet"), WriterOptions(), "temp",
                          spec).ok

    # 3. Ingress, batches and bytes in flight smaller than a record.
    settings = pipe.ingress_settings(batch_bytes="1MiB", max_bytes_in_flight="4MiB")
    with running_ingress(settings):
        wait_for(lambda: pipe.verify().ok, 120, "the destination equal to the source")

    # 4. Restore from the archive (level 1 then level 0) into a new topic.
    to_topic = unique_name("restored")
    done = run(restore_cmd(config(pipe, tmp_path), pipe, to_topic, "--from-offset", "0",
                           "--to-offset", str(n - 1)))
    assert done.returncode == 0, done.stdout + done.stderr
    source = list(rows(pipe.source_kafka, pipe.topic, 0))
    assert [len(r[2] or b"") for r in source] == sizes()
    assert content(rows(pipe.dest_kafka, to_topic, 0)) == content(source)


def test_egress_holds_its_budget_but_for_one_encode_with_records_of_8_mib(
        pipe: Pipeline) -> None:
    # Six 8 MiB records, two per segment, a budget whose segment share (19 MiB) holds two
    # of them: the most egress charges at once (segments, and the encoders' working
    # memory reserved or allocated) is the share, two records fetched past it, and the
    # encode of one segment running alone (71 MiB). Was 72-96 MiB: closing segments waiting
    # for their uploads and two segments encoding at once, each with three copies of its
    # whole row group.
    pipe.create_source(1, {"max.message.bytes": str(LIMIT), "cleanup.policy": "delete"})
    p = Producer(pipe.source_kafka)
    for i in range(6):
        p.produce(pipe.topic, os.urandom(8 * MiB), f"k{i}".encode(), partition=0,
                  timestamp=RECENT_MS + i)
    assert p.flush(60) == 0
    egress = Egress(pipe.egress_settings(max_segment_messages=2, max_segment_size="64MiB",
                                         egress={"max_buffered_bytes": EGRESS_BUDGET}),
                    store=pipe.store)
    prefix = f"data/{SOURCE_REGION}/{pipe.topic}/0/0/"
    with running_egress(egress):
        wait_for(lambda: max((k.end for o in pipe.store.list(prefix)
                              if (k := SegmentKey.try_parse(o.key)) is not None),
                             default=-1) == 5, 120, "egress to archive every record")
        charged = egress.metrics.value("replicator_egress_buffered_bytes_peak",
                                       {"region": SOURCE_REGION})
    # What the admission bounds: segments and encode reservations. The metric's peak also
    # charges Arrow's allocations when they are more than the reservations, counted over the
    # whole process: here a pytest worker whose Arrow pool other tests and the segments'
    # own batches share (replicator-egress gives the encoders a pool of their own,
    # egress.allocators); one CI run saw 84 MiB there against this bound.
    peak = egress.encode_peak()
    row = 8 * MiB + 2
    # Two records past the share: the last one fetched before the pause, and one that
    # librdkafka had already prefetched (a record larger than its prefetch share). The
    # first fetch takes one record: unsized, a starved loop's brought up to four (76-92 MiB).
    bound = (segment_budget(EGRESS_BUDGET) + 2 * row
             + encode_reservation(2 * row, row, ENCODE_UNIT))
    assert 16 * MiB <= peak <= bound, (peak / MiB, bound / MiB, (charged or 0) / MiB)
