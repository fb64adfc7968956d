"""``replicator restore`` on Apache Kafka: a range of a compacted archive (levels 0 and 1
mixed) replayed into a new topic record for record; kill -9 mid-restore and run again
(read_committed: no duplicate); dry-run refusals (a hole, a GLACIER segment).

The archive is real: egress copies a source topic (tombstones, null and empty keys and
values, repeated headers, timestamps) to moto, and compaction's merge makes level-1
segments over part of level 0 (its inputs left in place, as before compaction's cleanup).
Apache Kafka is needed: Tansu shows aborted transactions to read_committed readers.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from compaction.merge import TaskSpec, merge_segments
from egress.controller import Egress
from formats.base import WriterOptions
from formats.registry import get_format
from ingress.events import SegmentEvent
from replicator.core.kafka import Admin, Producer
from replicator.core.keys import SegmentKey, topic_meta_key
from replicator.core.settings import KafkaSettings
from replicator.core.wire import TopicMetadata
from replicator.devstack.toml_writer import write_toml
from replicator.ops.verify import read_partition
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import (
    CREDS,
    SOURCE_REGION,
    Pipeline,
    running_egress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 2
BASE_TS = RECENT_MS  # older records would fall to the broker's time retention

Row = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


def record(i: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    key = None if i % 11 == 0 else (b"" if i % 13 == 0 else f"k{i % 50}".encode())
    value = None if i % 7 == 0 else (b"" if i % 5 == 0 else f"value-{i}".encode() * (i % 4 + 1))
    headers: list[tuple[str, bytes | None]] = \
        [("h", f"{i}".encode()), ("h", None), ("z", b"\x00\xff")] if i % 3 else []
    return key, value, headers


def build_archive(pipe: Pipeline, n: int, *, per_segment: int = 50,
                  merge_upto: int = 200, base_ts: int = BASE_TS,
                  source_config: dict[str, str] | None = None) -> None:
    """``n`` records over the source's partitions (record ``i`` at ``base_ts + i`` s),
    archived by egress; level 1 over the first ``merge_upto`` positions of each
    partition."""
    pipe.create_source(PARTITIONS, source_config or {"cleanup.policy": "delete"})
    p = Producer(pipe.source_kafka)
    for i in range(n):
        key, value, headers = record(i)
        p.produce(pipe.topic, value, key, partition=i % PARTITIONS,
                  timestamp=base_ts + i * 1000, headers=headers or None)
    assert p.flush(30) == 0
    last = {part: (n - 1 - (n - 1 - part) % PARTITIONS) // PARTITIONS
            for part in range(PARTITIONS)}

    def archived() -> bool:
        return all(max((k.end for k in level0(pipe, part)), default=-1) == last[part]
                   for part in range(PARTITIONS))

    egress = Egress(pipe.egress_settings(max_segment_messages=per_segment), store=pipe.store)
    with running_egress(egress):
        wait_for(archived, 120, "egress to archive every record")
    for part in range(PARTITIONS):
        inputs = [k for k in level0(pipe, part) if k.end < merge_upto]
        output = SegmentKey("data", SOURCE_REGION, pipe.topic, part, 1, inputs[0].start,
                            inputs[-1].end)
        spec = TaskSpec([k.to_key() for k in inputs],
                        [pipe.store.head(k.to_key()).size for k in inputs], output.to_key(),
                        1000)
        assert merge_segments(pipe.store, get_format("parquet"), WriterOptions(), "temp",
                              spec).ok


def level0(pipe: Pipeline, part: int) -> list[SegmentKey]:
    return sorted(k for o in pipe.store.list(f"data/{SOURCE_REGION}/{pipe.topic}/{part}/0/")
                  if (k := SegmentKey.try_parse(o.key)) is not None)


def rows(kafka: KafkaSettings, topic: str, part: int) -> Iterator[Row]:
    for m in read_partition(kafka, topic, part):
        off = m.offset()
        assert off is not None
        yield (off, m.key(), m.value(), list(m.headers() or []), m.timestamp()[1])


def content(rs: Iterator[Row] | list[Row]) -> list[tuple[object, ...]]:
    """Everything but the offset (the copy has its own offsets)."""
    return [r[1:] for r in rs]


def config(pipe: Pipeline, tmp_path: Path) -> Path:
    cfg = tmp_path / "restore.toml"
    write_toml(cfg, {
        "region": "us-west-1",
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, **CREDS},
        "kafka": {"brokers": pipe.dest_brokers},
    })
    return cfg


def restore_cmd(cfg: Path, pipe: Pipeline, to_topic: str, *args: str) -> list[str]:
    exe = Path(sys.executable).parent / "replicator"
    return [str(exe), "restore", "--config", str(cfg), "--source-region", SOURCE_REGION,
            "--topic", pipe.topic, "--to-topic", to_topic,
            "--checkpoint-topic", pipe.checkpoint_topic, *args]


REPO = Path(__file__).resolve().parents[2]


def cli_env() -> dict[str, str]:
    """The environment of a ``replicator`` subprocess: this checkout's packages first (the
    console script's own directory comes first on its path, so without this it imports
    whatever checkout the virtualenv's editable install points at)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": path}


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = cli_env()
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                          check=False)


