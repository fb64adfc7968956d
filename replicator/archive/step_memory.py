"""What a committer remembers of each table between its steps, so that a step plans only
what changed (docs/architecture.md, "The archive as Iceberg tables").

A table at the snapshot of the committer's own last commit lists exactly the files that
commit left: they need not be read from the manifests again. And when that step planned
the whole listing and added everything it planned, the table matched the listing then; a
segment's place in the table (listed, or hidden by a segment covering it) depends only on
the segments whose offsets overlap its own, so the next step plans only the segments that
overlap a segment that appeared or disappeared since. Anything else (another writer's
commit, a restart, a compaction swap, a segment that could not be added) plans in full.

The listing itself is remembered too (``objects``): the next step lists only the keys
after it (``archive.listing``), and lists in full again once ``listed_in_full`` is
``catalog.full_listing_interval`` old, or whenever the plan is made in full.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectInfo

MAX_FILES = 500_000
"""Segments remembered over all tables (each one's path, key and listing entry); tables
stepped longest ago are forgotten first, and planned in full at their next step."""


@dataclass(frozen=True)
class Remembered:
    """One table after a step of this committer."""

    snapshot_id: int
    files: dict[str, SegmentKey]
    """The table's files (path → segment) at ``snapshot_id``."""
    listing: frozenset[SegmentKey] | None
    """The segments that step listed, when the table matched them afterwards (else
    ``None``: the next step plans in full)."""
    parsed: dict[str, SegmentKey]
    """The object keys of that listing, parsed (a listing repeats them step after step)."""
    objects: dict[str, ObjectInfo] = field(default_factory=dict)
    """The listed objects of ``parsed`` (what the next step's listing starts from)."""
    listed_in_full: datetime | None = None
    """When the last full listing that ``listing`` comes from started (``None``: list in
    full next time)."""


class StepMemory:
    """``Remembered`` per table name, bounded by ``MAX_FILES``; thread-safe."""

    def __init__(self, max_files: int = MAX_FILES) -> None:
        self._max = max_files
        self._tables: OrderedDict[str, Remembered] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, table: str, snapshot_id: int | None) -> Remembered | None:
        """What is remembered of ``table`` if it is still at ``snapshot_id``."""
        with self._lock:
            mem = self._tables.get(table)
            if mem is None or snapshot_id is None or mem.snapshot_id != snapshot_id:
                return None
            self._tables.move_to_end(table)
            return mem

    def put(self, table: str, mem: Remembered | None) -> None:
        """Remember ``mem`` for ``table`` (``None``: forget it)."""
        with self._lock:
            self._tables.pop(table, None)
            if mem is None:
                return
            self._tables[table] = mem
            total = sum(_size(m) for m in self._tables.values())
            while total > self._max and self._tables:
                total -= _size(self._tables.popitem(last=False)[1])


def _size(mem: Remembered) -> int:
    return max(len(mem.files), len(mem.parsed))


def _partition(k: SegmentKey) -> tuple[object, ...]:
    # PartitionRef's fields, without building one per key.
    return (k.prefix, k.region, k.topic, k.partition, k.incarnation)


def affected(changed: Iterable[SegmentKey], keys: Iterable[SegmentKey]) -> set[SegmentKey]:
    """The keys of ``keys`` (and of ``changed``) whose offsets overlap a changed key of
    their partition: the only ones whose place in the table a change can move (a key is
    hidden only by a key containing it, which overlaps whatever it overlaps).
    """
    ranges: dict[tuple[object, ...], list[tuple[int, int]]] = defaultdict(list)
    out = set(changed)
    for c in out:
        ranges[_partition(c)].append((c.start, c.end))
    for k in keys:
        spans = ranges.get(_partition(k))
        if spans and any(start <= k.end and k.start <= end for start, end in spans):
            out.add(k)
    return out
