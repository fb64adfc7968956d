"""Which segments ``replicator restore --snapshot`` reads
(``replicator/archive/restore_snapshot.py``): a snapshot's data files as segment keys,
against a real pyiceberg SQL catalog (SQLite) over a MemoryObjectStore; an unknown
snapshot, no table, and ``[catalog]`` off are refusals; a trimmed copy whose segment is gone
is read itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from formats.records import batch_to_records
from formats.segment_io import open_segment
from replicator.archive.committer import ArchiveCommitter
from replicator.archive.restore_snapshot import SnapshotUnknown, snapshot_read, snapshot_segments
from replicator.core.errors import ConfigError, ObjectNotFound
from replicator.core.storage import MemoryObjectStore
from replicator.ops.restore import make_plan
from replicator.ops.restore_plan import RestoreRange
from replicator.ops.restore_request import RestoreRequest
from tests.unit.test_archive_committer import catalog_settings, swap_of
from tests.unit.test_compaction_controller import k, seed


def test_a_snapshot_lists_the_segments_it_had_and_plans_only_those(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    committer = ArchiveCommitter(settings, store)
    seed(store, [(0, 9), (10, 19)])
    snap_a = committer.sync("r1", "t").snapshot_id
    seed(store, [(20, 29)])
    snap_b = committer.sync("r1", "t").snapshot_id
    assert snap_a is not None and snap_b is not None
    a = snapshot_segments(settings, store, "r1", "t", snap_a)
    assert a == {k(0, 0, 9), k(0, 10, 19)}
    assert snapshot_segments(settings, store, "r1", "t", snap_b) == a | {k(0, 20, 29)}

    # A lifecycle delete of one of A's segments: the plan names it missing.
    store.delete(k(0, 0, 9).to_key())
    req = RestoreRequest("r1", "t", "t.restored", "cp", RestoreRange(), snapshot=snap_a)
    p = make_plan(store, settings.s3.prefix, req, listed=a)
    assert p.missing == (k(0, 0, 9),) and [s.segment.key for s in p.steps] == [k(0, 10, 19)]
    assert p.snapshot_refusals() and p.gaps == [(0, 0, 9)]


def test_an_unknown_snapshot_no_table_and_catalog_off_are_refused(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    with pytest.raises(SnapshotUnknown, match="has no archive table"):
        snapshot_segments(settings, store, "r1", "t", 1)
    seed(store, [(0, 9)])
    ArchiveCommitter(settings, store).sync("r1", "t")
    with pytest.raises(SnapshotUnknown, match="keeps no snapshot 1 "):
        snapshot_segments(settings, store, "r1", "t", 1)
    off = catalog_settings(tmp_path, enabled=False)
    with pytest.raises(ConfigError, match=r"catalog\.enabled"):
        snapshot_segments(off, store, "r1", "t", 1)


def test_a_trimmed_copy_in_a_snapshot_stands_for_its_segment(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    committer = ArchiveCommitter(settings, store)
    seed(store, [(0, 9), (5, 14)])   # a range published twice: [5-14] listed as 10-14
    snap = committer.sync("r1", "t").snapshot_id
    assert snap is not None
    assert snapshot_segments(settings, store, "r1", "t", snap) == {k(0, 0, 9), k(0, 5, 14)}
    req = RestoreRequest("r1", "t", "t.restored", "cp", RestoreRange(), snapshot=snap)
    p = make_plan(store, settings.s3.prefix, req, listed=[k(0, 0, 9), k(0, 5, 14)])
    assert not p.missing and not p.gaps


def test_a_copy_whose_segment_compaction_deleted_is_read_itself(tmp_path: Path) -> None:
    """A snapshot kept for catalog.snapshot_retention lists a trimmed copy whose segment
    compaction deleted at once (no snapshot lists the segment itself): the restore reads
    the copy, as a segment of its own offsets, and every position the snapshot lists."""
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, snapshot_retention="10h")
    committer = ArchiveCommitter(settings, store)
    a, b = k(0, 0, 9), k(0, 5, 14)
    seed(store, [(0, 9), (5, 14)])   # b listed as a copy of 10-14
    snap = committer.sync("r1", "t").snapshot_id
    assert snap is not None
    seed(store, [(0, 14)], level=1)   # compaction's output
    swap = swap_of(committer, "r1", "t", [a, b])
    allowed = committer.deletable("r1", "t", swap)
    assert allowed == {b.to_key()}   # a is held with the snapshot; b is listed by none
    store.delete_many(sorted(allowed))
    committer.after_delete("r1", "t", swap)
    req = RestoreRequest("r1", "t", "t.restored", "cp", RestoreRange(), snapshot=snap)
    # Before: the copy stood for its segment, which is gone.
    keys = snapshot_segments(settings, store, "r1", "t", snap)
    assert make_plan(store, settings.s3.prefix, req, listed=keys).missing == (b,)
    read = snapshot_read(settings, store, "r1", "t", snap)
    made = dataclasses.replace(b, start=10)
    assert read.keys == {a, made} and read.from_copies == (made,)
    p = make_plan(read.store, settings.s3.prefix, req, listed=read.keys)
    assert not p.missing and not p.gaps
    got = []
    for step in p.steps:
        with open_segment(read.store, step.segment.key) as reader:
            got += [r.offset for batch in reader.iter_batches(1000)
                    for r in batch_to_records(batch) if step.first <= r.offset <= step.last]
    assert got == list(range(15))
    with pytest.raises(ObjectNotFound):   # never written to the bucket
        store.head(made.to_key())
    # The copy gone too (a lifecycle rule on the warehouse): named missing by the plan.
    table = committer.table("r1", "t", create=False)
    assert table is not None
    copy = next(p for p in table.files(snap) if "/trimmed/" in p)
    Path(copy.removeprefix("file://")).unlink()
    read = snapshot_read(settings, store, "r1", "t", snap)
    assert read.keys == {a, made} and read.from_copies == ()
    assert make_plan(read.store, settings.s3.prefix, req, listed=read.keys).missing == (made,)
    # A copy whose segment is in the bucket stands for it, as before.
    seed(store, [(5, 14)])
    assert snapshot_read(settings, store, "r1", "t", snap).keys == {a, b}
