"""Parquet objects at segment keys whose rows are not the key's range (an operator's copy of
another segment, a restore tool writing a whole partition under one key, a bug): a table
lists a segment as its key says, so such an object is quarantined (ERROR and
``archive_segments_not_in_table_total{reason="range"}``), as a whole file and as the
source of a trimmed copy, and hides nothing it claims to cover. A real pyiceberg SQL
catalog (SQLite) over a MemoryObjectStore; each test fails without the check
(``archive.segment_fit``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from formats.segment_io import open_segment
from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import IcebergTable
from replicator.archive.plan import Piece
from replicator.archive.trims import trim_root
from replicator.core.errors import SegmentCorrupt
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings, listed, swap_of
from tests.unit.test_compaction_controller import k, seed
from tests.unit.test_compaction_helpers import make_records, write_segment


def current(committer: ArchiveCommitter) -> IcebergTable:
    table = committer.table("r1", "t", create=False)
    assert table is not None
    return table


def quarantined_for_range(committer: ArchiveCommitter) -> float | None:
    return committer.metrics.value("replicator_archive_segments_not_in_table_total",
                                   {"region": "r1", "topic": "t", "reason": "range"})


@pytest.mark.parametrize(("rows", "reader_refuses"), [
    ((0, 19), True),    # 20 rows at a 10-position key: the footer's count says so too
    ((0, 9), False),    # 10 rows, footer pairs of the key: only the offsets tell
])
def test_an_object_whose_rows_are_not_its_keys_range_is_quarantined(
        tmp_path: Path, rows: tuple[int, int], reader_refuses: bool) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    seed(store, [(0, 9)])
    committer.sync("r1", "t")
    foreign = k(0, 10, 19)
    write_segment(store, foreign, make_records(*rows))
    seed(store, [(20, 29)])
    for _ in range(2):
        r = committer.sync("r1", "t")   # was: listed as 10-19, its records twice
        assert r.quarantined == [foreign.to_key()]
    assert listed(current(committer)) == [k(0, 0, 9), k(0, 20, 29)]
    assert quarantined_for_range(committer) == 1   # counted once per key
    # Ingress and restore open segments with the same footer checks, and check the
    # records' offsets as they read (compaction too: it reads its inputs the same way).
    if reader_refuses:
        with pytest.raises(SegmentCorrupt, match="exceeds the key's range"):
            open_segment(store, foreign)
    else:   # the footer passes; the records' offsets do not (formats.segment_io)
        with open_segment(store, foreign) as reader, \
                pytest.raises(SegmentCorrupt, match="record offset 0 out of place"):
            list(reader.iter_batches(1000))


def test_a_foreign_object_at_a_covering_key_hides_nothing(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    inputs = seed(store, [(0, 9), (10, 19)])
    committer.sync("r1", "t")
    # A level-1 key over both, holding other offsets (pairs and count of the key).
    write_segment(store, k(1, 0, 19), make_records(20, 39))
    r = committer.sync("r1", "t")
    assert r.quarantined == [k(1, 0, 19).to_key()]
    assert listed(current(committer)) == inputs   # not swapped out for the foreign one
    # A compaction's swap keeps the inputs the foreign object would have covered.
    assert swap_of(committer, "r1", "t", inputs).kept == [x.to_key() for x in inputs]
    assert listed(current(committer)) == inputs


def test_the_source_of_a_trimmed_copy_is_checked_too(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    (listed_first,) = seed(store, [(50, 149)])
    committer.sync("r1", "t")
    # Lands later and overlaps it: listed as a trimmed copy of 0-49, but its rows are
    # offsets 30-129 (the copy would claim 0-29 and hold none of them).
    late = k(0, 0, 99)
    write_segment(store, late, make_records(30, 129))
    r = committer.sync("r1", "t")
    assert r.quarantined == [late.to_key()]
    table = current(committer)
    assert sorted(p for f in table.files() if (p := committer.piece_of(table, f))) == [
        Piece.of(listed_first)]
    assert quarantined_for_range(committer) == 1
    assert not table.list_files(trim_root(table.location))   # no copy written
