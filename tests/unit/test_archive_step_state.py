"""What one table's step keeps while it runs is its own: ``catalog.sync_workers`` steps of
different tables run at once on one committer, and none of them may touch another's
in-flight state. The interleaving is forced, not waited for: a tracer on the step's thread
runs a whole step of another table between two statements of this one. A real pyiceberg
SQL catalog (SQLite) over a MemoryObjectStore.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.plan import Piece
from replicator.archive.trims import copy_piece as real_copy
from replicator.archive.trims import trim_root
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_archive_guards import put


def test_another_tables_step_between_a_copy_and_its_use_leaves_the_copy_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(
        catalog_settings(tmp_path, topics=["t", "u"], table_name="{topic}"), store)
    late = put(store, 50, 149, topic="t")
    put(store, 0, 9, topic="u")
    committer.sync_all()
    put(store, 0, 99, topic="t")   # lands after 50-149 is listed: a trimmed copy (0-49)
    put(store, 10, 19, topic="u")

    # Table t's step: right after its trimmed copy is made, before the step uses it, the
    # whole step of table u runs (what a second sync worker does at any moment).
    copied = threading.Event()

    def copy_piece(*args: Any) -> Any:
        made = real_copy(*args)
        copied.set()
        return made

    monkeypatch.setattr("replicator.archive.committer.copy_piece", copy_piece)
    other: list[Exception] = []
    interleaved = threading.Event()

    def run_other_step() -> None:
        try:
            committer.sync("r1", "u")
        except Exception as e:  # noqa: BLE001 - reported by the test's thread
            other.append(e)

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and copied.is_set() and not interleaved.is_set():
            interleaved.set()
            worker = threading.Thread(target=run_other_step)
            worker.start()
            worker.join()
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_name == "_trimmed_files" else None

    failed: list[Exception] = []

    def step_t() -> None:
        sys.settrace(tracer)
        try:
            committer.sync("r1", "t")
        except Exception as e:  # noqa: BLE001 - reported by the test's thread
            failed.append(e)
        finally:
            sys.settrace(None)

    worker = threading.Thread(target=step_t)
    worker.start()
    worker.join()
    assert interleaved.is_set() and not other
    assert not failed, failed   # before: KeyError, the step failed
    table = committer.table("r1", "t", create=False)
    assert table is not None
    pieces = sorted(p for f in table.files() if (p := committer.piece_of(table, f)))
    assert pieces[0].key.start == 0 and pieces[0] == Piece(pieces[0].key, 0, 49)
    assert pieces[1] == Piece.of(late)
    # The one copy written is the one the table lists (none orphaned).
    copies = table.list_files(trim_root(table.location))
    assert len(copies) == 1 and set(copies) <= set(table.files())
    u = committer.table("r1", "u", create=False)
    assert u is not None and len(u.files()) == 2
