"""``catalog.snapshot_retention`` against snapshot expiry: the snapshot before a compaction
swap stays readable for the retention (time travel, ``archive sql --snapshot``, ``restore
--snapshot``) whatever else the table's steps do: however many add-only steps follow
(``KEEP_SNAPSHOTS`` counts only beyond the retention), a step removing a file it does
not list; and snapshots off the main lineage (a rolled-back engine write, a branch head)
never list a deleted segment. A real pyiceberg SQL catalog
(SQLite) over a MemoryObjectStore, as tests/unit/test_archive_held_gone.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from replicator.archive import snapshot_history
from replicator.archive.committer import ArchiveCommitter
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_held_gone import Clock, committer, kept_files_exist, swapped
from tests.unit.test_archive_overlaps import put, table_rows


def test_a_busy_table_keeps_the_pre_swap_snapshot_for_the_retention(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More add-only steps after a swap than ``KEEP_SNAPSHOTS`` (100 are 50 minutes at the
    default 30 s interval, retention 1 h): the pre-swap snapshot stays; past the retention
    the count cap applies again."""
    monkeypatch.setattr(snapshot_history, "KEEP_SNAPSHOTS", 3)
    store = MemoryObjectStore("b")
    clock = Clock()
    c = committer(tmp_path, store, clock)   # retention 10 h
    a, b, _, before = swapped(store, c)
    for i in range(6):   # another partition's new segments, one step each
        put(store, 1, 0, 10 * i, 10 * i + 9)
        c.sync("r1", "t")
    table = c.table("r1", "t", create=False)
    assert table is not None
    table.refresh()
    assert table.has_snapshot(before)   # was: expired by the count cap after 3 steps
    assert {a, b} <= {c.key_of(p) for p in table.files(before)}
    assert table_rows(store, c, before)   # readable
    kept_files_exist(store, c)
    clock.now += timedelta(hours=11)      # past the retention: the cap applies again
    put(store, 1, 0, 100, 109)
    assert c.sync("r1", "t").expired > 0
    table.refresh()
    assert not table.has_snapshot(before)
    assert len(table.snapshots()) == 3
    kept_files_exist(store, c)


def test_a_lifecycle_delete_elsewhere_keeps_the_pre_swap_snapshot(tmp_path: Path) -> None:
    """After a swap, a segment committed later leaves the bucket (a lifecycle rule, an
    operator): the step removing it expires the snapshots that list it, not every older
    one: the pre-swap snapshot (which does not list it) stays for the retention. One the
    pre-swap snapshot lists going takes it (no kept snapshot lists a missing object)."""
    store = MemoryObjectStore("b")
    c = committer(tmp_path, store)
    a, b, c_, before = swapped(store, c)
    x = put(store, 1, 0, 0, 9)
    c.sync("r1", "t")
    put(store, 1, 0, 10, 19)
    c.sync("r1", "t")
    table = c.table("r1", "t", create=False)
    assert table is not None
    listing_x = table.snapshot_id
    store.delete(x.to_key())
    result = c.sync("r1", "t")
    assert result.removed_gone == 1 and result.expired >= 2
    table.refresh()
    assert table.has_snapshot(before)        # was: expired with every ancestor
    assert listing_x is not None and not table.has_snapshot(listing_x)
    assert {a, b} <= {c.key_of(p) for p in table.files(before)}
    kept_files_exist(store, c)
    store.delete(c_.to_key())   # listed by the pre-swap snapshot too
    assert c.sync("r1", "t").removed_gone == 1
    table.refresh()
    assert not table.has_snapshot(before)
    kept_files_exist(store, c)


