"""Snapshot expiry of the archive tables: no snapshot a table keeps lists a deleted
segment, whatever stopped a compaction run between its swap and its deletes, and whatever
tags or branches another engine put on the table. pyiceberg's SQL catalog (SQLite) over a
MemoryObjectStore; each test fails without its guard.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from compaction.controller import Compaction
from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import IcebergTable
from replicator.core.errors import StorageError
from replicator.core.settings import Settings
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings, swap_of
from tests.unit.test_compaction_controller import clock, k
from tests.unit.test_compaction_helpers import compaction_settings, make_records, write_segment


class Killed(BaseException):
    """Stands for kill -9 or an OOM of the compaction driver."""


def put(store: MemoryObjectStore, start: int, end: int, topic: str = "t",
        partition: int = 0) -> None:
    write_segment(store, k(0, start, end, partition, topic=topic), make_records(start, end))


def dangling(committer: ArchiveCommitter, store: MemoryObjectStore,
             table: IcebergTable) -> list[tuple[int, str]]:
    """(snapshot, path) of every kept snapshot's file that is not in the bucket."""
    table.refresh()
    keys = set(store.keys())
    return [(s.snapshot_id, p) for s in table.snapshots()
            for p in table.files(s.snapshot_id) if p.removeprefix("s3://b/") not in keys]


def table_of(committer: ArchiveCommitter, topic: str = "t") -> IcebergTable:
    table = committer.table("r1", topic, create=False)
    assert table is not None
    return table


def two_segments_committed(tmp_path: Path, retention: str = "0s"
                           ) -> tuple[MemoryObjectStore, Settings, ArchiveCommitter]:
    """A bucket holding offsets 0-9 and 10-19 of topic t, and a committer whose table
    lists both."""
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, snapshot_retention=retention)
    committer = ArchiveCommitter(settings, store)
    put(store, 0, 9)
    put(store, 10, 19)
    committer.sync("r1", "t")
    return store, settings, committer


def run(settings: Settings, store: MemoryObjectStore, committer: ArchiveCommitter) -> Any:
    return Compaction(settings, store=store, clock=clock,
                      archive_factory=lambda *_: committer).run_once()


def test_a_run_killed_between_swap_and_delete_leaves_no_snapshot_listing_deleted_segments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, settings, committer = two_segments_committed(tmp_path)
    put(store, 20, 29)
    committer.sync("r1", "t")

    def die(keys: Any) -> None:
        raise Killed

    monkeypatch.setattr(store, "delete_many", die)
    with pytest.raises(Killed):
        run(settings, store, committer)
    monkeypatch.undo()
    committer.sync("r1", "t")   # the follower: nothing to do
    report = run(settings, store, committer)
    assert len(report.deleted) == 3
    for _ in range(2):
        committer.sync("r1", "t")
    table = table_of(committer)
    assert dangling(committer, store, table) == []   # was: 3 snapshots listing them
    assert [p.removeprefix("s3://b/") for p in table.files()] == [k(1, 0, 29).to_key()]


def test_a_failed_delete_of_one_topic_still_expires_the_others(tmp_path: Path) -> None:
    topic_cfg = {"min_segment_age": "1h", "min_segment_count": 2, "min_segment_size": 1,
                 "max_segment_count": 100, "max_segment_size": "1GiB"}
    base = compaction_settings(topics={"t": topic_cfg, "u": topic_cfg})
    catalog = catalog_settings(tmp_path, snapshot_retention="0s").catalog
    settings = base.model_copy(update={"catalog": catalog})
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(settings, store)
    for topic in ("t", "u"):
        put(store, 0, 9, topic)
        put(store, 10, 19, topic)
        committer.sync("r1", topic)
    real_delete = store.delete_many

    def flaky_delete(keys: Any) -> None:
        keys = list(keys)
        if any("/u/" in x for x in keys):
            raise StorageError("delete_many: InternalError (500)")
        real_delete(keys)

    store.delete_many = flaky_delete  # type: ignore[method-assign]
    report = run(settings, store, committer)
    store.delete_many = real_delete  # type: ignore[method-assign]
    assert report.outcome != "success"
    assert next(iter(store.list(k(0, 0, 9, topic="t").to_key())), None) is None   # deleted
    assert dangling(committer, store, table_of(committer, "t")) == []
    assert dangling(committer, store, table_of(committer, "u")) == []