def test_restore_an_offset_range_and_a_time_range_of_a_compacted_archive(
        pipe: Pipeline, tmp_path: Path) -> None:
    build_archive(pipe, 800)
    cfg = config(pipe, tmp_path)
    source = {part: list(rows(pipe.source_kafka, pipe.topic, part))
              for part in range(PARTITIONS)}

    # An offset range across the level-1 / level-0 boundary (level 1 ends at 199).
    to_topic = unique_name("restored")
    dry = run(restore_cmd(cfg, pipe, to_topic, "--from-offset", "120", "--to-offset", "287",
                          "--dry-run"))
    assert dry.returncode == 0, dry.stderr
    level1 = [k for o in pipe.store.list(f"data/{SOURCE_REGION}/{pipe.topic}/0/1/")
              if (k := SegmentKey.try_parse(o.key)) is not None]
    assert "levels 0, 1" in dry.stdout and f"120-{level1[0].end}" in dry.stdout
    assert to_topic not in Admin(pipe.dest_kafka).list_topics()  # a dry run produces nothing
    done = run(restore_cmd(cfg, pipe, to_topic, "--from-offset", "120", "--to-offset", "287"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restored 336 records" in done.stdout
    assert Admin(pipe.dest_kafka).partition_count(to_topic) == PARTITIONS
    assert Admin(pipe.dest_kafka).topic_config(to_topic)["cleanup.policy"] == "delete"
    for part in range(PARTITIONS):
        want = [r for r in source[part] if 120 <= r[0] <= 287]
        assert content(rows(pipe.dest_kafka, to_topic, part)) == content(want)
    # Tombstones, null and empty keys/values, headers with null values all in the range.
    flat = [r for part in range(PARTITIONS) for r in source[part] if 120 <= r[0] <= 287]
    assert any(r[2] is None for r in flat) and any(r[2] == b"" for r in flat)
    assert any(r[1] is None for r in flat) and any(r[1] == b"" for r in flat)

    # A time range (ISO 8601 and ms), one partition.
    to_topic = unique_name("restored")
    lo, hi = BASE_TS + 300_000, BASE_TS + 520_999
    iso = datetime.fromtimestamp(lo / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = run(restore_cmd(cfg, pipe, to_topic, "--partitions", "1", "--from-time", iso,
                           "--to-time", str(hi)))
    assert done.returncode == 0, done.stdout + done.stderr
    want = [r for r in source[1] if lo <= r[4] <= hi]
    assert len(want) == 110  # odd i in 301..519
    assert content(rows(pipe.dest_kafka, to_topic, 1)) == content(want)
    assert list(rows(pipe.dest_kafka, to_topic, 0)) == []

    # The same command again: everything is already restored, nothing produced twice.
    again = run(restore_cmd(cfg, pipe, to_topic, "--partitions", "1", "--from-time", iso,
                            "--to-time", str(hi)))
    assert again.returncode == 0, again.stderr
    assert "restored 0 records" in again.stdout
    assert content(rows(pipe.dest_kafka, to_topic, 1)) == content(want)


def test_kill9_during_a_restore_then_the_same_command_resumes_exactly(
        pipe: Pipeline, tmp_path: Path) -> None:
    build_archive(pipe, 6000, per_segment=500, merge_upto=1500)
    cfg = config(pipe, tmp_path)
    to_topic = unique_name("restored")
    # Small transactions, paced, so the kill lands mid-restore.
    cmd = restore_cmd(cfg, pipe, to_topic, "--batch-size", "50", "--rate", "2KB/s")
    log = tmp_path / "restore.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True,
                                env=cli_env())
    try:
        def some_restored() -> bool:
            if to_topic not in Admin(pipe.dest_kafka).list_topics():
                return False
            return sum(1 for _ in read_partition(pipe.dest_kafka, to_topic, 0)) > 300

        wait_for(some_restored, 120, "the restore to commit some batches")
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    partial = sum(1 for _ in read_partition(pipe.dest_kafka, to_topic, 0))
    assert 300 < partial < 3000, log.read_text()
    done = run(restore_cmd(cfg, pipe, to_topic, "--batch-size", "500"))
    assert done.returncode == 0, done.stdout + done.stderr
    for part in range(PARTITIONS):  # read_committed: no duplicate, nothing lost
        assert content(rows(pipe.dest_kafka, to_topic, part)) == \
            content(rows(pipe.source_kafka, pipe.topic, part))
    assert "partition 0: resumed after offset" in done.stdout  # after its checkpoint


def test_dry_run_refuses_a_hole_and_a_glacier_segment_and_nothing_is_produced(
        pipe: Pipeline, tmp_path: Path) -> None:
    build_archive(pipe, 800)
    cfg = config(pipe, tmp_path)
    # A hole: a level-0 segment above level 1 deleted.
    hole = next(k for k in level0(pipe, 0) if k.start >= 200)
    pipe.store.delete(hole.to_key())
    # A GLACIER segment, the only one holding its positions.
    cold = next(k for k in level0(pipe, 1) if k.start >= 200)
    data = pipe.store.get(cold.to_key())
    pipe.store.put(cold.to_key(), data, storage_class="GLACIER")
    to_topic = unique_name("restored")
    for args in (["--dry-run"], [], ["--allow-gaps"]):
        res = run(restore_cmd(cfg, pipe, to_topic, *args))
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"{cold.to_key()} is in storage class GLACIER" in res.stderr
        if "--allow-gaps" not in args:
            assert (f"us-east-1/{pipe.topic}[0]: positions {hole.start}-{hole.end} "
                    f"({hole.span}) are missing") in res.stderr
    assert "GLACIER" in run(restore_cmd(cfg, pipe, to_topic, "--dry-run")).stdout
    assert to_topic not in Admin(pipe.dest_kafka).list_topics()
    assert pipe.checkpoint_topic not in Admin(pipe.dest_kafka).list_topics()


def count(kafka: KafkaSettings, topic: str) -> int:
    return sum(1 for part in range(PARTITIONS) for _ in read_partition(kafka, topic, part))


def test_two_windows_one_after_the_other_then_an_overlap_is_refused(
        pipe: Pipeline, tmp_path: Path) -> None:
    """Monday's window, then Tuesday's, into one topic: both restored (the checkpoint is
    keyed by the whole request); a window across both is refused, exit 2, unless --force."""
    build_archive(pipe, 400)
    cfg = config(pipe, tmp_path)
    source = {part: list(rows(pipe.source_kafka, pipe.topic, part))
              for part in range(PARTITIONS)}
    to_topic = unique_name("restored")
    first = ("--from-time", str(BASE_TS), "--to-time", str(BASE_TS + 199_999))
    second = ("--from-time", str(BASE_TS + 200_000), "--to-time", str(BASE_TS + 399_999))
    done = run(restore_cmd(cfg, pipe, to_topic, *first))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restored 200 records" in done.stdout
    done = run(restore_cmd(cfg, pipe, to_topic, *second))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restored 200 records" in done.stdout  # was 0: the first window's checkpoint
    for part in range(PARTITIONS):
        assert content(rows(pipe.dest_kafka, to_topic, part)) == content(source[part])

    # The second command again resumes its own checkpoint: nothing twice.
    again = run(restore_cmd(cfg, pipe, to_topic, *second))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "restored 0 records" in again.stdout
    # A window across both: refused by name before anything is produced.
    across = ("--from-time", str(BASE_TS + 150_000), "--to-time", str(BASE_TS + 249_999))
    refused = run(restore_cmd(cfg, pipe, to_topic, *across))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"another restore into {to_topic}" in refused.stderr
    assert "--force" in refused.stderr
    assert count(pipe.dest_kafka, to_topic) == 400
    forced = run(restore_cmd(cfg, pipe, to_topic, *across, "--force"))
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert count(pipe.dest_kafka, to_topic) == 500  # the user asked for the duplicates


def test_disjoint_partitions_restore_side_by_side(pipe: Pipeline, tmp_path: Path) -> None:
    """Two restores of one topic, --partitions 0 and --partitions 1, running at the same
    time into one target: neither fences the other (one transactional id per target
    partition)."""
    build_archive(pipe, 1200, per_segment=100, merge_upto=300)
    cfg = config(pipe, tmp_path)
    to_topic = unique_name("restored")
    Admin(pipe.dest_kafka).create_topic(to_topic, PARTITIONS)
    env = cli_env()
    procs, logs = [], []
    for part in range(PARTITIONS):
        logs.append(tmp_path / f"restore-{part}.out")
        with open(logs[-1], "w") as out:
            # Paced so that both are producing at once: 600 records of ~20 bytes each at
            # 400 B/s take ~30 s. At 1 KB/s (~12 s) a CI run once saw the second write
            # nothing before the first had finished (14 s).
            procs.append(subprocess.Popen(
                restore_cmd(cfg, pipe, to_topic, "--partitions", str(part), "--batch-size",
                            "20", "--rate", "400B/s"),
                stdout=out, stderr=out, start_new_session=True, env=env))
    try:
        def both_writing() -> bool:
            return all(any(True for _ in read_partition(pipe.dest_kafka, to_topic, part))
                       for part in range(PARTITIONS)) or \
                any(p.poll() is not None for p in procs)

        wait_for(both_writing, 120, "both restores to commit a batch")
        assert all(p.poll() is None for p in procs), [f.read_text() for f in logs]
        for p in procs:
            p.wait(300)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)
    assert [p.returncode for p in procs] == [0, 0], [f.read_text() for f in logs]
    for part in range(PARTITIONS):
        assert content(rows(pipe.dest_kafka, to_topic, part)) == \
            content(rows(pipe.source_kafka, pipe.topic, part))



def test_a_second_writer_of_a_partition_fences_the_first_and_nothing_is_doubled(
        pipe: Pipeline, tmp_path: Path) -> None:
    """The same restore started twice: the second fences the first (exit 1, "took over"),
    reads its checkpoint after the fence and finishes; the topic holds every record once."""
    build_archive(pipe, 1200, per_segment=100, merge_upto=300)
    cfg = config(pipe, tmp_path)
    to_topic = unique_name("restored")
    # 600 records of ~20 bytes at 500 B/s: ~24 s, so the second starts while the first runs.
    cmd = restore_cmd(cfg, pipe, to_topic, "--partitions", "0", "--batch-size", "20",
                      "--rate", "500B/s")
    logs = [tmp_path / "first.out", tmp_path / "second.out"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(logs[0], "w") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True,
                                          env=cli_env()))

        def some_restored() -> bool:
            return to_topic in Admin(pipe.dest_kafka).list_topics() and \
                sum(1 for _ in read_partition(pipe.dest_kafka, to_topic, 0)) >= 100

        wait_for(some_restored, 120, "the first restore to commit some batches")
        assert procs[0].poll() is None, logs[0].read_text()
        with open(logs[1], "w") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True,
                                          env=cli_env()))
        for p in procs:
            p.wait(300)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)
    first, second = (f.read_text() for f in logs)
    assert procs[0].returncode == 1 and "took over" in first, first
    assert procs[1].returncode == 0, second
    assert "partition 0: resumed after offset" in second
    assert content(rows(pipe.dest_kafka, to_topic, 0)) == \
        content(rows(pipe.source_kafka, pipe.topic, 0))


DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS


def test_restored_month_old_records_survive_the_targets_retention(
        pipe: Pipeline, tmp_path: Path) -> None:
    """The source keeps 7 days; its month-old records live on in the archive. Restored into
    a new topic they stay there (created with retention.ms=-1, said on stdout); an existing
    topic with 7 days' retention, or LogAppendTime, is refused (exit 2, naming the setting,
    nothing produced) unless --accept-target-config."""
    month_ago = RECENT_MS - 30 * DAY_MS
    build_archive(pipe, 200, base_ts=month_ago,
                  source_config={"cleanup.policy": "delete", "retention.ms": "-1"})
    # The source as usually configured: its _topic.json says 7 days (egress copies it).
    meta_key = topic_meta_key("data", SOURCE_REGION, pipe.topic)
    meta = TopicMetadata.parse(pipe.store.get(meta_key), where=meta_key)
    pipe.store.put(meta_key, replace(meta, configs={**meta.configs,
                                                    "retention.ms": str(WEEK_MS)}).encode())
    cfg = config(pipe, tmp_path)
    admin = Admin(pipe.dest_kafka)

    to_topic = unique_name("restored")
    done = run(restore_cmd(cfg, pipe, to_topic))
    assert done.returncode == 0, done.stdout + done.stderr
    # Premise: this broker deletes month-old records of a 7-day topic within the test (it
    # checks retention every second): a control topic loses its record.
    control = unique_name("control")
    admin.create_topic(control, 1, {"retention.ms": str(WEEK_MS)})
    p = Producer(pipe.dest_kafka)
    p.produce(control, b"old", b"k", partition=0, timestamp=month_ago)
    assert p.flush(30) == 0
    wait_for(lambda: admin.log_start(control, 0, timeout=10).result(15) > 0, 60,
             "retention to delete the control topic's month-old record")
    for part in range(PARTITIONS):
        assert admin.log_start(to_topic, part, timeout=10).result(15) == 0
        assert content(rows(pipe.dest_kafka, to_topic, part)) == \
            content(rows(pipe.source_kafka, pipe.topic, part))
    assert f"retention.ms=-1 (the source has {WEEK_MS})" in done.stdout
    assert admin.topic_config(to_topic)["retention.ms"] == "-1"

    # Existing targets: checked before anything is produced.
    weekly = unique_name("restored")
    admin.create_topic(weekly, PARTITIONS, {"retention.ms": str(WEEK_MS)})
    stamped = unique_name("restored")
    admin.create_topic(stamped, PARTITIONS, {"retention.ms": "-1",
                                             "message.timestamp.type": "LogAppendTime"})
    for topic, setting in ((weekly, f"retention.ms={WEEK_MS}"),
                           (stamped, "message.timestamp.type=LogAppendTime")):
        refused = run(restore_cmd(cfg, pipe, topic))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"{topic} has {setting}" in refused.stderr
        assert "--accept-target-config" in refused.stderr
        assert f"nothing was produced into {topic}" in refused.stderr
        assert count(pipe.dest_kafka, topic) == 0
    accepted = run(restore_cmd(cfg, pipe, stamped, "--accept-target-config"))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "accepted (message.timestamp.type)" in accepted.stdout
    assert count(pipe.dest_kafka, stamped) == 200