def _engine_row(table: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist([{"partition": 0, "offset": 999, "timestamp": None,
                                  "timestamp_type": 0, "key": None, "value": b"x",
                                  "headers": []}], schema=table.schema().as_arrow())


@pytest.mark.parametrize("how", ["rollback", "branch"])
def test_snapshots_off_the_main_lineage_never_list_deleted_segments(
        tmp_path: Path, how: str) -> None:
    """Another engine's snapshot off the main lineage: the documented repair of a foreign
    write (roll back to the replicator's snapshot) leaves it behind; a write-audit-publish
    branch keeps its head. Compaction's deletes expire it too (every kept snapshot
    counts, not only the current lineage)."""
    from compaction.controller import Compaction
    from replicator.archive.ownership import ForeignWrites
    from tests.unit.test_archive_committer import catalog_settings

    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, snapshot_retention="0s")
    c = ArchiveCommitter(settings, store)
    inputs = [put(store, 0, 0, s, s + 9) for s in (0, 10, 20)]
    c.sync("r1", "t")
    table = c.table("r1", "t", create=False)
    assert table is not None
    mine = table.snapshot_id
    assert mine is not None
    engine = table._table
    if how == "branch":
        engine.manage_snapshots().create_branch(mine, "audit").commit()
        engine.append(_engine_row(engine), branch="audit")
        foreign = engine.metadata.refs["audit"].snapshot_id
        # A branch write is a foreign write: the steps stop, compaction keeps the inputs
        # (was: steps went on, the branch head kept listing the deleted inputs).
        with pytest.raises(ForeignWrites):
            c.sync("r1", "t")
        later = datetime.now(UTC) + timedelta(hours=2)
        Compaction(settings.model_copy(), store=store, clock=lambda: later,
                   archive_factory=lambda *_: c).run_once()
        kept_files_exist(store, c)
        assert {k.to_key() for k in inputs} <= set(store.keys())
        engine.manage_snapshots().remove_branch("audit").commit()   # the repair
    else:
        engine.append(_engine_row(engine))
        current = engine.metadata.current_snapshot_id
        assert current is not None
        foreign = current
        with pytest.raises(ForeignWrites):
            c.sync("r1", "t")
        engine.manage_snapshots().rollback_to_snapshot(mine).commit()
    c.sync("r1", "t")
    later = datetime.now(UTC) + timedelta(hours=2)
    report = Compaction(settings.model_copy(), store=store, clock=lambda: later,
                        archive_factory=lambda *_: c).run_once()
    assert report.outcome == "success" and report.deleted, report
    table.refresh()
    assert not table.has_snapshot(foreign)   # was: kept, listing the deleted inputs
    kept_files_exist(store, c)


def test_what_each_snapshot_lists_is_read_once_per_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expiry and compaction's hold look at every kept snapshot: each manifest is read once
    (manifests never change), not a scan planned per snapshot at every call (~100 plans
    per topic per compaction run on a busy table); expired snapshots are forgotten."""
    from pyiceberg.manifest import ManifestFile

    from replicator.archive import iceberg_listing

    monkeypatch.setattr(iceberg_listing, "PRUNE_EVERY", 1)
    store = MemoryObjectStore("b")
    c = committer(tmp_path, store)
    a, b, _, before = swapped(store, c)
    for i in range(4):
        put(store, 1, 0, 10 * i, 10 * i + 9)
        c.sync("r1", "t")
    table = c.table("r1", "t", create=False)
    assert table is not None
    reads = [0]
    fetch = ManifestFile.fetch_manifest_entry

    def counted(self: ManifestFile, *args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return fetch(self, *args, **kwargs)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    paths = [c.url(a), c.url(b), "s3://b/nothing-lists-it"]
    first = table.removals(paths)
    assert {sid for sid, _ in first.values()} == {before}
    assert reads[0] == 0   # read by the steps already; was: a scan planned per snapshot
    assert table.listing(paths) == [before]
    assert reads[0] == 0
    kept = {s.snapshot_id for s in table.snapshots()}
    uuid = str(table._table.metadata.table_uuid)
    mine = {sid for u, sid in iceberg_listing._snapshots if u == uuid}
    assert before in mine and mine <= kept   # expired ones forgotten
