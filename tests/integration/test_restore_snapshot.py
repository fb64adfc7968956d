"""``replicator restore --snapshot`` on Apache Kafka and the moto server: a snapshot of the
topic's Iceberg table (pyiceberg's SQL catalog on SQLite) is a restore point. Segments are
written, the table synced (snapshot A), more segments written and synced (snapshot B): a
restore of A produces exactly A's records; once a segment A lists is deleted (lifecycle),
restoring A is refused with exit 2 and nothing is produced, unless --allow-gaps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from formats.records import Record
from replicator.archive.committer import ArchiveCommitter
from replicator.cli.main import main
from replicator.core.kafka import Admin
from replicator.core.keys import SegmentKey
from replicator.core.settings import load_settings
from replicator.devstack.toml_writer import write_toml
from tests.conftest import unique_name
from tests.integration.pipeline import CREDS, SOURCE_REGION, Pipeline
from tests.integration.test_restore import restore_cmd, rows
from tests.unit.test_archive_committer import swap_of
from tests.unit.test_compaction_helpers import make_records, write_segment

pytestmark = pytest.mark.apache


def config_doc(pipe: Pipeline, tmp_path: Path, *, catalog: bool = True) -> dict[str, Any]:
    return {
        "region": "us-west-1",
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, **CREDS},
        "kafka": {"brokers": pipe.dest_brokers},
        "catalog": {"enabled": catalog, "namespace": "lake", "table_name": "{topic}",
                    "properties": {"uri": f"sqlite:///{tmp_path}/catalog.db"}},
    }


def segment(pipe: Pipeline, partition: int, start: int, end: int) -> tuple[SegmentKey,
                                                                           list[Record]]:
    key = SegmentKey("data", SOURCE_REGION, pipe.topic, partition, 0, start, end)
    records = make_records(start, end)
    write_segment(pipe.store, key, records)
    return key, records


def cli(cmd: list[str]) -> Result:
    """``cmd`` (a ``replicator`` command line) run in this process (no interpreter start)."""
    return CliRunner().invoke(main, cmd[1:])


def content(records: list[Record]) -> list[tuple[object, ...]]:
    return [(r.key, r.value, [(k, v) for k, v in r.headers], r.timestamp_ms) for r in records]


def test_restore_a_snapshot_then_refuse_it_once_its_files_are_deleted(
        pipe: Pipeline, tmp_path: Path) -> None:
    doc = config_doc(pipe, tmp_path)
    cfg = tmp_path / "restore.toml"
    write_toml(cfg, doc)
    committer = ArchiveCommitter(load_settings(data=doc, environ={}), pipe.store)
    first, a0 = segment(pipe, 0, 0, 49)
    _, a1 = segment(pipe, 0, 50, 79)
    _, b0 = segment(pipe, 1, 0, 29)
    snap_a = committer.sync(SOURCE_REGION, pipe.topic).snapshot_id
    _, later = segment(pipe, 0, 80, 99)          # egress went on: snapshot B lists it too
    snap_b = committer.sync(SOURCE_REGION, pipe.topic).snapshot_id
    assert snap_a is not None and snap_b is not None and snap_a != snap_b

    to_topic = unique_name("restored")
    dry = cli(restore_cmd(cfg, pipe, to_topic, "--snapshot", str(snap_a), "--dry-run"))
    assert dry.exit_code == 0, dry.output
    assert f"snapshot {snap_a}: 3 of its segment(s) in the range, 0 no longer" in dry.stdout
    done = cli(restore_cmd(cfg, pipe, to_topic, "--snapshot", str(snap_a)))
    assert done.exit_code == 0, done.output
    got = {p: [r[1:] for r in rows(pipe.dest_kafka, to_topic, p)] for p in (0, 1)}
    assert got == {0: content(a0 + a1), 1: content(b0)}   # not 80-99: B's, not A's

    # Lifecycle deletes A's first segment: A can no longer be restored whole.
    pipe.store.delete(first.to_key())
    gone_topic = unique_name("restored")
    for args in (["--dry-run"], []):
        out = cli(restore_cmd(cfg, pipe, gone_topic, "--snapshot", str(snap_a), *args))
        assert out.exit_code == 2, out.output
        assert f"snapshot {snap_a} lists 1 segment(s) no longer in the bucket: " \
               f"{first}" in out.stderr
        assert "older than the objects kept" in out.stderr
    assert gone_topic not in Admin(pipe.dest_kafka).list_topics()   # nothing produced
    # --allow-gaps restores the rest, the deleted positions skipped (logged); with a
    # --partitions filter, only partition 0.
    out = cli(restore_cmd(cfg, pipe, gone_topic, "--snapshot", str(snap_a), "--allow-gaps",
                          "--partitions", "0"))
    assert out.exit_code == 0, out.output
    assert [r[1:] for r in rows(pipe.dest_kafka, gone_topic, 0)] == content(a1)

    # An unknown snapshot, and [catalog] off: exit 2 naming why.
    out = cli(restore_cmd(cfg, pipe, gone_topic, "--snapshot", "12345"))
    assert out.exit_code == 2 and "keeps no snapshot 12345" in out.stderr, out.output
    off = tmp_path / "off.toml"
    write_toml(off, config_doc(pipe, tmp_path, catalog=False))
    out = cli(restore_cmd(off, pipe, gone_topic, "--snapshot", str(snap_a)))
    assert out.exit_code == 2 and "catalog.enabled" in out.stderr, out.output
    assert later  # B's segment existed throughout, never read for A


def test_restore_a_snapshot_whose_trimmed_copy_outlived_its_segment(
        pipe: Pipeline, tmp_path: Path) -> None:
    """A range egress published twice is listed as a trimmed copy (in the warehouse on
    moto); compaction swaps both segments out: the one listed whole is held for
    catalog.snapshot_retention with the snapshot, the trimmed one (listed by no snapshot)
    is deleted at once. Restoring the snapshot reads the copy itself: every record once."""
    doc = config_doc(pipe, tmp_path)
    doc["catalog"]["snapshot_retention"] = "1h"
    doc["catalog"]["regions"] = [SOURCE_REGION]   # compaction's hook swaps only these
    cfg = tmp_path / "restore.toml"
    write_toml(cfg, doc)
    committer = ArchiveCommitter(load_settings(data=doc, environ={}), pipe.store)
    whole, r0 = segment(pipe, 0, 0, 49)
    trimmed, r1 = segment(pipe, 0, 30, 79)     # listed as a copy of 50-79
    snap = committer.sync(SOURCE_REGION, pipe.topic).snapshot_id
    assert snap is not None
    out = SegmentKey("data", SOURCE_REGION, pipe.topic, 0, 1, 0, 79)
    write_segment(pipe.store, out, make_records(0, 79))
    swap = swap_of(committer, SOURCE_REGION, pipe.topic, [whole, trimmed])
    allowed = committer.deletable(SOURCE_REGION, pipe.topic, swap)
    assert allowed == {trimmed.to_key()}
    pipe.store.delete_many(sorted(allowed))
    committer.after_delete(SOURCE_REGION, pipe.topic, swap)

    to_topic = unique_name("restored")
    dry = cli(restore_cmd(cfg, pipe, to_topic, "--snapshot", str(snap), "--dry-run"))
    assert dry.exit_code == 0, dry.output
    assert "00000000000000000050-00000000000000000079" in dry.stdout
    done = cli(restore_cmd(cfg, pipe, to_topic, "--snapshot", str(snap)))
    assert done.exit_code == 0, done.output
    assert [r[1:] for r in rows(pipe.dest_kafka, to_topic, 0)] == content(
        r0 + [r for r in r1 if r.offset >= 50])
    assert trimmed.to_key() not in {o.key for o in pipe.store.list("data/")}
