"""Hundreds of owned partitions in one ingress process, on Apache Kafka: no thread per
partition (ingress/README.md, "Threads").

One in-process ``Ingress`` (exactly-once, its one transactional producer) owns 220
partitions whose segments have not arrived: the process's threads stay bounded by the
replay pool, not the partition count. Then each partition's segment arrives (bucket + its
event): every partition replays it, and the destination holds each record once.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from ingress.controller import Ingress
from ingress.events import SegmentEvent
from ingress.segment_events import MemorySegmentEvents
from replicator.core.keys import SegmentKey, topic_meta_key
from replicator.core.settings import load_settings
from replicator.core.storage import MemoryObjectStore
from tests.conftest import FAST_GROUP_CONFIG, unique_name
from tests.integration.pipeline import wait_for
from tests.integration.test_ingress import read_topic

pytestmark = pytest.mark.apache

PARTITIONS = 220
PER = 20
SLOTS = 16
"""Replay slots: more batches per transaction, so the replay is short on a busy broker."""


class NoQueue:
    """The SQS seam with nothing in it (events come from the test)."""

    def receive(self, max_messages: int = 10, wait_seconds: int = 20) -> list[Any]:
        time.sleep(min(wait_seconds, 1))
        return []

    def delete(self, messages: Any) -> list[str]:
        return []


def test_hundreds_of_idle_partitions_on_a_bounded_pool_then_all_replay(
        dest_brokers: str) -> None:
    topic = unique_name("many")
    store = MemoryObjectStore("b")
    store.put(topic_meta_key("data", "us-east-1", topic),
              json.dumps({"partitions": PARTITIONS}).encode())
    settings = load_settings(data={
        "region": "us-west-1", "s3": {"bucket": "b"},
        "kafka": {"brokers": dest_brokers, "config": dict(FAST_GROUP_CONFIG)},
        "metrics": {"port": 0},
        "ingress": {"group_id": topic + "-g", "sqs_queue": "none",
                    "segment_events_topic": topic + ".events",
                    "checkpoint_topic": topic + ".cps", "instance_id": "many",
                    "topic_check_interval": "1s", "rescan_interval": "1h",
                    "max_parallel_replays": SLOTS,
                    "sources": [{"region": "us-east-1", "topic": topic,
                                 "destination_topic": topic + ".copy",
                                 "first_segment_delay": "0s"}]}}, environ={})
    events = MemorySegmentEvents()
    ing = Ingress(settings, store=store, queue=NoQueue(), events=events)
    runner = threading.Thread(target=ing.run, daemon=True)
    before = threading.active_count()
    ing.start()
    runner.start()
    try:
        t0 = time.monotonic()
        wait_for(lambda: sum(1 for w in list(ing.workers.values()) if w.replaying)
                 == PARTITIONS, 90, "every partition's session")
        print(f"{PARTITIONS} sessions up after {time.monotonic() - t0:.1f}s")
        # Idle: the fixed threads of start() (reader, transactions, relay, runner, ...) and
        # the pool; nothing per partition.
        idle = threading.active_count() - before
        assert idle <= ing.scheduler.size + 12, (idle, ing.scheduler.size)
        fmt = get_format("parquet")
        for p in range(PARTITIONS):
            key = SegmentKey("data", "us-east-1", topic, p, 0, 0, PER - 1)
            up = SegmentUpload(store, fmt, "temp", WriterOptions())
            up.write_batch(records_to_batch([Record(o, int(time.time() * 1000), b"k%d" % o,
                                                    b"p%d-%d" % (p, o), (), 1)
                                             for o in range(PER)]))
            publish_segment(store, up.finish(SegmentMetadata.for_key(key, PER)).key, key)
            events.publish([SegmentEvent("created", key)])
        peak = [0]

        def replayed() -> bool:
            peak[0] = max(peak[0], threading.active_count() - before)
            pos = ing.positions()
            return len(pos) == PARTITIONS and all(v == PER - 1 for v in pos.values())

        t0 = time.monotonic()
        wait_for(replayed, 180, "every partition to replay its segment")
        print(f"replayed after {time.monotonic() - t0:.1f}s; threads: idle +{idle}, "
              f"peak +{peak[0]} (pool {ing.scheduler.size})")
        # Replaying adds at most one read-ahead thread per replay slot.
        assert peak[0] <= ing.scheduler.size + 12 + SLOTS, peak[0]
    finally:
        ing.stop()
        runner.join(60)
        ing.close()
    got = read_topic(dest_brokers, topic + ".copy", timeout=60)
    assert sorted(got) == list(range(PARTITIONS))
    for p, rows in got.items():
        assert [r[2] for r in rows] == [b"p%d-%d" % (p, o) for o in range(PER)], p
