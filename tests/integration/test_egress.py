"""Egress against the embedded broker (Tansu) and moto S3: segments, reasons, contents."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from egress.controller import Egress
from formats.records import Record, read_all_records
from formats.segment_io import open_segment
from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition
from replicator.core.keys import PartitionRef, SegmentKey, topic_meta_key
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import Settings, load_settings
from replicator.core.storage import ObjectStore
from replicator.devstack.aws import create_bucket
from replicator.devstack.processes import free_port
from tests.conftest import FAST_GROUP_CONFIG, RECENT_MS, unique_name

REGION = "us-east-1"


def egress_settings(brokers: str, endpoint: str, bucket: str, topics: dict[str, dict[str, Any]],
                    *, group: str | None = None, metrics_port: int = 0,
                    **egress: Any) -> Settings:
    return load_settings(data={
        "region": REGION,
        "s3": {"bucket": bucket, "endpoint_url": endpoint, "prefix": "data",
               "storage_class": {"0": "STANDARD_IA"}},
        "kafka": {"brokers": brokers, "config": dict(FAST_GROUP_CONFIG)},
        "metrics": {"host": "127.0.0.1", "port": metrics_port},
        "egress": {"group_id": group or unique_name("g"), "topics": topics,
                   "shutdown_timeout": "10s", **egress},
    }, environ={})


def new_bucket(endpoint: str) -> tuple[str, S3ObjectStore]:
    bucket = unique_name("b")
    settings = egress_settings("127.0.0.1:1", endpoint, bucket, {"x": {}})
    store = S3ObjectStore.from_settings(settings)
    create_bucket(store.client, bucket, REGION)
    return bucket, store


def create_topic(brokers: str, partitions: int, config: dict[str, str] | None = None) -> str:
    topic = unique_name("t")
    assert Admin(load_settings(data={"region": REGION, "s3": {"bucket": "x"},
                                     "kafka": {"brokers": brokers}}, environ={}).kafka
                 ).create_topic(topic, partitions, config)
    return topic


def kafka_settings(brokers: str) -> Any:
    return load_settings(data={"region": REGION, "s3": {"bucket": "x"},
                               "kafka": {"brokers": brokers}}, environ={}).kafka


def sample_records(partition: int, n: int) -> list[Record]:
    """Records exercising null/empty keys and values, headers and timestamps."""
    out = []
    for i in range(n):
        key: bytes | None = None if i % 7 == 0 else (b"" if i % 11 == 0 else f"k{i}".encode())
        value: bytes | None = None if i % 13 == 0 else (b"" if i % 17 == 0 else
                                                         f"p{partition}-v{i}".encode() * 3)
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if i % 5 == 0:
            headers = (("h", f"{i}".encode()), ("h", None), ("empty", b""))
        out.append(Record(i, RECENT_MS + i, key, value, headers))
    return out


def produce(brokers: str, topic: str, partition: int, records: list[Record],
            producer: Any = None) -> None:
    p = producer or Producer(kafka_settings(brokers))
    for r in records:
        p.produce(topic, value=r.value, key=r.key, partition=partition,
                  timestamp=r.timestamp_ms, headers=list(r.headers) or None)
    assert p.flush(30) == 0


def segment_keys(store: ObjectStore, topic: str, partition: int) -> list[SegmentKey]:
    ref = PartitionRef("data", REGION, topic, partition)
    return [SegmentKey.parse(o.key) for o in store.list(ref.segments_prefix(0))]


def read_partition(store: ObjectStore, topic: str, partition: int) -> list[Record]:
    out: list[Record] = []
    for key in segment_keys(store, topic, partition):
        with open_segment(store, key) as reader:
            assert reader.metadata.start_offset == key.start
            assert reader.metadata.end_offset == key.end
            out.extend(read_all_records(reader.iter_batches(10_000)))
    return out


def committed(brokers: str, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer(kafka_settings(brokers), group)
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in tps]
    finally:
        c.close()


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def running(egress: Egress) -> Iterator[Egress]:
    egress.start()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            egress.run()
        except BaseException as e:
            errors.append(e)
            raise

    t = threading.Thread(target=run, name="egress-run", daemon=True)
    t.start()
    try:
        yield egress
    finally:
        egress.stop()
        t.join(60)
        egress.close()
    assert not t.is_alive()
    assert not errors, errors


def http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def reasons(egress: Egress) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in ("size", "count", "age", "memory", "revoke", "shutdown"):
        v = egress.metrics.total("egress_segments_total", reason=r)
        if v:
            out[r] = v
    return out


def assert_touching(keys: list[SegmentKey], first: int = 0) -> None:
    assert keys, "no segments"
    assert keys[0].start == first
    for a, b in itertools.pairwise(keys):
        assert b.start == a.end + 1, (a, b)


# --- tests -------------------------------------------------------------------------------


def test_count_rotation_and_exact_contents(source_brokers: str, moto_endpoint: str,
                                           broker_kind: str) -> None:
    bucket, store = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 2, {"retention.ms": "86400000",
                                             "cleanup.policy": "delete"})
    records = {p: sample_records(p, 250) for p in range(2)}
    for p in range(2):
        produce(source_brokers, topic, p, records[p])
    port = free_port()
    settings = egress_settings(source_brokers, moto_endpoint, bucket,
                               {topic: {"max_segment_messages": 100}}, metrics_port=port)
    eg = Egress(settings, store=store)
    with running(eg):
        wait_for(lambda: all(len(segment_keys(store, topic, p)) == 2 for p in range(2)),
                 what="two count segments per partition")
        assert eg.ready()
        assert http_get(port, "/healthz")[0] == 200
        assert http_get(port, "/readyz")[0] == 200
        # Lag from the fetch high watermark: everything consumed, nothing behind.
        wait_for(lambda: [eg.metrics.value("egress_consumer_lag", {
            "region": REGION, "topic": topic, "partition": str(p)}) for p in range(2)]
            == [0, 0], what="lag gauges")
        status, body = http_get(port, "/metrics")
        assert status == 200 and b"replicator_egress_messages_total" in body
    for p in range(2):
        keys = segment_keys(store, topic, p)
        assert [(k.start, k.end) for k in keys] == [(0, 99), (100, 199), (200, 249)]
        assert read_partition(store, topic, p) == records[p]
        assert {store.head(k.to_key()).storage_class for k in keys} == {"STANDARD_IA"}
    assert reasons(eg) == {"count": 4, "shutdown": 2}
    assert committed(source_brokers, settings.egress.group_id, topic, 2) == [250, 250]  # type: ignore[union-attr]
    # Only final segments and _topic.json remain: temp objects were deleted.
    assert not list(store.list("temp/"))
    meta = json.loads(store.get(topic_meta_key("data", REGION, topic)))
    assert meta["partitions"] == 2 and meta["topic"] == topic and meta["region"] == REGION
    # Where each partition's segment history begins, written before its first segment.
    assert meta["first_positions"] == {"0": 0, "1": 0}
    # The topic's own settings travel, not the cluster's defaults. (Tansu describes the
    # settings of a topic as defaults: none travel there.)
    assert meta["configs"] == ({"retention.ms": "86400000", "cleanup.policy": "delete"}
                               if broker_kind == "apache" else {})
    assert eg.metrics.total("egress_messages_total", topic=topic) == 500


@pytest.mark.parametrize("reason", ["size", "age"])
def test_size_and_age_rotation(source_brokers: str, moto_endpoint: str, reason: str) -> None:
    bucket, store = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 1)
    limits = ({"max_segment_size": 4000} if reason == "size"
              else {"max_segment_age": "500ms"})
    settings = egress_settings(source_brokers, moto_endpoint, bucket, {topic: limits})
    eg = Egress(settings, store=store)
    recs = [Record(i, RECENT_MS, None, b"x" * 1000) for i in range(10)]
    with running(eg):
        wait_for(eg.ready, what="assignment")
        produce(source_brokers, topic, 0, recs)
        wait_for(lambda: sum(k.span for k in segment_keys(store, topic, 0)) >= 10
                 if reason == "age" else len(segment_keys(store, topic, 0)) >= 2,
                 what=f"{reason} segments")
    keys = segment_keys(store, topic, 0)
    assert_touching(keys)
    assert read_partition(store, topic, 0) == recs
    assert reasons(eg).get(reason, 0) >= 1
    if reason == "size":
        # 1000-byte values, 4000-byte limit: each segment closes with its fourth record.
        assert [(k.start, k.end) for k in keys] == [(0, 3), (4, 7), (8, 9)]


def test_memory_budget_closes_the_largest_segments_early(source_brokers: str,
                                                         moto_endpoint: str) -> None:
    bucket, store = new_bucket(moto_endpoint)
    parts = 4
    topic = create_topic(source_brokers, parts)
    recs = {p: [Record(i, RECENT_MS + i, None, bytes([65 + p]) * 1000)
                for i in range(400)] for p in range(parts)}
    for p in range(parts):
        produce(source_brokers, topic, p, recs[p])
    settings = egress_settings(source_brokers, moto_endpoint, bucket, {topic: {}},
                               max_buffered_bytes="256KiB")
    eg = Egress(settings, store=store)
    with running(eg):
        wait_for(lambda: eg.metrics.total("egress_messages_total") == 400 * parts,
                 what="everything consumed")
    for p in range(parts):
        assert_touching(segment_keys(store, topic, p))
        assert read_partition(store, topic, p) == recs[p]
    assert reasons(eg).get("memory", 0) >= parts
