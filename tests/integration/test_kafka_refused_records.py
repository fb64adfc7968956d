"""Records the destination refuses, at the large end of the range, on Apache Kafka, in both
delivery modes (ingress/README.md, "Destination limits"; the small end, 150 KB against a
100 KB topic, is test_kafka_destination_limits.py).

Four source partitions: partition 0 holds a 2,000,000-byte record, partition 1 an 8 MiB
one; the destination topic keeps Kafka's default ``max.message.bytes`` (1,048,588) and
ingress's own ``message.max.bytes`` (``kafka.config``) is 4 MiB. So partition 0's record is
refused by the broker, partition 1's by the client itself. Each partition stops exactly at
its record, nothing after it reaches the destination (not even in an aborted
transaction), the other two partitions finish meanwhile; raising the topic's limit resumes
partition 0 by itself, raising the client's (a restart with another ``kafka.config``)
resumes partition 1; the copy ends exact (exactly-once) or complete without a duplicate
(at-least-once: both records were foreseen, from the limits).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter

import pytest

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from replicator.core.kafka.reader import read_to_end
from tests.conftest import RECENT_MS
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

MiB = 1024**2
PER_PARTITION = int(os.environ.get("REFUSED_RECORDS_PER_PARTITION", "2000"))
"""Records per source partition (the environment variable reruns the scenario at another
scale, e.g. 10000 with ``REFUSED_RECORDS_AT=5000``: 40,000 records)."""
AT = int(os.environ.get("REFUSED_RECORDS_AT", "1000"))
"""Index of the large record in partitions 0 and 1."""
BIG = {0: 2_000_000, 1: 8 * MiB}
CLIENT_MAX = 4 * MiB


def _fill(pipe: Pipeline) -> None:
    rnd = random.Random(pipe.topic)
    p = Producer(pipe.source_kafka, overrides={"linger.ms": 5})
    for part in range(4):
        for i in range(PER_PARTITION):
            size = BIG[part] if part in BIG and i == AT else rnd.randint(50, 300)
            p.produce(pipe.topic, value=rnd.randbytes(size), key=b"k%d" % i, partition=part,
                      timestamp=RECENT_MS + i)
    assert p.flush(120) == 0
    p.check_deliveries(pipe.topic)


def _in_destination(pipe: Pipeline, partition: int) -> Counter[int]:
    """How often each source index is in the destination partition's log, aborted
    transactions included (read_uncommitted)."""
    got: Counter[int] = Counter()
    for m in read_to_end(pipe.dest_kafka, pipe.dest_topic, partitions=[partition],
                         isolation="read_uncommitted", timeout=60):
        k = m.key()
        assert k is not None
        got[int(k[1:])] += 1
    return got


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])
def test_records_of_2_mb_and_8_mib_stop_only_their_partitions_until_each_limit_is_raised(
        pipe: Pipeline, mode: str) -> None:
    pipe.create_source(4, {"max.message.bytes": str(10 * MiB)})
    _fill(pipe)
    admin = Admin(pipe.dest_kafka)
    assert admin.create_topic(pipe.dest_topic, 4)        # the broker's default limit
    egress = Egress(pipe.egress_settings(max_segment_messages=500,
                                         max_segment_size="64MiB"), store=pipe.store)
    settings = pipe.ingress_settings(delivery=mode,
                                     kafka_config={"message.max.bytes": CLIENT_MAX})
    positions: dict[int, int | None] = {}
    with running_egress(egress):
        with running_ingress(settings) as ing:
            def pos(p: int) -> int | None:
                return ing.positions().get((SOURCE_REGION, pipe.topic, p))

            def refused(p: int) -> bool:
                labels = {"region": SOURCE_REGION, "topic": pipe.topic, "partition": str(p)}
                return ing.metrics.value("replicator_ingress_partition_refused", labels) == 1

            t0 = time.monotonic()
            wait_for(lambda: pos(2) == pos(3) == PER_PARTITION - 1, 120,
                     "partitions 2 and 3 replicated")
            others = time.monotonic() - t0
            wait_for(lambda: refused(0) and refused(1), 60, "partitions 0 and 1 stopped")
            wait_for(lambda: pos(0) == pos(1) == AT - 1, 30,
                     "everything before each record checkpointed")
            why = ing.refused()
            assert f"source offset {AT}" in why[(SOURCE_REGION, pipe.topic, 0)]
            assert "max.message.bytes=1048588" in why[(SOURCE_REGION, pipe.topic, 0)]
            assert f"message.max.bytes={CLIENT_MAX}" in why[(SOURCE_REGION, pipe.topic, 1)]
            assert ing.ready()
            for p in (0, 1):
                got = _in_destination(pipe, p)
                assert max(got) <= AT, f"partition {p}: records after the refused one"
                assert all(n == 1 for i, n in got.items() if i < AT), \
                    f"partition {p}: duplicates before the refused record"
            admin.alter_topic_config(pipe.dest_topic, {"max.message.bytes": str(10 * MiB)})
            wait_for(lambda: pos(0) == PER_PARTITION - 1, 60,
                     "partition 0 resumed once the topic's limit was raised")
            assert refused(1) and pos(1) == AT - 1        # the client's own limit stays
            positions = {p: pos(p) for p in range(4)}
        settings = pipe.ingress_settings(delivery=mode,
                                         kafka_config={"message.max.bytes": 16 * MiB})
        with running_ingress(settings) as ing:
            wait_for(lambda: ing.positions().get((SOURCE_REGION, pipe.topic, 1))
                     == PER_PARTITION - 1, 60,
                     "partition 1 resumed with the client's limit raised")
    report = pipe.verify()
    totals = report.totals()
    print(f"{mode}: partitions 2-3 replicated in {others:.1f}s beside the refusals; "
          f"positions before the restart {positions}; {totals}")
    assert totals["lost"] == 0 and totals["reordered"] == 0, report_text(report)
    assert totals["duplicated"] == 0, report_text(report)
    assert report.ok, report_text(report)
