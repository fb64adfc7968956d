"""Self-describing segments end to end: the source region's egress writes ``arrow``, the
destination region is configured ``parquet`` (docs/architecture.md, "Segment format").

Before segments were self-describing, ingress opened every segment with its configured
format, so each ``arrow`` segment was "corrupt" and finally declared lost. Now the reader
is chosen from the object's own bytes and the copy is exact. Runs on either broker.
"""

from __future__ import annotations

import time

from egress.controller import Egress
from formats.segment_io import open_segment
from replicator.core.kafka import Producer
from replicator.core.settings import FormatSettings
from tests.integration.pipeline import (
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)
from tests.integration.test_egress import segment_keys

PARTITIONS = 2
RECORDS = 600


def test_arrow_segments_replay_exactly_into_a_region_configured_parquet(pipe: Pipeline) -> None:
    pipe.create_source(PARTITIONS)
    p = Producer(pipe.source_kafka)
    now = int(time.time() * 1000)
    for i in range(RECORDS):
        p.produce(pipe.topic, key=None if i % 9 == 0 else f"k{i}".encode(),
                  value=b"" if i % 5 == 0 else (None if i % 7 == 0 else f"v{i}".encode()),
                  headers=[("h", f"{i}".encode())] if i % 2 else None,
                  partition=i % PARTITIONS, timestamp=now + i)
    assert p.flush(30) == 0
    last = {part: (RECORDS - 1 - (RECORDS - 1 - part) % PARTITIONS) // PARTITIONS
            for part in range(PARTITIONS)}

    egress_settings = pipe.egress_settings(max_segment_messages=100)
    egress_settings = egress_settings.model_copy(
        update={"format": FormatSettings(name="arrow")})
    ingress_settings = pipe.ingress_settings()
    assert ingress_settings.format.name == "parquet"
    with running_egress(Egress(egress_settings, store=pipe.store)), \
            running_ingress(ingress_settings) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing) == last, 90, f"checkpoints at {last}")
        assert ing.metrics.total("replicator_ingress_segments_lost_total") == 0
        assert ing.metrics.total("replicator_ingress_segments_corrupt_total") == 0

    keys = [k for part in range(PARTITIONS) for k in segment_keys(pipe.store, pipe.topic, part)]
    assert len(keys) >= 2 * PARTITIONS
    for key in keys:  # really written in arrow, whatever the reader side is configured
        with open_segment(pipe.store, key) as reader:
            assert reader.format is not None and reader.format.name == "arrow"
    report = pipe.verify()
    assert report.ok, report_text(report)
