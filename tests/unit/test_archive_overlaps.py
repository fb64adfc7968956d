"""Segments that overlap (egress rewrote a range after a rebalance or a failed offset
commit) are listed once: the table's rows are every offset of the partition exactly once
after every step, before and after compaction, whatever the overlaps and the order in
which the segments land (``archive.plan.claims``, ``archive.trims``). A real pyiceberg SQL
catalog (SQLite) over a MemoryObjectStore and a local warehouse; the rows are read from the
data files the current snapshot lists (segments from the bucket, trimmed copies from the
warehouse). tests/integration/test_archive_overlaps_s3.py reads them with pyiceberg's scan
on the moto server.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.archive.committer import ORPHAN_GRACE, ArchiveCommitter, SyncResult
from replicator.archive.iceberg import IcebergTable
from replicator.archive.plan import Piece
from replicator.archive.trims import parse_trim_path, trim_root, write_trim
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore, ObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_compaction_helpers import make_records

Row = tuple[int, int, bytes | None]   # partition, offset, value


def exists(partition: int, offset: int) -> bool:
    """The source log: partition 1 has holes (transaction markers, compacted records)."""
    return partition != 1 or offset % 5 != 4


def records(partition: int, start: int, end: int) -> list[Record]:
    return [r for r in make_records(start, end) if exists(partition, r.offset)]


def put(store: ObjectStore, partition: int, level: int, start: int, end: int, *,
        group_bytes: int = 64 * 1024) -> SegmentKey:
    key = SegmentKey("data", "r1", "t", partition, level, start, end)
    recs = records(partition, start, end)
    up = SegmentUpload(store, get_format("parquet"), "temp",
                       WriterOptions(row_group_size=group_bytes))
    up.write_batch(records_to_batch(recs))
    publish_segment(store, up.finish(SegmentMetadata.for_key(key, len(recs))).key, key)
    return key


def expected(keys: list[SegmentKey]) -> list[Row]:
    """Each offset of the segments once (the records of the log in their ranges)."""
    got = {(k.partition, r.offset): r.value for k in keys
           for r in records(k.partition, k.start, k.end)}
    return sorted((p, o, v) for (p, o), v in got.items())


def segments(store: ObjectStore) -> list[SegmentKey]:
    return sorted(k for o in store.list("data/") if (k := SegmentKey.try_parse(o.key)))


def file_rows(store: ObjectStore, committer: ArchiveCommitter, table: IcebergTable,
              path: str) -> list[Row]:
    piece = committer.piece_of(table, path)
    assert piece is not None, path
    if piece.whole:
        data = pq.read_table(pa.BufferReader(store.get(piece.key.to_key())))
    else:
        data = pq.read_table(path.removeprefix("file://"))
    return [(piece.key.partition, o, v) for o, v in
            zip(data.column("offset").to_pylist(), data.column("value").to_pylist(),
                strict=True)]


def table_rows(store: ObjectStore, committer: ArchiveCommitter,
               snapshot_id: int | None = None) -> list[Row]:
    """The rows of the files a scan of the table reads (no delete files exist)."""
    table = committer.table("r1", "t", create=False)
    if table is None:
        return []
    out: list[Row] = []
    for path, f in table.files(snapshot_id).items():
        rows = file_rows(store, committer, table, path)
        assert len(rows) == f.records, path   # the manifest's count is the file's
        out.extend(rows)
    return sorted(out)


def check_snapshots(store: ObjectStore, committer: ArchiveCommitter) -> None:
    """Every file every kept snapshot lists exists (segments in the bucket, copies in the
    warehouse: ``table_rows`` reads them all), and no snapshot lists an offset twice — not
    even one a step committed on its way to the next current one; nor does one miss an
    offset its parent lists, unless it is a ``delete`` (files that left the bucket). (With
    lifecycle deletes the last two do not hold: a step that removes a deleted segment and
    lists its positions from another one in the same commit has such a snapshot,
    docs/architecture.md. The first holds after each step:
    tests/unit/test_archive_held_gone.py.)
    """
    table = committer.table("r1", "t", create=False)
    assert table is not None
    offsets: dict[int, set[tuple[int, int]]] = {}
    snapshots = table.snapshots()
    for snap in snapshots:
        rows = table_rows(store, committer, snap.snapshot_id)
        offsets[snap.snapshot_id] = {(p, o) for p, o, _ in rows}
        assert len(rows) == len(offsets[snap.snapshot_id]), snap
    for snap in snapshots:
        if snap.parent_id in offsets and snap.operation != "delete":
            assert offsets[snap.parent_id] <= offsets[snap.snapshot_id], snap


@contextmanager
def streamed() -> Iterator[list[Row]]:
    """What a streaming reader reads, which reads appends and skips replaces and deletes:
    the rows of the files each commit appended (``IcebergTable.commit``'s ``add``),
    in commit order (kept for the test even once snapshot expiry forgets them).
    """
    out: list[Row] = []
    real = IcebergTable.commit

    def commit(table: IcebergTable, add: Any = (), *args: Any, **kwargs: Any) -> int | None:
        snapshot = real(table, add, *args, **kwargs)
        for f in add:
            piece = parse_trim_path(table.location, f.path)
            if piece is None:
                piece = Piece.of(SegmentKey.parse(f.path.split("/", 3)[3]))
            out.extend((piece.key.partition, r.offset, r.value)
                       for r in records(piece.key.partition, piece.lo, piece.hi))
        return snapshot

    with mock.patch.object(IcebergTable, "commit", commit):
        yield out


def check_streamed(appended: list[Row], store: ObjectStore) -> None:
    """Every offset the table lists reached a streaming reader, each once."""
    assert len(appended) == len({(p, o) for p, o, _ in appended})
    assert set(expected(segments(store))) <= set(appended)


def check_files_exist(store: ObjectStore, committer: ArchiveCommitter) -> None:
    """Every file every kept snapshot lists exists: segments in the bucket (held inputs a
    lifecycle rule deleted included: their snapshots were expired), copies in the
    warehouse."""
    table = committer.table("r1", "t", create=False)
    assert table is not None
    table.refresh()
    for snap in table.snapshots():
        for path in table.files(snap.snapshot_id):
            piece = committer.piece_of(table, path)
            assert piece is not None, path
            if piece.whole:
                store.head(piece.key.to_key())   # ObjectNotFound: a snapshot lists it
            else:
                assert Path(path.removeprefix("file://")).exists(), (snap, path)


def LATER() -> datetime:
    """A clock past ``ORPHAN_GRACE``: copies no snapshot lists are deleted at once."""
    return datetime.now(UTC) + ORPHAN_GRACE + timedelta(minutes=1)


@contextmanager
def committer_in(tmp: Path, store: MemoryObjectStore, **catalog: Any
                 ) -> Iterator[ArchiveCommitter]:
    yield ArchiveCommitter(catalog_settings(tmp, **catalog), store, clock=LATER)


def compact(store: ObjectStore, committer: ArchiveCommitter, inputs: list[SegmentKey],
            rows: Callable[[], list[Row]]) -> SyncResult | None:
    """What a compaction run does with the hook: write the output, swap, delete what the
    table lets go, expire (no table yet: delete the inputs, as without ``[catalog]``)."""
    out = put(store, inputs[0].partition, max(k.level for k in inputs) + 1,
              min(k.start for k in inputs), max(k.end for k in inputs))
    swap = committer.swap("r1", "t", inputs)
    if swap is None:
        assert committer.table("r1", "t", create=False) is None
        store.delete_many([k.to_key() for k in inputs])
        return None
    assert rows() == expected(segments(store))
    allowed = committer.deletable("r1", "t", swap) - set(swap.kept)
    doomed = [k.to_key() for k in inputs if k.to_key() in allowed]
    if doomed:
        store.delete_many(doomed)
        committer.after_delete("r1", "t", swap)
    assert out in segments(store)
    return swap


# --- the case of the review, and named layouts -------------------------------------------


def test_a_rewritten_range_is_listed_once(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store) as committer:
        put(store, 0, 0, 0, 99)      # published; the offset commit failed
        put(store, 0, 0, 50, 149)    # the new owner re-read from offset 50
        put(store, 0, 0, 150, 199)
        committer.sync("r1", "t")
        rows = table_rows(store, committer)
        assert len(rows) == 200 and rows == expected(segments(store))
        table = committer.table("r1", "t", create=False)
        assert table is not None
        assert sum(f.records for f in table.files().values()) == 200
        assert committer.sync("r1", "t").committed is False   # stable: nothing to redo
        assert committer.sync("r1", "t", partition=0).committed is False


def test_a_late_segment_is_trimmed_and_the_listed_one_stays(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store) as committer:
        b = put(store, 0, 0, 50, 149)
        committer.sync("r1", "t")
        table = committer.table("r1", "t", create=False)
        assert table is not None
        first = table.snapshot_id
        a = put(store, 0, 0, 0, 99)   # lands after b was committed
        r = committer.sync("r1", "t")
        assert (r.added, r.removed_covered, r.removed_gone) == (1, 0, 0)   # an append
        table.refresh()
        pieces = sorted(p for f in table.files() if (p := committer.piece_of(table, f)))
        assert pieces == [Piece(a, 0, 49), Piece.of(b)]
        assert [s.operation for s in table.snapshots() if s.snapshot_id != first] == [
            "append"]
        assert table_rows(store, committer) == expected([a, b])


def test_chains_unions_and_levels(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store) as committer:
        # A chain of overlaps, a segment covered only by the union of two others, and a
        # level-1 output that partly overlaps level-0 rewrites, in a partition with holes.
        for level, s, e in [(0, 0, 40), (0, 30, 70), (0, 60, 100), (0, 35, 65), (1, 90, 130),
                            (0, 120, 140)]:
            put(store, 1, level, s, e)
            committer.sync("r1", "t")
            assert table_rows(store, committer) == expected(segments(store))
        compact(store, committer, [k for k in segments(store) if k.start < 70],
                lambda: table_rows(store, committer))
        assert table_rows(store, committer) == expected(segments(store))
        committer.sync("r1", "t")
        assert table_rows(store, committer) == expected(segments(store))
        check_snapshots(store, committer)


def test_trimmed_copies_leave_the_warehouse_once_no_snapshot_lists_them(
        tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store, snapshot_retention="0s") as committer:
        a, b = put(store, 0, 0, 0, 99), put(store, 0, 0, 50, 149)
        committer.sync("r1", "t")
        table = committer.table("r1", "t", create=False)
        assert table is not None
        copies = table.list_files(trim_root(table.location))
        assert len(copies) == 1
        # The output covers both: the copy leaves the table, then the warehouse.
        compact(store, committer, [a, b], lambda: table_rows(store, committer))
        table.refresh()
        assert table.list_files(trim_root(table.location)) == {}
        assert table_rows(store, committer) == expected(segments(store))
        check_snapshots(store, committer)


def test_a_copy_a_retained_snapshot_lists_stays_for_time_travel(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store, snapshot_retention="10h") as committer:
        a, b = put(store, 0, 0, 0, 99), put(store, 0, 0, 50, 149)
        before = committer.sync("r1", "t").snapshot_id
        assert before is not None
        compact(store, committer, [a, b], lambda: table_rows(store, committer))
        table = committer.table("r1", "t", create=False)
        assert table is not None and table.has_snapshot(before)   # within the retention
        assert committer.clean_trims(table) == 0
        assert table_rows(store, committer, before) == expected([a, b])   # still reads


def test_a_lifecycle_delete_of_an_input_held_for_the_retention(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store, snapshot_retention="10h") as committer:
        a, b = put(store, 0, 0, 0, 9), put(store, 0, 0, 10, 19)
        committer.sync("r1", "t")
        compact(store, committer, [a, b], lambda: table_rows(store, committer))
        store.delete(a.to_key())   # a lifecycle rule, within the retention
        committer.sync("r1", "t")
        check_snapshots(store, committer)


def test_two_committers_at_once_list_one_copy_and_the_losers_copy_is_collected(
        tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    first = ArchiveCommitter(settings, store, clock=LATER)
    second = ArchiveCommitter(settings, store, clock=LATER)
    put(store, 0, 0, 0, 99)
    put(store, 0, 0, 50, 149)
    real = first._commit
    calls: list[int] = []

    def commit_after_the_other(*args: Any) -> int | None:
        if not calls:   # the other committer commits between this one's plan and commit
            second.sync("r1", "t")
        calls.append(1)
        return real(*args)

    first._commit = commit_after_the_other  # type: ignore[method-assign,assignment]
    r = first.sync("r1", "t")
    assert r.conflicts == 1 and not r.committed   # re-planned: nothing left to do
    assert table_rows(store, first) == expected(segments(store))
    table = first.table("r1", "t", create=False)
    assert table is not None
    assert len(table.list_files(trim_root(table.location))) == 2   # the loser's copy
    assert first.clean_trims(table) == 1
    assert len(table.list_files(trim_root(table.location))) == 1
    assert table_rows(store, first) == expected(segments(store))
    # Within the grace, a copy no snapshot lists yet (a commit in flight) is kept.
    young = ArchiveCommitter(settings, store)
    put(store, 0, 0, 140, 160)
    young._commit = lambda *a: (_ for _ in ()).throw(RuntimeError("died"))  # type: ignore
    try:
        young.sync("r1", "t")
    except RuntimeError:
        pass
    assert len(table.list_files(trim_root(table.location))) == 2
    assert young.clean_trims(table) == 0


def test_a_copy_reads_only_the_row_groups_of_its_offsets(monkeypatch: Any) -> None:
    store = MemoryObjectStore("b")
    key = put(store, 0, 0, 0, 999, group_bytes=2048)   # many small row groups
    groups = pq.read_metadata(pa.BufferReader(store.get(key.to_key()))).num_row_groups
    read: list[int] = []
    real = pq.ParquetFile.read_row_group

    def read_row_group(self: pq.ParquetFile, i: int, *a: Any, **kw: Any) -> pa.Table:
        read.append(i)
        return real(self, i, *a, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_row_group)
    data, footer = write_trim(store, Piece(key, 990, 999))
    with data:
        table = pq.read_table(data)
    assert table.column("offset").to_pylist() == list(range(990, 1000))
    assert footer.num_rows == 10 and b"replicator.trimmed_from" in (footer.metadata or {})
    assert groups > 5 and 1 <= len(read) <= 2 and read[-1] == groups - 1
    assert parse_trim_path("s3://w/t", "s3://w/t/data/trimmed/x/1-2-3.parquet") is None


def test_an_output_swapped_in_with_a_new_segment_over_its_inputs_lists_no_offset_twice(
        tmp_path: Path) -> None:
    # Found by the property: a swap of 0-0 and 0-1 (the table lists 0-1) into their output
    # 0-1 adds 1-4 too (new, wider: claimed first); 1-4 holds position 1 of the removed
    # 0-1 and the new 2-4. Appended whole, the append snapshot before the swap's replace
    # listed offset 1 twice: 1-4 is split into a copy of 1 (swapped in) and one of 2-4
    # (appended).
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store, snapshot_retention="10h") as committer, \
            streamed() as appended:
        put(store, 0, 0, 0, 1)
        committer.sync("r1", "t")
        for start, end in [(1, 4), (0, 0), (1, 1), (1, 2)]:
            put(store, 0, 0, start, end)
        inputs = [k for k in segments(store) if (k.start, k.end) in [(0, 0), (0, 1)]]
        compact(store, committer, inputs, lambda: table_rows(store, committer))
        check_snapshots(store, committer)
        for start, end in [(1, 3), (2, 2)]:
            put(store, 0, 0, start, end)
        committer.sync("r1", "t")
        assert table_rows(store, committer) == expected(segments(store))
        assert committer.sync("r1", "t").committed is False   # the split copies stay
        check_snapshots(store, committer)
        check_streamed(appended, store)


def test_a_segment_covering_a_listed_one_appends_its_new_offsets(tmp_path: Path) -> None:
    # 0-4 hides the listed 0-1 (egress re-read from 0 after a failed offset commit).
    # Swapped in whole, streaming readers (they skip replaces) never read 2-4; appended
    # whole, the append snapshot lists 0-1 twice. Split: 0-1 swapped in, 2-4 appended.
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store, snapshot_retention="10h") as committer, \
            streamed() as appended:
        put(store, 0, 0, 0, 1)
        committer.sync("r1", "t")
        b = put(store, 0, 0, 0, 4)
        r = committer.sync("r1", "t")
        assert (r.added, r.removed_covered) == (2, 1)
        table = committer.table("r1", "t", create=False)
        assert table is not None
        assert sorted(p for f in table.files() if (p := committer.piece_of(table, f))) == [
            Piece(b, 0, 1), Piece(b, 2, 4)]
        assert table_rows(store, committer) == expected(segments(store))
        check_snapshots(store, committer)
        check_streamed(appended, store)
        assert committer.sync("r1", "t").committed is False


def test_a_copy_of_positions_without_records_stays_listed_and_stored(
        tmp_path: Path) -> None:
    # Partition 1 has no record at offset 9 (a transaction marker, say): the late 3-9
    # keeps only position 9 and its copy has no rows. pyiceberg's scan plans no file
    # without records: the step, the cleanup and the swap saw no such copy (a new step
    # added it again, the cleanup deleted the listed copy, a swap could not remove it).
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    with committer_in(tmp_path, store) as committer:
        a = put(store, 1, 0, 0, 8)
        committer.sync("r1", "t")
        b = put(store, 1, 0, 3, 9)
        committer.sync("r1", "t")
        table = committer.table("r1", "t", create=False)
        assert table is not None
        assert sorted(p for f in table.files() if (p := committer.piece_of(table, f))) == [
            Piece.of(a), Piece(b, 9, 9)]
        assert committer.clean_trims(table) == 0
        assert len(table.list_files(trim_root(table.location))) == 1
        fresh = ArchiveCommitter(settings, store, clock=LATER)   # a restart: no memory
        assert fresh.sync("r1", "t").committed is False
        compact(store, committer, [a, b], lambda: table_rows(store, committer))
        assert table_rows(store, committer) == expected(segments(store))
        check_snapshots(store, committer)


# --- the property -------------------------------------------------------------------------

layouts = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 45), st.integers(0, 20)),
                   min_size=1, max_size=7, unique=True)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(layouts, st.sampled_from(["0s", "10h"]), st.booleans(), st.data())
def test_every_offset_is_listed_exactly_once_at_every_step(
        layout: list[tuple[int, int, int]], retention: str, lifecycle: bool,
        data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = MemoryObjectStore("b")
        with committer_in(Path(tmp), store, snapshot_retention=retention) as committer, \
                streamed() as appended:
            run_scenario(store, committer, layout, data,
                         lambda: table_rows(store, committer), lifecycle=lifecycle,
                         after_delete=lambda: check_files_exist(store, committer))
            if lifecycle:   # (a snapshot listing an offset twice: docs/architecture.md)
                check_files_exist(store, committer)
            else:
                check_snapshots(store, committer)
                # (Positions a lifecycle delete took out are appended again from another
                # segment: streaming readers read them twice.)
                check_streamed(appended, store)
            # Copies no snapshot lists leave the warehouse (the clock is past the grace).
            table = committer.table("r1", "t", create=False)
            assert table is not None
            committer.clean_trims(table)
            stored = set(table.list_files(trim_root(table.location)))
            listed = {f for s in table.snapshots() for f in table.files(s.snapshot_id)
                      if parse_trim_path(table.location, f)}
            assert stored == listed


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(layouts, st.data())
def test_no_kept_snapshot_lists_a_held_input_a_lifecycle_rule_deleted(
        layout: list[tuple[int, int, int]], data: st.DataObject) -> None:
    """As above, with compaction's inputs held for the retention: a lifecycle delete of
    one is found by the next step (tests/unit/test_archive_held_gone.py names the orders)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = MemoryObjectStore("b")
        with committer_in(Path(tmp), store, snapshot_retention="10h") as committer:
            def delete_a_held_input() -> None:
                check_files_exist(store, committer)
                table = committer.table("r1", "t", create=False)
                assert table is not None
                held = sorted(k for p in committer.held_snapshots(table)
                              if (k := committer.key_of(p)) and k in segments(store))
                if not held:
                    return
                if data.draw(st.booleans(), label="delete a held input"):
                    store.delete(data.draw(st.sampled_from(held)).to_key())
                    committer.sync("r1", "t")
                    check_files_exist(store, committer)

            run_scenario(store, committer, layout, data,
                         lambda: table_rows(store, committer), lifecycle=True,
                         after_delete=delete_a_held_input, after_compact=delete_a_held_input)
            check_files_exist(store, committer)


def run_scenario(store: ObjectStore, committer: ArchiveCommitter,
                 layout: list[tuple[int, int, int]], data: st.DataObject,
                 rows: Callable[[], list[Row]], *, lifecycle: bool = False,
                 after_delete: Callable[[], None] = lambda: None,
                 after_compact: Callable[[], None] = lambda: None) -> None:
    """Land the layout's segments in a drawn order, syncing, compacting and (with
    ``lifecycle``) deleting a segment as a lifecycle rule would, between landings as
    drawn (``after_delete`` checks the table once a step followed it); after each table
    change, ``rows()`` is every offset once."""
    order = data.draw(st.permutations(layout))
    for partition, start, span in order:
        if any(k.partition == partition and (k.start, k.end) == (start, start + span)
               for k in segments(store)):
            continue
        if not records(partition, start, start + span):
            continue
        put(store, partition, 0, start, start + span)
        if data.draw(st.booleans(), label="sync"):
            committer.sync("r1", "t")
            assert rows() == expected(segments(store))
        if data.draw(st.booleans(), label="compact"):
            run = contiguous_run(segments(store), data)
            if run:
                if compact(store, committer, run, rows) is not None:
                    assert rows() == expected(segments(store))
                    after_compact()
                else:   # no table yet: nothing listed, the next step lists the output
                    assert rows() == []
        if lifecycle and data.draw(st.booleans(), label="lifecycle delete"):
            doomed = data.draw(st.sampled_from(segments(store)), label="deleted")
            store.delete(doomed.to_key())
            committer.sync("r1", "t")
            assert rows() == expected(segments(store))
            after_delete()
    committer.sync("r1", "t")
    assert rows() == expected(segments(store))


def contiguous_run(keys: list[SegmentKey], data: st.DataObject) -> list[SegmentKey]:
    """Some consecutive segments of one partition whose ranges leave no gap (what a
    compaction run merges into one output), or ``[]``."""
    part = data.draw(st.sampled_from(sorted({k.partition for k in keys})), label="part")
    ks = sorted((k for k in keys if k.partition == part), key=lambda k: (k.start, k.end))
    if len(ks) < 2:
        return []
    i = data.draw(st.integers(0, len(ks) - 2), label="from")
    j = data.draw(st.integers(i + 2, len(ks)), label="to")
    run = ks[i:j]
    reach = run[0].end
    for k in run[1:]:
        if k.start > reach + 1:
            return []
        reach = max(reach, k.end)
    out = SegmentKey("data", "r1", "t", part, max(k.level for k in run) + 1,
                     run[0].start, reach)
    return [] if out in keys else run


def test_a_table_with_a_trimmed_copy_is_planned_in_full_from_the_committers_memory(
        tmp_path: Path) -> None:
    # The committer plans from memory only the segments overlapping a change
    # (archive/step_memory.py). A trimmed copy's positions depend on segments that do not
    # overlap the change: here b's copy holds 100-139, between a (0-99) and c (140-199).
    # When a leaves the bucket, only a and b overlap the change; planned without c, b
    # would be listed whole and 140-149 twice.
    store = MemoryObjectStore("b")
    with committer_in(tmp_path, store) as committer:
        a = put(store, 0, 0, 0, 99)
        c = put(store, 0, 0, 140, 199)
        committer.sync("r1", "t")
        b = put(store, 0, 0, 50, 149)   # late: trimmed to the positions only it holds
        committer.sync("r1", "t")
        assert table_rows(store, committer) == expected([a, b, c])
        store.delete(a.to_key())        # a lifecycle rule, say
        committer.sync("r1", "t")
        rows = table_rows(store, committer)
        assert rows == expected([b, c])
        assert committer.sync("r1", "t").committed is False
