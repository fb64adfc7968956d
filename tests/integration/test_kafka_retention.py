"""Retention at the source, on Apache Kafka: records deleted before egress read them.

Egress replicates the first records and stops. More records are produced with old
timestamps, then newer ones; the topic's ``retention.ms`` is lowered and the broker's
retention check (every second on the session brokers) deletes the old log segments.
Egress, started again, resumes at its committed offset, which is now below the log start:
it must log the exact missing range at ERROR, count it in
``replicator_egress_source_lost_messages_total``, and replicate the rest; ingress must
replay everything that exists without declaring anything lost (the loss is reported once,
where it is known exactly). Tansu has no retention, so this needs ``KAFKA_HOME``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import Future
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient

from egress import out_of_range
from egress.controller import Egress
from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition
from replicator.devstack.processes import free_port
from replicator.devstack.toml_writer import write_toml
from tests.chaos.harness import metric_values
from tests.conftest import FAST_GROUP_CONFIG
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    running_egress,
    running_ingress,
    wait_for,
)
from tests.integration.test_egress import assert_touching, read_partition, segment_keys
from tests.integration.test_ingress import read_topic

pytestmark = pytest.mark.apache

HOUR_MS = 3_600_000


def log_start(pipe: Pipeline) -> int:
    c = Consumer(pipe.source_kafka, "retention-probe")
    try:
        lo, _ = c.watermarks(TopicPartition(pipe.topic, 0), timeout=10)
        return lo
    finally:
        c.close()


def test_records_deleted_by_retention_before_egress_read_them(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    # No time retention yet; a log segment rolls when a record is a second (record time)
    # younger than the segment's first, so the old records and the new ones end up in
    # different segments and the old ones can be deleted as a whole.
    pipe.create_source(1, {"retention.ms": "-1", "segment.ms": "1000"})
    now = int(time.time() * 1000)
    old = now - 2 * HOUR_MS
    p = Producer(pipe.source_kafka)

    def produce(lo: int, hi: int, base: int) -> None:
        for i in range(lo, hi):
            p.produce(pipe.topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=0,
                      timestamp=base + i * 2000)
        assert p.flush(30) == 0

    produce(0, 50, old)
    settings = pipe.egress_settings(max_segment_messages=25)
    with running_egress(Egress(settings, store=pipe.store)):
        wait_for(lambda: [(k.start, k.end) for k in segment_keys(pipe.store, pipe.topic, 0)]
                 == [(0, 24), (25, 49)], 30, "the first 50 records in segments")
    produce(50, 150, old)              # never read by egress: deleted below
    produce(150, 200, now - 400_000)   # recent: kept
    Admin(pipe.source_kafka).alter_topic_config(pipe.topic, {"retention.ms": str(HOUR_MS)})
    wait_for(lambda: log_start(pipe) == 150, 60, "retention to delete offsets 0-149")

    with caplog.at_level(logging.INFO), running_egress(Egress(settings, store=pipe.store)) \
            as eg, running_ingress(pipe.ingress_settings()) as ing:
        wait_for(lambda: any(k.end == 199 for k in segment_keys(pipe.store, pipe.topic, 0)),
                 60, "the records after the deleted ones in segments")
        wait_for(lambda: pipe.checkpoint_offsets(ing).get(0) == 199, 60,
                 "ingress to replay everything that exists")
        assert eg.metrics.total("egress_source_lost_messages_total") == 100
        assert ing.metrics.total("replicator_ingress_segments_lost_total") == 0
        assert ing.metrics.total("replicator_ingress_messages_lost_total") == 0
        assert ing.metrics.total("replicator_ingress_messages_produced_total") == 100
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"{pipe.topic}[0]: offsets 50..149 (100 positions) were deleted at the source"
               in m for m in errors), errors
    keys = segment_keys(pipe.store, pipe.topic, 0)
    assert_touching(keys)  # the loss is reported once, here; ingress sees no gap
    got = [r.value for r in read_partition(pipe.store, pipe.topic, 0)]
    expected = [f"v{i}".encode() for i in [*range(50), *range(150, 200)]]
    assert got == expected
    # The copy took the source's retention.ms (copied from _topic.json), so the destination
    # broker deletes the replayed records that are older than an hour, as the source did.
    copy = [row[2] for row in read_topic(pipe.dest_brokers, pipe.dest_topic)[0]]
    assert copy[-50:] == expected[-50:]


def test_records_deleted_while_a_segment_is_open_are_reported(pipe: Pipeline,
                                                              tmp_path: Path) -> None:
    """The egress process holds an open segment (long max_segment_age) and is frozen
    (SIGSTOP) while the source deletes records it has not fetched (DeleteRecords, what
    retention does to old log segments); thawed, its next fetch gets OFFSET_OUT_OF_RANGE
    and librdkafka jumps to the new log start. That range should be reported like any
    other retention loss."""
    pipe.create_source(1)
    p = Producer(pipe.source_kafka)

    def produce(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            p.produce(pipe.topic, value=f"v{i}".encode(), partition=0,
                      timestamp=int(time.time() * 1000))
        assert p.flush(30) == 0

    produce(0, 50)
    port = free_port()
    cfg = tmp_path / "egress.toml"
    write_toml(cfg, {
        "region": SOURCE_REGION,
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, "access_key_id": "test",
               "secret_access_key": "test"},
        "kafka": {"brokers": pipe.source_brokers, "config": FAST_GROUP_CONFIG},
        "metrics": {"host": "127.0.0.1", "port": port},
        "egress": {"group_id": pipe.egress_group, "shutdown_timeout": "10s",
                   "topics": {pipe.topic: {"max_segment_messages": 100_000,
                                           "max_segment_age": "60s"}}}})
    exe = Path(sys.executable).parent / "replicator-egress"
    with open(tmp_path / "egress.log", "wb") as out:
        proc = subprocess.Popen([str(exe), "--config", str(cfg)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        def metric(name: str) -> float:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return -1.0
            return sum(metric_values(text, name).values())

        wait_for(lambda: metric("replicator_egress_messages_total") == 50, 60,
                 "the first records in the open segment")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            # The fetch that was waiting at the broker when the process froze answers with
            # the first record produced now (it arrives after the thaw); the rest of the
            # records are never fetched before they are deleted.
            produce(50, 51)
            time.sleep(1)
            produce(51, 150)
            admin = AdminClient({"bootstrap.servers": pipe.source_brokers})
            for fut in admin.delete_records([ck.TopicPartition(pipe.topic, 0, 150)]).values():
                fut.result(30)
            produce(150, 200)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        # A fetch already waiting at the broker may have delivered a few records produced
        # after the freeze: the lost range is what never arrived. Every position is either
        # read or reported lost (waiting for "read >= 100" alone raced with the last fetch:
        # 100 read while 101 would be, 99 lost).
        def accounted() -> float:
            return (metric("replicator_egress_messages_total")
                    + metric("replicator_egress_source_lost_messages_total"))

        wait_for(lambda: accounted() >= 200, 60, "the records after the deleted ones")
        read = metric("replicator_egress_messages_total")
        lost = metric("replicator_egress_source_lost_messages_total")
        assert read + lost == 200, (read, lost)
        assert lost > 0, "premise: records were deleted before egress fetched them"
        time.sleep(1)   # nothing counted twice afterwards
        assert accounted() == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_a_partition_whose_log_start_cannot_be_read_is_reported_stalled_and_recovers(
        pipe: Pipeline, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Retention deleted records under egress's committed position, and the log start of
    the partition cannot be read (the read never answers: a broker that does not, a client
    stuck). The partition must not stop silently: after the stall time ERROR, the stalled
    gauge, and the process not ready; once the read answers, it reports the exact loss,
    goes on by itself and is ready again."""
    monkeypatch.setattr(out_of_range, "STALLED_AFTER", 3.0)
    monkeypatch.setattr(out_of_range, "READ_PATIENCE", 1.0)
    pipe.create_source(1)
    p = Producer(pipe.source_kafka)

    def produce(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            p.produce(pipe.topic, value=f"v{i}".encode(), partition=0)
        assert p.flush(30) == 0

    produce(0, 50)
    settings = pipe.egress_settings(max_segment_messages=25, max_segment_age="60s")
    with running_egress(Egress(settings, store=pipe.store)):
        wait_for(lambda: [(k.start, k.end) for k in segment_keys(pipe.store, pipe.topic, 0)]
                 == [(0, 24), (25, 49)], 30, "the first 50 records in segments")
    produce(50, 200)
    admin = AdminClient({"bootstrap.servers": pipe.source_brokers})
    for fut in admin.delete_records([ck.TopicPartition(pipe.topic, 0, 150)]).values():
        fut.result(30)

    answering = threading.Event()
    real = Admin.log_start
    asked: list[float] = []

    def gated(self: Admin, topic: str, partition: int, *, timeout: float) -> Future[int]:
        asked.append(time.monotonic())
        if answering.is_set():
            return real(self, topic, partition, timeout=timeout)
        return Future()                 # never answers

    monkeypatch.setattr(Admin, "log_start", gated)
    with caplog.at_level(logging.INFO), running_egress(Egress(settings, store=pipe.store)) \
            as eg:
        def stalled() -> float:
            return eg.metrics.total("egress_log_start_stalled_partitions")

        wait_for(lambda: stalled() == 1, 60, "the partition to be reported stalled")
        assert not eg.ready()
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(f"{pipe.topic}[0]: stopped at offset 50" in m and "ListOffsets" in m
                   for m in errors), errors
        assert eg.metrics.total("egress_source_lost_messages_total") == 0
        assert len(asked) >= 2          # asked again, never given up
        answering.set()
        wait_for(lambda: any(k.end == 199 for k in segment_keys(pipe.store, pipe.topic, 0))
                 or eg.metrics.total("egress_messages_total") == 50, 60,
                 "the records after the deleted ones")
        wait_for(lambda: stalled() == 0 and eg.ready(), 30, "the stall to end")
        assert eg.metrics.total("egress_source_lost_messages_total") == 100
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"{pipe.topic}[0]: offsets 50..149 (100 positions) were deleted" in m
               for m in errors), errors


