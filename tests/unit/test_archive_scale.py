"""What keeps archive tables cheap as they grow: manifests merged as add-only commits pile
up, and a query loading only the tables it names. SQLite catalog over a MemoryObjectStore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import IcebergTable
from replicator.archive.query import run_query
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_compaction_controller import k
from tests.unit.test_compaction_helpers import make_records, write_segment


def test_manifests_are_merged_as_add_only_commits_pile_up(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    for i in range(40):
        write_segment(store, k(0, 10 * i, 10 * i + 9, i % 4), make_records(10 * i, 10 * i + 9))
        committer.sync("r1", "t")
    table = committer.table("r1", "t", create=False)
    assert table is not None and len(table.files()) == 40
    snap = table._table.current_snapshot()
    assert snap is not None
    assert len(snap.manifests(table._table.io)) <= 16   # was: 40, one per commit
    assert table.properties["commit.manifest-merge.enabled"] == "true"


def test_a_query_loads_only_the_tables_it_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, table_name="{topic}",
                                topics=[f"t{i}" for i in range(6)])
    committer = ArchiveCommitter(settings, store)
    for i in range(6):
        write_segment(store, k(0, 0, 9, topic=f"t{i}"), make_records(0, 9))
    committer.sync_all()
    loads: list[tuple[str, ...]] = []
    real_load = committer.catalog.load

    def load(identifier: tuple[str, ...]) -> Any:
        loads.append(identifier)
        return real_load(identifier)

    monkeypatch.setattr(committer.catalog, "load", load)
    rows = pa.table({"offset": pa.array(range(10), pa.int64())})
    monkeypatch.setattr(IcebergTable, "reader", lambda *_: pa.RecordBatchReader.from_batches(
        rows.schema, rows.to_batches()))
    monkeypatch.setattr(IcebergTable, "planned_files", lambda *_: [])
    assert run_query(committer, "SELECT count(*) FROM t3").result.rows == [(10,)]
    assert loads == [("replicator", "t3")]   # was: every table of the bucket


def test_the_table_lag_is_the_wait_of_the_oldest_segment_a_step_added(
        tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    now = [datetime.now(UTC) + timedelta(minutes=10)]
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store, clock=lambda: now[0])
    write_segment(store, k(0, 0, 9), make_records(0, 9))
    write_segment(store, k(0, 10, 19), make_records(10, 19))
    committer.sync("r1", "t")
    labels = {"region": "r1", "topic": "t"}
    lag = committer.metrics.value("replicator_archive_table_lag_seconds", labels)
    assert lag is not None and 590 <= lag <= 700
    committer.sync("r1", "t")   # nothing waiting
    assert committer.metrics.value("replicator_archive_table_lag_seconds", labels) == 0


def test_a_merge_leaves_a_full_manifest_as_it_is(tmp_path: Path) -> None:
    """Manifests are merged up to 1 MiB (``commit.manifest.target-size-bytes``): once a
    manifest is that large, later merges leave it alone instead of rewriting every file of
    the table (the whole table's manifest at pyiceberg's 8 MB default: 3 s per merge at two
    weeks of 30 s segments).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from replicator.archive.iceberg import NewFile

    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    probe = k(0, 0, 9)
    write_segment(store, probe, make_records(0, 9))
    footer = pq.ParquetFile(pa.BufferReader(store.get(probe.to_key()))).metadata
    table = committer.table("r1", "t")
    assert table is not None
    assert table.properties["commit.manifest.target-size-bytes"] == str(2**20)
    # One commit of 8,000 files: a manifest over 1 MiB.
    table.commit([NewFile(committer.url(k(0, 10 * i, 10 * i + 9)), 1000, 0, footer)
                  for i in range(1, 8001)], summary={"replicator.reason": "sync"})
    io = table._table.io
    snap = table._table.current_snapshot()
    assert snap is not None
    [big] = snap.manifests(io)
    assert big.manifest_length > 2**20
    for i in range(8001, 8041):
        table.commit([NewFile(committer.url(k(0, 10 * i, 10 * i + 9)), 1000, 0, footer)],
                     summary={"replicator.reason": "sync"})
    snap = table._table.current_snapshot()
    assert snap is not None
    manifests = [m.manifest_path for m in snap.manifests(io)]
    assert big.manifest_path in manifests and len(manifests) <= 16