def test_the_restore_command_logged_for_a_segment_late_after_its_loss_brings_it_back(
        pipe: Pipeline, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A range declared lost whose segment arrives later (S3 replication re-driven): the
    worker, reading the moto bucket, logs a command; that command, run as written (FILE
    being the config), restores exactly those records into a side topic.
    """
    import json
    import logging

    from tests.unit.test_ingress_worker import Harness, rec, write

    ref_key = functools.partial(SegmentKey, "data", SOURCE_REGION, pipe.topic, 0, 0)
    pipe.store.put(topic_meta_key("data", SOURCE_REGION, pipe.topic),
                   json.dumps({"partitions": 1}).encode())
    h = Harness(timeout="300ms", retries=1)
    h.store = pipe.store  # type: ignore[assignment]
    h.cfg = replace(h.cfg, source=h.cfg.source.model_copy(update={"topic": pipe.topic}),
                    ref=SegmentKey("data", SOURCE_REGION, pipe.topic, 0, 0, 0, 0)
                    .partition_ref)
    try:
        write(h.store, ref_key(0, 9))
        write(h.store, ref_key(20, 29))
        h.start()
        h.wait(lambda: h.offsets()[-1:] == [29], timeout=60)
        with caplog.at_level(logging.ERROR, logger="ingress.declared_lost"):
            write(h.store, ref_key(10, 19))
            assert h.worker is not None
            h.worker.offer(SegmentEvent("created", ref_key(10, 19)))
            h.wait(lambda: any(r.name == "ingress.declared_lost" for r in caplog.records))
    finally:
        h.stop()
    line = next(r.message for r in caplog.records if r.name == "ingress.declared_lost")
    side = line.split("or into a side topic: ", 1)[1].strip()
    cmd = side.split()
    assert cmd[:4] == ["replicator", "restore", "--config", "FILE"]
    cfg = config(pipe, tmp_path)
    exe = Path(sys.executable).parent / "replicator"
    done = run([str(exe), "restore", "--config", str(cfg), *cmd[4:],
                "--checkpoint-topic", pipe.checkpoint_topic])
    assert done.returncode == 0, done.stdout + done.stderr
    to_topic = cmd[cmd.index("--to-topic") + 1]
    got = list(rows(pipe.dest_kafka, to_topic, 0))
    assert [(r[1], r[2], r[4]) for r in got] == \
        [(rec(o).key, rec(o).value, rec(o).timestamp_ms) for o in range(10, 20)]


def test_a_target_with_a_small_max_message_bytes_gets_batches_that_fit(
        pipe: Pipeline, tmp_path: Path) -> None:
    """A target topic limited to 10 KB, restore batches of 1,000 records (~40 KB): the
    producer's batch.size is set below the target's limit (librdkafka fills batches up to
    batch.size, 1 MB, whatever the topic: the broker refused every one before)."""
    build_archive(pipe, 600, per_segment=300, merge_upto=300)
    cfg = config(pipe, tmp_path)
    to_topic = unique_name("restored")
    Admin(pipe.dest_kafka).create_topic(to_topic, PARTITIONS, {"max.message.bytes": "10000"})
    res = run(restore_cmd(cfg, pipe, to_topic, "--batch-size", "1000"))
    assert res.returncode == 0, res.stdout + res.stderr
    for part in range(PARTITIONS):
        assert content(rows(pipe.dest_kafka, to_topic, part)) == \
            content(rows(pipe.source_kafka, pipe.topic, part))