def test_records_skipped_by_origin_are_committed_past_and_never_reported_lost(
        pipe: Pipeline) -> None:
    """Active-active: the recent records of a partition all came from the other region
    (``skip_origins``). Egress copies none of them, yet its commit must move past them;
    otherwise, once retention deletes them, a restart reports them as deleted before egress
    read them (ERROR and the lost metric for records that were never to be copied)."""
    from replicator.core.settings.services import ORIGIN_HEADER

    pipe.create_source(1)
    p = Producer(pipe.source_kafka)

    def produce(lo: int, hi: int, origin: bytes | None) -> None:
        for i in range(lo, hi):
            p.produce(pipe.topic, value=f"v{i}".encode(), partition=0,
                      headers=[(ORIGIN_HEADER, origin)] if origin else None)
        assert p.flush(30) == 0

    produce(0, 10, None)
    produce(10, 110, b"other")
    settings = pipe.egress_settings(egress={"skip_origins": ["other"]},
                                    max_segment_messages=10)
    admin = Admin(pipe.source_kafka)
    with running_egress(Egress(settings, store=pipe.store)):
        wait_for(lambda: admin.group_offsets(pipe.egress_group).get((pipe.topic, 0)) == 110,
                 60, "the commit past the skipped records")
    # Retention deletes the skipped records.
    ac = AdminClient({"bootstrap.servers": pipe.source_brokers})
    for fut in ac.delete_records([ck.TopicPartition(pipe.topic, 0, 110)]).values():
        fut.result(30)
    produce(110, 120, None)
    with running_egress(Egress(settings, store=pipe.store)) as eg:
        wait_for(lambda: any(k.end == 119 for k in segment_keys(pipe.store, pipe.topic, 0)),
                 60, "the records after the skipped ones")
        assert eg.metrics.total("egress_source_lost_messages_total") == 0
    keys = segment_keys(pipe.store, pipe.topic, 0)
    assert [(k.start, k.end) for k in keys] == [(0, 9), (10, 119)]    # touching
    got = [r.value for r in read_partition(pipe.store, pipe.topic, 0)]
    assert got == [f"v{i}".encode() for i in [*range(10), *range(110, 120)]]
