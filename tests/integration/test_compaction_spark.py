"""Compaction against moto S3: on local Spark (one session for the file), and as the real
CLI in a subprocess that is killed half-way and run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from compaction.controller import Compaction
from compaction.merge import TaskSpec, merge_segments
from formats.base import WriterOptions
from formats.records import records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload
from replicator.core.keys import SegmentKey
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import Settings
from replicator.devstack.aws import create_bucket
from replicator.devstack.processes import free_port
from tests.conftest import unique_name
from tests.unit.test_compaction_helpers import (
    compaction_settings,
    make_records,
    read_segment,
    write_segment,
)

pytestmark = pytest.mark.timeout(180)

BIN = Path(sys.executable).parent / "replicator-compaction"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local Spark session of the test run (about 7 s to start)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (SparkSession.builder.master("local[2]")
               .appName("replicator-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    yield session
    session.stop()


@pytest.fixture
def bucket(moto_endpoint: str) -> str:
    name = unique_name("compaction")
    client = make_s3_client(endpoint_url=moto_endpoint, region="us-east-1",
                            access_key_id="test", secret_access_key="test")
    create_bucket(client, name, "us-east-1")
    return name


def s3_settings(moto_endpoint: str, bucket: str, **kw: Any) -> Settings:
    s3 = {"endpoint_url": moto_endpoint, "access_key_id": "test",
          "secret_access_key": "test", "region": "us-east-1"}
    return compaction_settings(bucket=bucket, s3=s3, **kw)


def k(level: int, start: int, end: int, partition: int = 0) -> SegmentKey:
    return SegmentKey("data", "r1", "t", partition, level, start, end)


def seed(store: S3ObjectStore, partition: int, ranges: list[tuple[int, int]]) -> list[SegmentKey]:
    keys = []
    for s, e in ranges:
        key = k(0, s, e, partition)
        write_segment(store, key, make_records(s, e, step=2))
        keys.append(key)
    return keys


def later() -> datetime:
    """A clock two hours ahead: every seeded segment is older than min_segment_age."""
    return datetime.now(UTC) + timedelta(hours=2)


def segment_keys(store: S3ObjectStore) -> list[str]:
    return [i.key for i in store.list("data/") if SegmentKey.try_parse(i.key)]


def test_spark_merges_level0_segments(spark: Any, moto_endpoint: str, bucket: str) -> None:
    settings = s3_settings(moto_endpoint, bucket, spark_master="local[2]",
                           spark_conf={"spark.ui.enabled": "false"})
    store = S3ObjectStore.from_settings(settings)
    p0 = seed(store, 0, [(0, 99), (100, 199), (200, 299), (300, 399)])
    p1 = seed(store, 1, [(10, 59), (60, 60), (61, 120)])
    expected = {p: [r for key in keys for r in read_segment(store, key)]
                for p, keys in ((0, p0), (1, p1))}
    assert len(segment_keys(store)) == 7

    c = Compaction(settings, store=store, clock=later, serve_metrics=False)
    c.start()
    report = c.run_once()
    c.close()

    assert report.outcome == "success", report
    assert sorted(segment_keys(store)) == [k(1, 0, 399).to_key(), k(1, 10, 120, 1).to_key()]
    assert read_segment(store, k(1, 0, 399)) == expected[0]
    assert read_segment(store, k(1, 10, 120, 1)) == expected[1]
    assert [i.key for i in store.list("temp/")] == []
    assert c.m.summary()["segments_read"] == 7
    assert c.m.summary()["segments_written"] == 2
    assert spark.sparkContext is not None   # the shared session is still alive


def test_spark_merges_segments_written_by_egress(spark: Any, source_brokers: str,
                                                moto_endpoint: str) -> None:
    from egress.controller import Egress
    from tests.integration import test_egress as eg

    bucket, store = eg.new_bucket(moto_endpoint)
    topic = eg.create_topic(source_brokers, 2)
    records = {p: eg.sample_records(p, 230) for p in range(2)}
    for p in range(2):
        eg.produce(source_brokers, topic, p, records[p])
    egress = Egress(eg.egress_settings(source_brokers, moto_endpoint, bucket,
                                       {topic: {"max_segment_messages": 50}}), store=store)
    with eg.running(egress):
        eg.wait_for(lambda: all(sum(k.span for k in eg.segment_keys(store, topic, p)) >= 200
                                for p in range(2)), what="egress segments")
    level0 = {p: eg.segment_keys(store, topic, p) for p in range(2)}
    assert all(len(keys) >= 4 for keys in level0.values())
    before = {p: eg.read_partition(store, topic, p) for p in range(2)}
    assert before == records

    settings = compaction_settings(
        region=eg.REGION, bucket=bucket, s3={"endpoint_url": moto_endpoint},
        spark_master="local[2]",
        topics={topic: {"min_segment_age": "1h", "min_segment_count": 2,
                        "min_segment_size": 1, "batch_size": 64}})
    c = Compaction(settings, store=store, clock=later, serve_metrics=False)
    report = c.run_once()
    c.close()
    assert report.outcome == "success", report
    for p in range(2):
        out = SegmentKey("data", eg.REGION, topic, p, 1, level0[p][0].start, level0[p][-1].end)
        assert [i.key for i in store.list(f"data/{eg.REGION}/{topic}/{p}/")] == [out.to_key()]
        assert read_segment(store, out) == records[p]
    assert store.head(f"data/{eg.REGION}/{topic}/_topic.json")   # untouched


def test_spark_rerun_after_interrupted_run_finishes_cleanup(spark: Any, moto_endpoint: str,
                                                            bucket: str) -> None:
    settings = s3_settings(moto_endpoint, bucket, spark_master="local[2]")
    store = S3ObjectStore.from_settings(settings)
    first = seed(store, 0, [(0, 49), (50, 99)])
    seed(store, 0, [(100, 149), (150, 199)])
    # The interrupted run: published 0-99 but did not delete its inputs, and left a
    # half-written temp upload and a finished-but-unpublished temp object behind.
    merge_segments(store, get_format("parquet"), WriterOptions(), "temp",
                   TaskSpec([x.to_key() for x in first], [1, 1], k(1, 0, 99).to_key(), 10))
    dangling = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    dangling.write_batch(records_to_batch(make_records(100, 149)))

    c = Compaction(settings, store=store, clock=later, serve_metrics=False)
    report = c.run_once()
    c.close()
    assert report.outcome == "success"
    assert sorted(report.covered_to_delete) == sorted(x.to_key() for x in first)
    assert sorted(segment_keys(store)) == [k(1, 0, 99).to_key(), k(1, 100, 199).to_key()]
    offsets = [r.offset for key in (k(1, 0, 99), k(1, 100, 199))
               for r in read_segment(store, key)]
    assert offsets == [r.offset for r in make_records(0, 49, 2) + make_records(50, 99, 2)
                       + make_records(100, 149, 2) + make_records(150, 199, 2)]
    dangling.abort()


def test_spark_failed_task_keeps_its_inputs_others_succeed(spark: Any, moto_endpoint: str,
                                                           bucket: str) -> None:
    settings = s3_settings(moto_endpoint, bucket, spark_master="local[2]")
    store = S3ObjectStore.from_settings(settings)
    seed(store, 0, [(0, 9), (10, 19)])
    bad = seed(store, 1, [(0, 9)])
    store.put(k(0, 10, 19, 1).to_key(), b"PAR1 but not parquet")
    c = Compaction(settings, store=store, clock=later, serve_metrics=False)
    report = c.run_once()
    c.close()
    assert report.outcome == "failed"
    outcomes = {t.output: (t.outcome, t.error) for t in report.tasks}
    assert outcomes[k(1, 0, 19).to_key()][0] == "merged"
    outcome, error = outcomes[k(1, 0, 19, 1).to_key()]
    assert outcome == "failed" and "SegmentCorrupt" in (error or "")
    assert sorted(segment_keys(store)) == sorted(
        [k(1, 0, 19).to_key(), bad[0].to_key(), k(0, 10, 19, 1).to_key()])
    assert [i.key for i in store.list("temp/")] == []


# --- the CLI as a process ---------------------------------------------------------------------


def write_config(tmp_path: Path, moto_endpoint: str, bucket: str, **compaction: Any) -> Path:
    topics = compaction.pop("topics", {"t": {"min_segment_age": "1s", "min_segment_count": 2,
                                             "min_segment_size": 1, "batch_size": 50}})
    # moto reports no replication status, and nothing replicates this bucket.
    compaction.setdefault("replication_grace", "0s")
    lines = [
        'region = "r1"',
        "[s3]", f'bucket = "{bucket}"', f'endpoint_url = "{moto_endpoint}"',
        'access_key_id = "test"', 'secret_access_key = "test"', 'region = "us-east-1"',
        "[kafka]", 'brokers = "127.0.0.1:1"',
        "[metrics]", "port = 0",
        "[compaction]",
        *(f"{name} = {json.dumps(v)}" for name, v in compaction.items()),
    ]
    for t, cfg in topics.items():
        lines.append(f'[compaction.topics."{t}"]')
        lines.extend(f"{name} = {json.dumps(v)}" for name, v in cfg.items())
    path = tmp_path / "compaction.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_cli_dry_run_then_once(tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    settings = s3_settings(moto_endpoint, bucket)
    store = S3ObjectStore.from_settings(settings)
    seed(store, 0, [(0, 9), (10, 19), (20, 29)])
    time.sleep(1.1)   # min_segment_age = 1s
    config = write_config(tmp_path, moto_endpoint, bucket, spark_master="inline")
    before = segment_keys(store)

    dry = run_cli("--config", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "3 segments in, " in dry.stdout and k(1, 0, 29).to_key() in dry.stdout
    assert segment_keys(store) == before

    once = run_cli("--config", str(config), "--once", "--topic", "t", "--partition", "0")
    assert once.returncode == 0, once.stderr
    out = json.loads(once.stdout)
    assert out["report"]["outcome"] == "success"
    assert out["metrics"]["segments_written"] == 1 and out["metrics"]["segments_read"] == 3
    assert segment_keys(store) == [k(1, 0, 29).to_key()]

    bad = run_cli("--config", str(config), "--once", "--topic", "unknown")
    assert bad.returncode == 2 and "--topic" in bad.stderr
    bad = run_cli("--config", str(config), "--once", "--min-level", "2", "--max-level", "1")
    assert bad.returncode == 2 and "level range" in bad.stderr


def test_cli_killed_half_way_then_rerun_loses_and_duplicates_nothing(
        tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    settings = s3_settings(moto_endpoint, bucket)
    store = S3ObjectStore.from_settings(settings)
    partitions = 8
    expected: dict[int, list[int]] = {}
    for p in range(partitions):
        keys = seed(store, p, [(i * 40, i * 40 + 39) for i in range(6)])
        expected[p] = [r.offset for key in keys for r in read_segment(store, key)]
    time.sleep(1.1)
    config = write_config(tmp_path, moto_endpoint, bucket, spark_master="inline",
                          parallelism=1, lock_ttl="2s")

    proc = subprocess.Popen([str(BIN), "--config", str(config), "--once"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(SegmentKey.parse(x).level == 1 for x in segment_keys(store)):
                break
            time.sleep(0.02)
        else:
            pytest.fail("no output segment appeared")
        os.kill(proc.pid, signal.SIGKILL)   # the run dies before deleting any input
    finally:
        proc.wait(timeout=10)
    level1 = [x for x in segment_keys(store) if SegmentKey.parse(x).level == 1]
    assert 1 <= len(level1) < partitions, "the kill should land half-way"
    assert len(segment_keys(store)) > partitions   # inputs still there

    time.sleep(2.5)   # the dead run's lock expires (lock_ttl = 2s)
    rerun = run_cli("--config", str(config), "--once")
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)["report"]
    assert report["outcome"] == "success"
    assert len(report["covered_to_delete"]) == 6 * len(level1)

    final = sorted(segment_keys(store))
    assert final == sorted(k(1, 0, 239, p).to_key() for p in range(partitions))
    for p in range(partitions):
        assert [r.offset for r in read_segment(store, k(1, 0, 239, p))] == expected[p]
    assert [i.key for i in store.list("data/r1/_compaction.lock")] == []


def test_scheduled_mode_runs_on_a_6_field_cron_serves_metrics_and_exits_0_on_sigterm(
        tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    settings = s3_settings(moto_endpoint, bucket)
    store = S3ObjectStore.from_settings(settings)
    seed(store, 0, [(0, 9), (10, 19)])
    time.sleep(1.1)
    port = free_port()
    config = write_config(tmp_path, moto_endpoint, bucket, spark_master="inline",
                          schedule="*/1 * * * * *")   # seconds-first: every second
    config.write_text(config.read_text().replace("port = 0", f"port = {port}"))
    proc = subprocess.Popen([str(BIN), "--config", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=1) as r:
                    body = r.read().decode()
            except OSError:
                body = ""
            if 'replicator_compaction_runs_total{outcome="success",region="r1"} 2.0' in body:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"no two successful runs in 30 s:\n{body}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            assert r.status == 200
        assert "replicator_compaction_last_success_timestamp_seconds" in body
        assert segment_keys(store) == [k(1, 0, 19).to_key()]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_inputs_wait_for_the_grace_period_on_a_store_without_replication_status(
        moto_endpoint: str, bucket: str) -> None:
    """moto reports no replication status (like a bucket kept in sync by ``replicator
    sync``): the inputs of an output stay until it is ``replication_grace`` old."""
    settings = s3_settings(moto_endpoint, bucket, spark_master="inline",
                           replication_grace="3h")
    store = S3ObjectStore.from_settings(settings)
    inputs = [k(0, 0, 99), k(0, 100, 199)]
    for key in inputs:
        write_segment(store, key, make_records(key.start, key.end))
    assert store.head(inputs[0].to_key()).replication_status is None
    ahead = timedelta(hours=2)        # inputs are "old"; the output is younger than 3 h
    report = Compaction(settings, store=store,
                        clock=lambda: datetime.now(UTC) + ahead).run_once()
    assert [t.outcome for t in report.tasks] == ["merged"] and report.deleted == []
    assert all(store.head(x.to_key()) for x in inputs)
    ahead = timedelta(hours=4)
    report = Compaction(settings, store=store,
                        clock=lambda: datetime.now(UTC) + ahead).run_once()
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
    assert [o.key for o in store.list("data/")] == [k(1, 0, 199).to_key()]
