"""A segment compaction swapped out of a table and holds for ``catalog.snapshot_retention``
that leaves the bucket before it (a lifecycle rule, an operator): the next step of the
table expires the snapshots listing it at once (ERROR naming both, counted), so no kept
snapshot lists a missing object (``SnapshotHistory.expire_held_gone``,
docs/architecture.md). The delete between steps, during a step, during compaction's swap
and between its swap and its delete; and compaction's own delete of a held segment (its
snapshots expired first) is not mistaken for one. A real pyiceberg SQL catalog (SQLite)
over a MemoryObjectStore, as tests/unit/test_archive_overlaps.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from replicator.archive.committer import ORPHAN_GRACE, ArchiveCommitter
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings, swap_of
from tests.unit.test_archive_overlaps import compact, expected, put, segments, table_rows

HELD = "replicator_archive_held_segments_gone_total"
LABELS = {"region": "r1", "topic": "t"}


class Clock:
    """Past ``ORPHAN_GRACE``, and moved on by hand past the retention."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC) + ORPHAN_GRACE + timedelta(minutes=1)

    def __call__(self) -> datetime:
        return self.now


def committer(tmp: Path, store: MemoryObjectStore, clock: Clock | None = None
              ) -> ArchiveCommitter:
    return ArchiveCommitter(catalog_settings(tmp, snapshot_retention="10h"), store,
                            clock=clock or Clock())


def kept_files_exist(store: MemoryObjectStore, c: ArchiveCommitter) -> None:
    """Every segment every kept snapshot lists is in the bucket."""
    table = c.table("r1", "t", create=False)
    assert table is not None
    table.refresh()
    head = f"s3://{store.bucket}/"
    have = {o.key for o in store.list("data/")}
    for snap in table.snapshots():
        missing = sorted(p for p in table.files(snap.snapshot_id)
                         if p.startswith(head) and p[len(head):] not in have)
        assert not missing, (snap.snapshot_id, missing)


def swapped(store: MemoryObjectStore, c: ArchiveCommitter
            ) -> tuple[SegmentKey, SegmentKey, SegmentKey, int]:
    """a, b compacted into an output, held for the retention; c stays; the snapshot before
    the swap (it lists a and b)."""
    a, b, c_ = put(store, 0, 0, 0, 9), put(store, 0, 0, 10, 19), put(store, 0, 0, 20, 29)
    before = c.sync("r1", "t").snapshot_id
    assert before is not None
    compact(store, c, [a, b], lambda: table_rows(store, c))
    assert {a, b} <= set(segments(store))   # held: within the retention
    return a, b, c_, before


def held_value(c: ArchiveCommitter) -> float:
    return float(c.metrics.value(HELD, LABELS) or 0)


def test_a_delete_between_steps_expires_the_snapshots_listing_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryObjectStore("b")
    c = committer(tmp_path, store)
    a, b, _, before = swapped(store, c)
    table = c.table("r1", "t", create=False)
    assert table is not None
    current = table.snapshot_id
    store.delete(a.to_key())   # a lifecycle rule, within the retention
    with caplog.at_level(logging.ERROR):
        r = c.sync("r1", "t")
    assert not r.committed and r.expired >= 1
    table.refresh()
    assert not table.has_snapshot(before) and table.snapshot_id == current
    kept_files_exist(store, c)
    assert table_rows(store, c) == expected(segments(store))   # the table is untouched
    assert held_value(c) == 1
    errors = [m.getMessage() for m in caplog.records if m.levelno == logging.ERROR]
    assert len(errors) == 1 and a.to_key() in errors[0] and str(before) in errors[0]
    # b is held by nothing now: the next compaction run may delete it at once.
    swap = swap_of(c, "r1", "t", [b])
    assert c.deletable("r1", "t", swap) == {b.to_key()}
    # Nothing more to expire: the next steps are quiet.
    assert c.sync("r1", "t").expired == 0 and held_value(c) == 1


