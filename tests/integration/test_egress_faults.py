"""Egress under faults: transactions, rebalances, kill -9, S3 failures (Tansu + moto)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from egress.controller import Egress
from formats.records import Record
from replicator.core.errors import KafkaRetriableError, StorageError
from replicator.core.kafka import Producer
from replicator.core.retry import RetryPolicy
from replicator.core.storage import ObjectInfo, ObjectStore, Upload
from tests.conftest import FAST_GROUP_CONFIG, unique_name
from tests.integration.test_egress import (
    assert_touching,
    committed,
    create_topic,
    egress_settings,
    kafka_settings,
    new_bucket,
    produce,
    read_partition,
    running,
    sample_records,
    segment_keys,
    wait_for,
)

FAST_RETRY = RetryPolicy(attempts=3, initial=timedelta(milliseconds=20),
                         maximum=timedelta(milliseconds=200), jitter=0.0)


def values(recs: Iterable[Record]) -> list[bytes | None]:
    return [r.value for r in recs]


def test_transactional_source_segments_touch_and_nothing_is_lost(
        source_brokers: str, moto_endpoint: str, broker_kind: str) -> None:
    bucket, store = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 1)
    p = Producer(kafka_settings(source_brokers), transactional_id=unique_name("tx"))
    p.init_transactions(30)

    def txn(tag: str, n: int, commit: bool) -> None:
        p.begin_transaction()
        for i in range(n):
            p.produce(topic, value=f"{tag}-{i}".encode(), partition=0)
        # In the log before the transaction ends, so an aborted one really leaves records
        # (an offset hole) behind; an abort of records still queued in the client can also
        # reach Apache Kafka's coordinator before the transaction has begun there
        # (INVALID_TXN_STATE).
        assert p.flush(30) == 0
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)

    txn("a", 6, True)
    txn("x", 4, False)
    txn("b", 6, True)
    settings = egress_settings(source_brokers, moto_endpoint, bucket,
                               {topic: {"max_segment_messages": 5, "max_segment_age": "500ms"}})
    group = settings.egress.group_id  # type: ignore[union-attr]
    first = Egress(settings, store=store)
    with running(first):
        wait_for(lambda: b"b-5" in values(read_partition(store, topic, 0)),
                 what="the first transactions")
    # The commit may point at a transaction marker; a restart resumes there.
    txn("c", 3, True)
    second = Egress(settings, store=store)
    with running(second):
        wait_for(lambda: any(v == b"c-2" for v in values(read_partition(store, topic, 0))),
                 what="the last transaction")
    keys = segment_keys(store, topic, 0)
    assert_touching(keys)
    got = read_partition(store, topic, 0)
    offsets = [r.offset for r in got]
    assert offsets == sorted(set(offsets))
    committed_values = [f"{t}-{i}".encode() for t, n in (("a", 6), ("b", 6), ("c", 3))
                        for i in range(n)]
    if broker_kind == "apache":
        # read_committed really hides the aborted transaction: only committed records.
        assert values(got) == committed_values
    # Tansu hands aborted records to read_committed consumers too (docs/testing.md); what must
    # hold is that every committed record is there, in order, and nothing is called lost.
    assert [v for v in values(got) if not (v or b"").startswith(b"x-")] == committed_values
    # Markers take offsets: the last segment ends at the last record, and the committed
    # offset is past it.
    assert keys[-1].end == offsets[-1]
    assert committed(source_brokers, group, topic, 1)[0] == offsets[-1] + 1
    for eg in (first, second):
        assert eg.metrics.total("egress_source_lost_messages_total") == 0


def test_two_instances_split_partitions_without_overlap(
        source_brokers: str, moto_endpoint: str) -> None:
    bucket, store = new_bucket(moto_endpoint)
    parts = 4
    topic = create_topic(source_brokers, parts)
    settings = egress_settings(source_brokers, moto_endpoint, bucket,
                               {topic: {"max_segment_messages": 40, "max_segment_age": "300ms"}})
    recs = {p: sample_records(p, 300) for p in range(parts)}
    producer = Producer(kafka_settings(source_brokers))

    def produce_slice(lo: int, hi: int) -> None:
        for p in range(parts):
            produce(source_brokers, topic, p, recs[p][lo:hi], producer)

    a, b = Egress(settings, store=store), Egress(settings, store=store)
    with running(a):
        wait_for(a.ready, what="a assigned")
        produce_slice(0, 100)
        wait_for(lambda: all(segment_keys(store, topic, p) for p in range(parts)),
                 what="segments from a")
        with running(b):
            produce_slice(100, 200)
            wait_for(lambda: len(a._writers) == 2 and len(b._writers) == 2, timeout=30,
                     what="rebalance to 2 + 2")
            produce_slice(200, 300)
            wait_for(lambda: all(read_partition(store, topic, p)[-1:] == recs[p][-1:]
                                 for p in range(parts)), what="all records")
    for p in range(parts):
        keys = segment_keys(store, topic, p)
        assert_touching(keys)                       # no overlap, no gap
        assert read_partition(store, topic, p) == recs[p]
    assert a.metrics.total("egress_rebalance_events_total", event="revoke") >= 4
    assert committed(source_brokers, settings.egress.group_id, topic, parts) == [300] * parts  # type: ignore[union-attr]


class FlakyStore(ObjectStore):
    """Wraps a store; copies to keys containing ``marker`` fail while ``broken`` is set."""

    def __init__(self, inner: ObjectStore, marker: str) -> None:
        self.inner = inner
        self.bucket = inner.bucket
        self.marker = marker
        self.broken = threading.Event()
        self.failed_copies = 0

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        return self.inner.put(key, data, **kw)

    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        return self.inner.open_upload(key, storage_class=storage_class)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(key, start, length)

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after=start_after)

    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        if self.marker in dst and self.broken.is_set():
            self.failed_copies += 1
            raise StorageError(f"injected: copy to {dst} failed (503 SlowDown)")
        return self.inner.copy(src, dst, storage_class=storage_class)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many(keys)


def test_s3_failing_for_one_partition_does_not_stall_the_others(
        source_brokers: str, moto_endpoint: str) -> None:
    bucket, s3 = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 2)
    store = FlakyStore(s3, f"/{topic}/0/")
    store.broken.set()
    settings = egress_settings(source_brokers, moto_endpoint, bucket,
                               {topic: {"max_segment_messages": 50, "max_segment_age": "300ms"}})
    group = settings.egress.group_id  # type: ignore[union-attr]
    recs = {p: sample_records(p, 200) for p in range(2)}
    eg = Egress(settings, store=store, retry_policy=FAST_RETRY)
    with running(eg):
        wait_for(eg.ready, what="assignment")
        for p in range(2):
            produce(source_brokers, topic, p, recs[p])
        # Partition 1 flows while every copy of partition 0 fails.
        wait_for(lambda: read_partition(s3, topic, 1) == recs[1], what="partition 1 done")
        wait_for(lambda: eg.metrics.total("egress_segment_failures_total",
                                          partition="0") >= 2, what="retried failures")
        assert segment_keys(s3, topic, 0) == []
        assert committed(source_brokers, group, topic, 2) == [-1001, 200]  # nothing early
        store.broken.clear()
        wait_for(lambda: read_partition(s3, topic, 0) == recs[0], what="partition 0 done")
    assert_touching(segment_keys(s3, topic, 0))
    assert store.failed_copies >= 2 * FAST_RETRY.attempts
    assert committed(source_brokers, group, topic, 2) == [200, 200]
    # Failed segments were aborted: their temp objects were deleted with them.
    assert list(s3.list("temp/")) == []


def _config(path: Path, brokers: str, endpoint: str, bucket: str, topic: str,
            group: str) -> Path:
    kafka_conf = ", ".join(f'"{k}" = {json.dumps(v)}' for k, v in FAST_GROUP_CONFIG.items())
    path.write_text(f"""
