"""``catalog.snapshot_retention`` against snapshot expiry: the snapshot before a compaction
swap stays readable for the retention (time travel, ``archive sql --snapshot``, ``restore
--snapshot``) whatever else the table's steps do: however many add-only steps follow
(``KEEP_SNAPSHOTS`` counts only beyond the retention). A real pyiceberg SQL catalog
(SQLite) over a MemoryObjectStore, as tests/unit/test_archive_held_gone.py.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from replicator.archive import snapshot_history
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