def test_a_delete_during_a_step_is_found_by_the_next(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    c = committer(tmp_path, store)
    a, _, _, before = swapped(store, c)
    put(store, 0, 0, 30, 39)   # the step commits too
    real = c._listing

    def listing_then_delete(*args: Any) -> tuple[list[SegmentKey], bool]:
        out = real(*args)
        if a.to_key() in {o.key for o in store.list("data/")}:
            store.delete(a.to_key())   # after this step listed the bucket
        return out

    c._listing = listing_then_delete  # type: ignore[method-assign,assignment]
    assert c.sync("r1", "t").added == 1
    c._listing = real  # type: ignore[method-assign]
    table = c.table("r1", "t", create=False)
    assert table is not None and table.has_snapshot(before)   # not seen by this step
    c.sync("r1", "t")
    table.refresh()
    assert not table.has_snapshot(before)
    kept_files_exist(store, c)
    assert table_rows(store, c) == expected(segments(store))
    assert held_value(c) == 1


def test_a_delete_during_the_swap_or_before_its_delete_is_found(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    c = committer(tmp_path, store)
    a, b, d = put(store, 0, 0, 0, 9), put(store, 0, 0, 10, 19), put(store, 0, 0, 20, 29)
    e = put(store, 0, 0, 30, 39)
    first = c.sync("r1", "t").snapshot_id
    # Compaction of a, b: a lifecycle rule deletes a after the swap listed the bucket.
    put(store, 0, 1, 0, 19)
    real = c._listing

    def listing_then_delete(*args: Any) -> tuple[list[SegmentKey], bool]:
        out = real(*args)
        store.delete(a.to_key())
        return out

    c._listing = listing_then_delete  # type: ignore[method-assign,assignment]
    swap = swap_of(c, "r1", "t", [a, b])
    c._listing = real  # type: ignore[method-assign]
    assert c.deletable("r1", "t", swap) == set()   # held: within the retention
    c.sync("r1", "t")
    table = c.table("r1", "t", create=False)
    assert table is not None and first is not None and not table.has_snapshot(first)
    kept_files_exist(store, c)
    # Compaction of d, e: the delete comes between its swap and its deletes.
    put(store, 0, 1, 20, 39)
    swap = swap_of(c, "r1", "t", [d, e])
    store.delete(e.to_key())
    assert c.deletable("r1", "t", swap) == set()
    c.sync("r1", "t")
    kept_files_exist(store, c)
    assert table_rows(store, c) == expected(segments(store))
    assert held_value(c) == 2


def test_compactions_own_delete_of_a_held_segment_is_not_a_lifecycle_delete(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryObjectStore("b")
    clock = Clock()
    c = committer(tmp_path, store, clock)
    a, b, _, before = swapped(store, c)
    # Another process steps the table: it loads it, then compaction (past the retention)
    # expires the snapshots listing a and b and deletes them, then the step lists.
    other = committer(tmp_path, store, clock)
    real = other._listing

    def compaction_then_listing(*args: Any) -> tuple[list[SegmentKey], bool]:
        clock.now += timedelta(hours=11)
        swap = swap_of(c, "r1", "t", [a, b])
        allowed = c.deletable("r1", "t", swap)
        assert allowed == {a.to_key(), b.to_key()}
        store.delete_many(sorted(allowed))
        c.after_delete("r1", "t", swap)
        return real(*args)

    other._listing = compaction_then_listing  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.WARNING):
        other.sync("r1", "t")
    assert held_value(other) == 0
    assert not [m for m in caplog.records if m.levelno >= logging.WARNING]
    kept_files_exist(store, c)
    table = c.table("r1", "t", create=False)
    assert table is not None and not table.has_snapshot(before)


def test_a_partition_step_checks_its_partition(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    c = committer(tmp_path, store)
    a, _, _, before = swapped(store, c)
    heads: list[str] = []
    real: Callable[[str], Any] = store.head

    def head(key: str) -> Any:
        heads.append(key)
        return real(key)

    store.head = head  # type: ignore[method-assign]
    store.delete(a.to_key())
    c.sync("r1", "t", partition=1)   # another partition: a is not its concern
    table = c.table("r1", "t", create=False)
    assert table is not None and table.has_snapshot(before) and heads == []
    c.sync("r1", "t", partition=0)
    table.refresh()
    assert not table.has_snapshot(before) and heads == [a.to_key()]
    kept_files_exist(store, c)


def test_a_segment_a_swap_removed_as_gone_is_expired_by_the_next_step_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryObjectStore("b")
    c = committer(tmp_path, store)
    a, b, x = put(store, 0, 0, 0, 9), put(store, 0, 0, 10, 19), put(store, 1, 0, 0, 9)
    before = c.sync("r1", "t").snapshot_id
    put(store, 0, 1, 0, 19)
    store.delete(x.to_key())   # a lifecycle rule: the swap removes it as gone
    swap = swap_of(c, "r1", "t", [a, b])
    assert swap.removed_gone == 1
    assert c.deletable("r1", "t", swap) == set()   # a, b held
    with caplog.at_level(logging.INFO):
        c.sync("r1", "t")
    table = c.table("r1", "t", create=False)
    assert table is not None and before is not None and not table.has_snapshot(before)
    kept_files_exist(store, c)
    assert held_value(c) == 0
    assert not [m for m in caplog.records if m.levelno >= logging.ERROR]
    assert "removed as gone" in caplog.text