def test_a_tag_neither_blocks_expiry_nor_fails_later_steps(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, settings, committer = two_segments_committed(tmp_path)
    table = table_of(committer)
    tagged = table.snapshot_id
    assert tagged is not None
    # Another engine's restore point (ALTER TABLE ... CREATE TAG) and a branch.
    table._table.manage_snapshots().create_tag(tagged, "audit").commit()
    table._table.manage_snapshots().create_branch(tagged, "etl").commit()
    with caplog.at_level(logging.WARNING):
        report = run(settings, store, committer)
    assert report.outcome == "success" and len(report.deleted) == 2
    assert dangling(committer, store, table) == []
    assert "tag audit points at snapshot" in caplog.text
    assert set(table._table.metadata.refs) == {"main"}
    # A lifecycle delete later: the step commits and expires, it does not raise.
    put(store, 100, 109, partition=1)
    committer.sync("r1", "t")
    store.delete(k(0, 100, 109, 1).to_key())
    assert committer.sync("r1", "t").removed_gone == 1
    assert dangling(committer, store, table) == []


def test_swaps_commit_replace_removals_delete_and_new_segments_append(
        tmp_path: Path) -> None:
    """Spark's Iceberg streaming source reads `append`, skips `replace` (and `delete` with
    streaming-skip-delete-snapshots) and fails on `overwrite`."""
    store, _, committer = two_segments_committed(tmp_path)
    table = table_of(committer)
    first = table.snapshot_id
    # A compaction output and a new segment landed; one segment of partition 1 went.
    put(store, 100, 109, partition=1)
    committer.sync("r1", "t")
    write_segment(store, k(1, 0, 19), make_records(0, 19))
    put(store, 20, 29)
    store.delete(k(0, 100, 109, 1).to_key())
    r = swap_of(committer, "r1", "t", [k(0, 0, 9), k(0, 10, 19)])
    assert (r.added, r.removed_covered, r.removed_gone) == (2, 2, 1)
    table.refresh()
    snaps = {s.snapshot_id: s for s in table.snapshots()}
    lineage = [table.snapshot_id, *table.ancestors(table.snapshot_id or 0)]
    ops = [snaps[i].operation for i in reversed(lineage) if i in snaps]
    assert ops[-3:] == ["append", "replace", "delete"] and "overwrite" not in ops
    assert first in snaps
    replace = next(s for s in snaps.values() if s.operation == "replace")
    assert table.files(replace.snapshot_id).keys() >= {f"s3://b/{k(1, 0, 19)}",
                                                        f"s3://b/{k(0, 20, 29)}"}
    assert sorted(table.files()) == sorted(
        f"s3://b/{x}" for x in (k(1, 0, 19), k(0, 20, 29)))


# --- other engines ------------------------------------------------------------------------

def test_tables_keep_gc_disabled_and_a_foreign_write_stops_the_steps(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from replicator.archive.iceberg import NewFile
    from replicator.archive.ownership import ForeignWrites

    store, _, committer = two_segments_committed(tmp_path)
    table = table_of(committer)
    assert table.properties["gc.enabled"] == "false"
    table.set_properties({"gc.enabled": "true"})   # an engine's ALTER TABLE
    committer.sync("r1", "t")
    assert table_of(committer).properties["gc.enabled"] == "false"
    # An engine's row-level DELETE (copy-on-write): a rewritten file replaces a segment.
    seg_path = f"s3://b/{k(0, 0, 9)}"
    table.refresh()
    from replicator.archive.footers import read_parquet_footer

    key = k(0, 0, 9).to_key()
    footer = read_parquet_footer(store, key, len(store.get(key)))
    assert footer is not None
    rewritten = NewFile(f"{table.location}/data/00000-rewritten.parquet", 100, 0, footer)
    table.commit(replace=([rewritten], [seg_path]), summary={"engine": "spark"})
    before = sorted(table.files())
    with pytest.raises(ForeignWrites, match="another engine"):
        committer.sync("r1", "t")   # was: the segment added back, its rows listed twice
    with caplog.at_level(logging.ERROR):
        assert committer.sync_all() == []
    assert caplog.text.count("read-only to other engines") == 1
    table.refresh()
    assert sorted(table.files()) == before
    assert committer.metrics.value("replicator_archive_refused_steps_total",
                                   {"region": "r1", "topic": "t",
                                    "reason": "foreign-write"}) == 2
    # Compaction keeps the inputs of a table it cannot swap.
    report = run(catalog_settings(tmp_path, snapshot_retention="0s"), store, committer)
    assert report.deleted == [] and any("swap failed" in e for e in report.errors)
    # The operator rebuilds the table from the bucket (the output now hides its inputs).
    assert committer.rebuild("r1", "t", drop=True).added == 1
    assert sorted(table_of(committer).files()) == [f"s3://b/{k(1, 0, 19)}"]
    assert not committer.sync("r1", "t").committed


def test_an_engines_delete_of_a_segment_is_not_undone(tmp_path: Path) -> None:
    from replicator.archive.ownership import ForeignWrites

    _, _, committer = two_segments_committed(tmp_path)
    table = table_of(committer)
    table.commit(remove=[f"s3://b/{k(0, 0, 9)}"], summary={})   # DELETE WHERE offset < 10
    with pytest.raises(ForeignWrites):
        committer.sync("r1", "t")
    table.refresh()
    assert sorted(table.files()) == [f"s3://b/{k(0, 10, 19)}"]


# --- snapshot retention ---------------------------------------------------------------------

def test_swapped_out_inputs_stay_readable_for_the_snapshot_retention(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from replicator.archive.restore_snapshot import snapshot_segments

    now = [datetime.now(UTC)]
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, snapshot_retention="1h")
    committer = ArchiveCommitter(settings, store, clock=lambda: now[0])
    for s in (0, 10, 20):
        put(store, s, s + 9)
    committer.sync("r1", "t")
    table = table_of(committer)
    before = table.snapshot_id
    assert before is not None
    report = run(settings, store, committer)
    assert report.outcome == "success" and report.deleted == []   # was: deleted at once
    table.refresh()
    assert sorted(table.files()) == [f"s3://b/{k(1, 0, 29)}"]
    # A reader of the snapshot before the swap (a query planned then, time travel,
    # restore --snapshot) finds every file it lists.
    assert dangling(committer, store, table) == []
    assert snapshot_segments(settings, store, "r1", "t", before) == {
        k(0, 0, 9), k(0, 10, 19), k(0, 20, 29)}
    committer.sync("r1", "t")
    assert table.has_snapshot(before)
    # Past the retention the next run expires those snapshots, then deletes the inputs.
    now[0] += timedelta(hours=2)
    report = run(settings, store, committer)
    assert sorted(report.deleted) == [k(0, s, s + 9).to_key() for s in (0, 10, 20)]
    table.refresh()
    assert not table.has_snapshot(before)
    assert dangling(committer, store, table) == []


def test_segments_held_for_the_retention_keep_their_snapshots_when_others_are_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run deletes the inputs of a swap older than the retention (covered leftovers)
    and holds a fresh swap's: the fresh swap's pre-swap snapshot stays."""
    import time

    real_time = time.time
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, snapshot_retention="1h")
    from datetime import UTC, datetime

    committer = ArchiveCommitter(settings, store,
                                 clock=lambda: datetime.fromtimestamp(time.time(), UTC))
    with monkeypatch.context() as m:   # two hours ago (snapshot times come from time.time)
        m.setattr(time, "time", lambda: real_time() - 7200)
        put(store, 0, 9)
        put(store, 10, 19)
        committer.sync("r1", "t")
        assert run(settings, store, committer).deleted == []   # partition 0 swapped, held
    put(store, 0, 9, partition=1)
    put(store, 10, 19, partition=1)
    committer.sync("r1", "t")
    table = table_of(committer)
    fresh = table.snapshot_id                  # lists partition 1's inputs
    report = run(settings, store, committer)   # deletes partition 0's, holds partition 1's
    assert sorted(report.deleted) == [k(0, 0, 9).to_key(), k(0, 10, 19).to_key()]
    table.refresh()
    assert fresh is not None and table.has_snapshot(fresh)   # was: expired by after_delete
    assert dangling(committer, store, table) == []


def test_a_replicated_output_expires_at_once_since_its_inputs_vanish_unseen(
        tmp_path: Path) -> None:
    """The replica bucket: the other region's compaction output arrives, then the deletes of
    its inputs (S3 replication of delete markers, `replicator sync`); no step of this table
    sees them go, so the step that swaps the output in expires the older snapshots."""
    store, _, committer = two_segments_committed(tmp_path, "1h")
    write_segment(store, k(1, 0, 19), make_records(0, 19))
    assert committer.sync("r1", "t").removed_covered == 2
    store.delete_many([k(0, 0, 9).to_key(), k(0, 10, 19).to_key()])
    assert not committer.sync("r1", "t").committed
    assert dangling(committer, store, table_of(committer)) == []