region = "us-east-1"
[s3]
bucket = "{bucket}"
endpoint_url = "{endpoint}"
[kafka]
brokers = "{brokers}"
config = {{ {kafka_conf} }}
[metrics]
port = 0
[egress]
group_id = "{group}"
shutdown_timeout = "10s"
[egress.topics."{topic}"]
max_segment_messages = 100
max_segment_age = "1h"
""")
    return path


def _egress_process(config: Path, **env: str) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).parent / "replicator-egress"
    return subprocess.Popen([str(exe), "--config", str(config)],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def test_kill_9_mid_segment_then_restart(source_brokers: str, moto_endpoint: str,
                                         tmp_path: Path) -> None:
    bucket, store = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 2)
    group = unique_name("g")
    config = _config(tmp_path / "egress.toml", source_brokers, moto_endpoint, bucket, topic,
                     group)
    recs = {p: sample_records(p, 250) for p in range(2)}
    for p in range(2):
        produce(source_brokers, topic, p, recs[p])
    proc = _egress_process(config)
    try:
        wait_for(lambda: all(len(segment_keys(store, topic, p)) == 2 for p in range(2)),
                 what="two count segments per partition (records 200-249 stay open)")
        wait_for(lambda: committed(source_brokers, group, topic, 2) == [200, 200],
                 what="commits")
    finally:
        proc.kill()     # SIGKILL: no drain, no revoke
        proc.wait(10)
    # No partial segment is visible: only the two count segments of each partition.
    for p in range(2):
        assert [(k.start, k.end) for k in segment_keys(store, topic, p)] == [(0, 99),
                                                                            (100, 199)]
    # Restart; a short age closes the rest; SIGTERM drains and exits 0.
    env = {f"REPLICATOR_EGRESS__TOPICS__{topic}__MAX_SEGMENT_AGE": "500ms"}
    proc = _egress_process(config, **env)
    try:
        wait_for(lambda: all(read_partition(store, topic, p) == recs[p] for p in range(2)),
                 what="everything after the restart")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    for p in range(2):
        assert_touching(segment_keys(store, topic, p))
    assert committed(source_brokers, group, topic, 2) == [250, 250]
    # Orphan temp objects are the only possible garbage (none here: the open segments were
    # smaller than one part, so nothing had reached S3 before the kill).
    assert all(o.key.startswith(("temp/", "data/")) for o in store.list(""))


def test_a_seek_that_fails_during_the_rewind_is_retried_and_nothing_is_skipped(
        source_brokers: str, moto_endpoint: str) -> None:
    """Partition 0's copies fail, so it rewinds; its first seeks back fail too (the client
    refuses them). The partition must stay rewinding until a seek succeeds: resumed where
    it stood, its next segment would be named from the failed start while holding only
    later records (ingress would skip the difference)."""
    bucket, s3 = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 1)
    store = FlakyStore(s3, f"/{topic}/0/")
    store.broken.set()
    settings = egress_settings(source_brokers, moto_endpoint, bucket,
                               {topic: {"max_segment_messages": 50, "max_segment_age": "300ms"}})
    recs = sample_records(0, 300)
    eg = Egress(settings, store=store, retry_policy=FAST_RETRY)
    with running(eg):
        wait_for(eg.ready, what="assignment")
        consumer = eg._consumer
        assert consumer is not None
        seek = consumer.seek
        refused = [0]

        def failing_seek(tp: Any) -> None:
            if store.broken.is_set() or refused[0] < 3:
                refused[0] += 1
                raise KafkaRetriableError(f"seek {tp}: Local: Erroneous state")
            seek(tp)

        consumer.seek = failing_seek  # type: ignore[method-assign,assignment]
        produce(source_brokers, topic, 0, recs[:200])
        wait_for(lambda: refused[0] >= 1, what="a failed seek back to the failed segment")
        store.broken.clear()
        produce(source_brokers, topic, 0, recs[200:])
        wait_for(lambda: read_partition(s3, topic, 0) == recs, what="every record")
    assert refused[0] >= 3 and eg.metrics.total("egress_seek_failures_total") >= 3
    keys = segment_keys(s3, topic, 0)
    assert_touching(keys)
    assert keys[0].start == 0 and keys[-1].end == 299
    assert committed(source_brokers, settings.egress.group_id, topic, 1) == [300]  # type: ignore[union-attr]


class GatedStore(FlakyStore):
    """Copies to final keys containing ``marker`` wait while the gate is closed."""

    def __init__(self, inner: ObjectStore, marker: str) -> None:
        super().__init__(inner, marker)
        self.gate = threading.Event()
        self.waiting = 0
        self.lock = threading.Lock()

    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        if self.marker in dst:
            with self.lock:
                self.waiting += 1
            self.gate.wait(60)
        return self.inner.copy(src, dst, storage_class=storage_class)


def test_a_writer_whose_partition_moved_while_it_uploaded_never_commits(
        source_brokers: str, moto_endpoint: str) -> None:
    """Egress A's copies hang; B joins, A's revoke waits out shutdown_timeout and gives its
    partitions up with the copies still running. When they finish, A (still a member of the
    group, so the broker would accept it) must not commit for the partition that moved to
    B: a stale commit landing under B would make B name a segment from one offset while
    reading from another."""
    bucket, s3 = new_bucket(moto_endpoint)
    topic = create_topic(source_brokers, 2)
    store = GatedStore(s3, f"/{topic}/")
    group = unique_name("g")
    limits = {topic: {"max_segment_messages": 50, "max_segment_age": "1h"}}
    a = Egress(egress_settings(source_brokers, moto_endpoint, bucket, limits, group=group,
                               shutdown_timeout="2s"), store=store, retry_policy=FAST_RETRY)
    b = Egress(egress_settings(source_brokers, moto_endpoint, bucket, limits, group=group),
               store=s3, retry_policy=FAST_RETRY)
    commits: list[tuple[int, int]] = []
    with running(a):
        wait_for(a.ready, what="A assigned")
        consumer = a._consumer
        assert consumer is not None
        commit = consumer.commit

        def recording_commit(offsets: Any) -> Any:
            commits.extend((tp.partition, tp.offset) for tp in offsets)
            return commit(offsets)

        consumer.commit = recording_commit  # type: ignore[method-assign]
        for p in range(2):
            produce(source_brokers, topic, p, sample_records(p, 60))
        wait_for(lambda: store.waiting == 2, what="both of A's first copies hanging")
        with running(b):
            wait_for(lambda: len(b._writers) == 1 and len(a._writers) == 1, 60,
                     what="one partition each after the rebalance")
            (moved,) = [p for _, p in b._writers]
            store.gate.set()            # the zombie copies finish now
            wait_for(lambda: all(any(k.end == 49 for k in segment_keys(s3, topic, p))
                                 for p in range(2)), what="the zombie segments visible")
            wait_for(lambda: all(w.queue.idle for w in [*a._writers.values()]), what="A idle")
            time.sleep(1.0)             # a commit request would be served within a poll
            assert (moved, 50) not in commits, f"A committed for B's partition: {commits}"
            # B replicates its partition from the commit it found, and flows on.
            produce(source_brokers, topic, moved, sample_records(moved, 60)[:10])
            wait_for(lambda: b.metrics.total("egress_messages_total") >= 60, what="B reads")
