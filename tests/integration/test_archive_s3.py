"""The archive as Iceberg tables on the moto server: pyiceberg's SQL catalog (SQLite), its S3
FileIO reading the segments where egress published them, DuckDB answering SQL. A table's
rows equal the records written, record for record, after segments land, after a
compaction run (inline merges, the controller's swap before deletes) and after deletes; a
query during the compaction sees every record once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compaction.controller import Compaction
from formats.records import Record
from replicator.archive.committer import ORPHAN_GRACE, ArchiveCommitter
from replicator.archive.query import run_query
from replicator.cli.main import main
from replicator.core.keys import SegmentKey
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import Settings, load_settings
from tests.unit.test_compaction_controller import clock
from tests.unit.test_compaction_helpers import make_records, write_segment

REGION = "r1"
ROWS = 'SELECT partition, "offset", timestamp, key, value, headers FROM t ORDER BY 1, 2'


def settings_for(endpoint: str, bucket: str, tmp: Path) -> dict[str, Any]:
    topic_cfg = {"min_segment_age": "1h", "min_segment_count": 2, "min_segment_size": 1,
                 "max_segment_count": 100, "max_segment_size": "1GiB"}
    return {
        "region": REGION,
        "s3": {"bucket": bucket, "endpoint_url": endpoint, "region": "us-east-1",
               "access_key_id": "test", "secret_access_key": "test"},
        "kafka": {"brokers": "127.0.0.1:1"},
        "metrics": {"port": 0},
        "compaction": {"spark_master": "inline", "replication_grace": "0s",
                       "topics": {"t": topic_cfg}},
        "catalog": {"enabled": True, "namespace": "lake", "table_name": "{topic}",
                    "snapshot_retention": "0s",
                    "properties": {"uri": f"sqlite:///{tmp}/catalog.db"}},
    }


@pytest.fixture
def env(moto_endpoint: str, bucket: str, s3_client: Any, tmp_path: Path
        ) -> tuple[Settings, S3ObjectStore, ArchiveCommitter]:
    settings = load_settings(data=settings_for(moto_endpoint, bucket, tmp_path), environ={})
    store = S3ObjectStore(s3_client, bucket)
    return settings, store, ArchiveCommitter(settings, store)


def seg(store: S3ObjectStore, partition: int, start: int, end: int, level: int = 0
        ) -> list[Record]:
    records = make_records(start, end)
    write_segment(store, SegmentKey("data", REGION, "t", partition, level, start, end), records)
    return records


def expected(by_partition: dict[int, list[Record]]) -> list[tuple[Any, ...]]:
    return [(p, r.offset, r.timestamp_ms, r.key, r.value,
             [{"key": k, "value": v} for k, v in r.headers])
            for p in sorted(by_partition) for r in by_partition[p]]


def rows(committer: ArchiveCommitter, sql: str = ROWS,
         snapshot_id: int | None = None) -> list[tuple[Any, ...]]:
    got = run_query(committer, sql, snapshot_id=snapshot_id).result.rows
    return [(p, o, int(ts.timestamp() * 1000), k, v, h) for p, o, ts, k, v, h in got]


def test_a_table_holds_every_record_once_through_compaction_and_deletes(
        env: tuple[Settings, S3ObjectStore, ArchiveCommitter]) -> None:
    settings, store, committer = env
    source = {0: seg(store, 0, 0, 99) + seg(store, 0, 100, 149) + seg(store, 0, 150, 199),
              1: seg(store, 1, 0, 49)}
    assert committer.sync(REGION, "t").added == 4
    assert rows(committer) == expected(source)

    # Partition and offset filters prune files: only the matching segment is read.
    answer = run_query(committer, 'SELECT count(*) FROM t WHERE partition = 0 AND '
                                  '"offset" >= 150')
    assert answer.result.rows == [(50,)]
    assert (answer.scans[0].files_read, answer.scans[0].files) == (1, 4)
    answer = run_query(committer, "SELECT count(*) FROM t WHERE timestamp < "
                                  "'2023-11-14 22:13:20.050'")   # epoch ms 1.7e12 + 50
    assert answer.result.rows == [(100,)]
    assert answer.scans[0].files_read == 2   # the first segment of each partition

    # Compaction: while the inputs are deleted, the table lists the output only: each
    # record once. With catalog.snapshot_retention = 0s the snapshots listing the inputs
    # are expired first, then the inputs deleted (Iceberg's order); the snapshot before the
    # swap lists the inputs only (read before the run).
    table = committer.table(REGION, "t", create=False)
    assert table is not None
    before = table.snapshot_id
    assert rows(committer, snapshot_id=before) == expected(source)
    during: list[list[tuple[Any, ...]]] = []
    expired: list[bool] = []   # the pre-swap snapshot, when an input is deleted
    real_delete = store.delete_many

    def delete_many(keys: Any) -> None:
        during.append(rows(committer))
        table.refresh()
        expired.append(before is not None and not table.has_snapshot(before))
        real_delete(keys)

    store.delete_many = delete_many  # type: ignore[method-assign]
    report = Compaction(settings, store=store, clock=clock,
                        archive_factory=lambda *_: committer).run_once()
    store.delete_many = real_delete  # type: ignore[method-assign]
    assert report.outcome == "success" and len(report.deleted) == 3, report
    assert during and all(d == expected(source) for d in during)
    assert expired and all(expired)
    assert rows(committer) == expected(source)
    table.refresh()
    assert sorted(table.files()) == [
        f"s3://{store.bucket}/data/r1/t/0/1/{0:020d}-{199:020d}",
        f"s3://{store.bucket}/data/r1/t/1/0/{0:020d}-{49:020d}"]
    assert len(table.snapshots()) == 1   # the snapshots listing deleted inputs expired

    # A segment deleted by a lifecycle rule leaves the table at the next step.
    store.delete(f"data/r1/t/1/0/{0:020d}-{49:020d}")
    assert committer.sync(REGION, "t").removed_gone == 1
    assert rows(committer) == expected({0: source[0]})

    # Metadata files of expired snapshots are deleted once older than the grace: what
    # stays is exactly what the table refers to, and it still reads.
    later = ArchiveCommitter(settings, store, clock=lambda: clock() + ORPHAN_GRACE)
    table.refresh()
    assert later.clean_metadata(table) > 0
    left = {f"s3://{store.bucket}/{o.key}" for o in store.list("iceberg/lake/t/metadata/")}
    assert left == table.metadata_in_use()
    assert rows(committer) == expected({0: source[0]})


def test_the_cli_lists_tables_and_answers_sql(
        moto_endpoint: str, bucket: str, s3_client: Any, tmp_path: Path) -> None:
    from replicator.devstack.toml_writer import to_toml

    store = S3ObjectStore(s3_client, bucket)
    seg(store, 0, 0, 9)
    seg(store, 1, 0, 4)
    config = tmp_path / "config.toml"
    config.write_text(to_toml(settings_for(moto_endpoint, bucket, tmp_path)))
    runner = CliRunner()
    result = runner.invoke(main, ["archive", "sync", "--config", str(config)])
    assert result.exit_code == 0, result.output
    again = runner.invoke(main, ["archive", "rebuild", "--config", str(config), "--topic", "t",
                                 "--drop", "--output", "json"])
    assert again.exit_code == 0 and '"added": 2' in again.output, again.output
    result = runner.invoke(main, ["archive", "tables", "--config", str(config)])
    assert "lake.t" in result.output and " 15 " in result.output, result.output
    result = runner.invoke(main, ["archive", "sql", "--config", str(config),
                                  "SELECT partition, count(*) AS n FROM t "
                                  "WHERE partition = 1 GROUP BY 1"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2].split() == ["1", "5"]
    # The two-part name (`archive tables`' query name) reads pyiceberg's scan the same way.
    result = runner.invoke(main, ["archive", "sql", "--config", str(config),
                                  "SELECT count(*) AS n FROM lake.t WHERE partition = 1"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2].split() == ["5"]
    assert "read 1 of" in result.output, result.output   # pruned by partition = 1
    result = runner.invoke(main, ["archive", "sql", "--config", str(config), "SELEC x"])
    assert result.exit_code == 1 and "syntax error" in result.output


def test_follow_commits_new_segments_each_interval_and_stops_on_sigterm(
        moto_endpoint: str, bucket: str, s3_client: Any, tmp_path: Path) -> None:
    from replicator.devstack.toml_writer import to_toml

    store = S3ObjectStore(s3_client, bucket)
    data = settings_for(moto_endpoint, bucket, tmp_path)
    data["catalog"]["commit_interval"] = "1s"
    config = tmp_path / "config.toml"
    config.write_text(to_toml(data))
    committer = ArchiveCommitter(load_settings(data=data, environ={}), store)
    seg(store, 0, 0, 9)
    exe = Path(sys.executable).parent / "replicator"
    proc = subprocess.Popen([str(exe), "archive", "follow", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        def files() -> int:
            table = committer.table(REGION, "t", create=False)
            return 0 if table is None else len(table.files())

        for want in (1, 2):
            deadline = time.monotonic() + 60   # a bound for a loaded machine, not a measure
            while files() < want:
                assert proc.poll() is None, proc.communicate()[1]
                if time.monotonic() > deadline:
                    pytest.fail(f"segment {want} not in the table after 60 s")
                time.sleep(0.2)
            if want == 1:
                seg(store, 0, 10, 19)   # lands while the follower runs
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "archive lease" in err and "taken" in err
        assert next(iter(store.list(f"data/{REGION}/_archive.lock")), None) is None  # released
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_cli_refuses_a_renamed_table_name_and_adopts_the_old_table(
        moto_endpoint: str, bucket: str, s3_client: Any, tmp_path: Path) -> None:
    from replicator.devstack.toml_writer import to_toml

    store = S3ObjectStore(s3_client, bucket)
    seg(store, 0, 0, 9)
    data = settings_for(moto_endpoint, bucket, tmp_path)
    config = tmp_path / "config.toml"
    config.write_text(to_toml(data))
    runner = CliRunner()
    assert runner.invoke(main, ["archive", "sync", "--config", str(config)]).exit_code == 0
    data["catalog"]["table_name"] = "{region}_{topic}"
    config.write_text(to_toml(data))
    refused = runner.invoke(main, ["archive", "sync", "--config", str(config)])
    assert refused.exit_code == 2, refused.output
    assert "table lake.t is stamped" in refused.output and "now lake.r1_t" in refused.output
    adopted = runner.invoke(main, ["archive", "rebuild", "--config", str(config), "--topic",
                                   "t", "--adopt", "lake.t"])
    assert adopted.exit_code == 0, adopted.output
    again = runner.invoke(main, ["archive", "sync", "--config", str(config)])
    assert again.exit_code == 0, again.output
    other = runner.invoke(main, ["archive", "rebuild", "--config", str(config), "--topic",
                                 "u", "--adopt", "lake.r1_t"])
    assert other.exit_code == 2 and "not a table of" in other.output, other.output
