"""The offset map: where each replicated source record landed in the destination.

Ingress writes one entry per produced batch (a source partition's run of records replayed
into one destination partition) to the offset-map topic, in the same transaction as the
records, so the map never claims a record that is not committed. An entry says: the
records of source offsets ``[src_first, src_last]`` except the ``holes`` (source offsets
without a record: transaction markers, aborted or compacted-away records) sit at the
consecutive destination offsets ``dest_first .. dest_first + count - 1``.

``translate`` answers the failover question exactly (docs/failover.md): a consumer group
that committed source offset ``C`` (the next record it would read) must resume in the
destination at the destination offset of the first replicated record whose source offset
is ``>= C``.

* key: ``{source_region}:{source_topic}:{partition}:{destination_topic}:{src_first:020d}``
  (one per entry, so the compacted topic keeps every entry until it is pruned with a
  tombstone);
* value: JSON ``{"src_first", "src_last", "dest_first", "count", "holes": [[a, b], ...]}``,
  ``"from_origin": true`` on a partition's first entry, and ``"incarnation"``: the
  destination topic's id when the entry was written (``live_entries`` keeps only the
  current topic's entries, so a recreated destination topic's old entries are never used),
  and ``"source_incarnation"``: the source topic's incarnation the records came from (its
  label in ``_topic.json``; absent for the first one), so an offset of one source
  incarnation is never translated through another's entries (``of_source``).

``entries_of`` builds entries from a batch's source offsets column-wise (no per-record
Python work); an entry carries at most ``MAX_HOLES`` hole runs, more split the batch.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from replicator.core.wire import json_object

MAX_HOLES = 64
"""Hole runs per entry (plus one at each end of a batch); a batch with more (a compacted
source) becomes several entries."""
_DIGITS = 20


@dataclass(frozen=True, order=True)
class OffsetMapEntry:
    """Source records ``[src_first, src_last]`` minus ``holes`` at destination offsets
    ``dest_first .. dest_first + count - 1`` (see the module docstring).
    """

    src_first: int
    src_last: int
    dest_first: int
    count: int
    holes: tuple[tuple[int, int], ...] = ()
    from_origin: bool = False
    """The partition's first entry: its replication began at ``src_first`` (records below
    were never replicated: deleted or compacted away before egress read them)."""
    incarnation: str | None = field(default=None, compare=False)
    """The destination topic's id (Kafka's topic id) when the entry was written; ``None``
    in entries written before the map recorded it."""
    source_incarnation: str = field(default="", compare=False)
    """The source topic's incarnation the records came from (``""``: the first one)."""

    def __post_init__(self) -> None:
        hole_positions = sum(b - a + 1 for a, b in self.holes)
        if self.count < 1 or self.src_first > self.src_last or self.dest_first < 0 \
                or self.src_last - self.src_first + 1 - hole_positions != self.count:
            raise ValueError(f"inconsistent offset-map entry {self}")

    @property
    def dest_next(self) -> int:
        """The destination offset after this entry's last record."""
        return self.dest_first + self.count

    def records_before(self, offset: int) -> int:
        """How many of this entry's records have a source offset ``< offset``."""
        if offset <= self.src_first:
            return 0
        if offset > self.src_last:
            return self.count
        missing = sum(min(b, offset - 1) - a + 1 for a, b in self.holes if a < offset)
        return offset - self.src_first - missing

    def encode(self) -> bytes:
        """The JSON value."""
        doc: dict[str, object] = {"src_first": self.src_first, "src_last": self.src_last,
                                  "dest_first": self.dest_first, "count": self.count,
                                  "holes": [list(h) for h in self.holes]}
        if self.from_origin:
            doc["from_origin"] = True
        if self.incarnation is not None:
            doc["incarnation"] = self.incarnation
        if self.source_incarnation:
            doc["source_incarnation"] = self.source_incarnation
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, value: bytes | None, *, where: str) -> OffsetMapEntry:
        """Parse a value.

        Raises:
            ValueError: naming ``where``: not JSON, a field missing or not a non-negative
                int, holes not ``[[a, b], ...]``, or numbers that do not add up.
        """
        doc = json_object(value, where, if_null=f"{where}: tombstone")
        nums = {}
        for name in ("src_first", "src_last", "dest_first", "count"):
            v = doc.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{where}: {name!r} must be an int >= 0, got {v!r}")
            nums[name] = v
        raw = doc.get("holes", [])
        if not isinstance(raw, list) or not all(
                isinstance(h, list) and len(h) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in h)
                for h in raw):
            raise ValueError(f"{where}: 'holes' must be a list of [first, last] pairs")
        incarnation = doc.get("incarnation")
        if incarnation is not None and not isinstance(incarnation, str):
            raise ValueError(f"{where}: 'incarnation' must be a string, got {incarnation!r}")
        source = doc.get("source_incarnation", "")
        if not isinstance(source, str):
            raise ValueError(f"{where}: 'source_incarnation' must be a string, got {source!r}")
        try:
            return cls(nums["src_first"], nums["src_last"], nums["dest_first"], nums["count"],
                       tuple((a, b) for a, b in raw), doc.get("from_origin") is True,
                       incarnation, source)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e


def map_key(region: str, topic: str, partition: int, destination: str, src_first: int) -> str:
    """The key of one entry (sorted keys of a partition are in source-offset order)."""
    return f"{region}:{topic}:{partition}:{destination}:{src_first:0{_DIGITS}d}"


MapPartition = tuple[str, str, int, str]
"""(source region, source topic, partition, destination topic)."""


def parse_map_key(key: str) -> tuple[MapPartition, int] | None:
    """``((region, topic, partition, destination), src_first)``, or ``None`` for another key."""
    parts = key.split(":")
    if len(parts) != 5:
        return None
    region, topic, partition, destination, first = parts
    if not (partition.isascii() and partition.isdigit() and first.isascii()
            and first.isdigit() and len(first) == _DIGITS) or not all(
                (region, topic, destination)):
        return None
    return (region, topic, int(partition), destination), int(first)


def entries_of(src_offsets: Sequence[int] | np.ndarray, dest_first: int, *,
               first: int | None = None, last: int | None = None,
               from_origin: bool = False, incarnation: str | None = None,
               source_incarnation: str = "") -> list[OffsetMapEntry]:
    """Entries for a batch whose records (source offsets ascending) were produced to
    consecutive destination offsets from ``dest_first``.

    ``first``/``last``: the source positions the batch replayed (from the position it
    resumed at to the one before the next batch's), so positions without a record at either
    end are holes of the map too and the entries of a partition tile its position space.
    Default: the first and last record's offsets. ``from_origin``: the batch is the
    partition's first (its first entry is marked). ``incarnation``: the destination topic's
    id, recorded in every entry; ``source_incarnation``: the source topic's incarnation.
    """
    offs = np.asarray(src_offsets, dtype=np.int64)
    n = len(offs)
    if n == 0:
        return []
    lo = int(offs[0]) if first is None else first
    hi = int(offs[-1]) if last is None else last
    if lo > int(offs[0]) or hi < int(offs[-1]):
        raise ValueError(f"positions [{lo}, {hi}] do not contain the batch's offsets "
                         f"[{int(offs[0])}, {int(offs[-1])}]")
    gaps = np.flatnonzero(np.diff(offs) > 1)   # record i is followed by a hole
    out: list[OffsetMapEntry] = []
    start, h = 0, 0       # the entry's first record; its first hole (an index into gaps)
    while start < n:
        if h + MAX_HOLES >= len(gaps):
            end, inner = n - 1, gaps[h:]
        else:
            # Up to the record before the MAX_HOLES-th hole: that hole ends this entry,
            # so the entries touch in position space.
            end, inner = int(gaps[h + MAX_HOLES - 1]), gaps[h:h + MAX_HOLES]
        holes = [(int(offs[i]) + 1, int(offs[i + 1]) - 1) for i in inner]
        src_first = int(offs[start])
        src_last = int(offs[end]) if end == n - 1 else int(offs[end + 1]) - 1
        if start == 0 and lo < src_first:
            holes.insert(0, (lo, src_first - 1))
            src_first = lo
        if end == n - 1 and hi > src_last:
            holes.append((src_last + 1, hi))
            src_last = hi
        out.append(OffsetMapEntry(src_first, src_last, dest_first + start, end - start + 1,
                                  tuple(holes), from_origin and start == 0, incarnation,
                                  source_incarnation))
        start, h = end + 1, h + len(inner)
    return out


def of_source(entries: Iterable[OffsetMapEntry], source_incarnation: str
              ) -> list[OffsetMapEntry]:
    """The entries of records from one incarnation of the source topic (its label in
    ``_topic.json``; ``""``: the first one): a topic deleted and created again starts its
    offsets at 0 again, so another incarnation's entries say nothing about its offsets.
    """
    return [e for e in entries if e.source_incarnation == source_incarnation]


def live_entries(entries: Iterable[OffsetMapEntry], incarnation: str | None
                 ) -> list[OffsetMapEntry]:
    """The entries of one partition that describe the destination as it is now, sorted by
    ``src_first``.

    * Only entries of the destination topic's current ``incarnation`` (its topic id): a
      recreated topic's old entries point into a log that no longer exists. Entries without
      an incarnation (written before the map recorded it) are used only when no entry of
      the partition has one. ``incarnation`` ``None`` (the topic is missing): only those.
    * Only the newest replay: in write order (destination offsets grow as entries are
      written), an entry marked ``from_origin`` after others, or a source range starting at
      or below the previous entry's end, means replication started again (a checkpoint
      reset), and every entry before it is dropped;
      the records below the new start then exist twice in the destination, so the first
      kept entry loses ``from_origin`` (an offset below it is ``unmapped``).
    """
    every = list(entries)
    if any(e.incarnation is not None for e in every):
        pool = [e for e in every if e.incarnation is not None and e.incarnation == incarnation]
    else:
        pool = every
    pool.sort(key=lambda e: e.dest_first)
    start = 0
    for k in range(1, len(pool)):
        # A replay that starts again writes ``from_origin`` on its first entry (ingress
        # marks only the batch that starts a partition without a checkpoint), and one that
        # goes back overlaps what was written before.
        if pool[k].from_origin or pool[k].src_first <= pool[k - 1].src_last:
            start = k
    live = pool[start:]
    if start and live:
        live[0] = replace(live[0], from_origin=False)
    live.sort()
    return live


State = Literal["translated", "waiting", "unmapped"]


@dataclass(frozen=True)
class Translation:
    """Where a group resumes in the destination.

    ``offset``: the destination offset to commit (``None`` when nothing can be said).
    ``state``: ``translated`` (exact), ``waiting`` (the group is ahead of what is
    replicated; ``offset`` is where the replicated part ends, so committing it moves the
    group as far as the data), ``unmapped`` (the map cannot prove where the group resumes;
    ``reason`` says why).
    """

    offset: int | None
    state: State
    reason: str = ""


def translate(entries: Sequence[OffsetMapEntry], committed: int, replicated: int | None
              ) -> Translation:
    """Translate source offset ``committed`` of one partition.

    Exact only where the map proves it: the offset lies in an entry's positions, or right
    after one (the records from there on sit after the entry's last one), or below a
    partition's first entry that is where replication began. An offset inside a gap
    between two entries (positions the map does not cover: replicated while the map was
    off, a batch that was not consecutive in the destination) is ``unmapped``: the gap may
    hold records, and where they are is unknown.

    Args:
        entries: the partition's live entries (``live_entries``), sorted by ``src_first``.
        committed: the group's committed source offset (next record to read).
        replicated: the partition's replication position (the next source position
            ingress replays, from its checkpoint), ``None`` if unknown.
    """
    if not entries:
        return Translation(None, "unmapped", "no offset-map entry for this partition")
    if replicated is None:
        return Translation(None, "unmapped", "no checkpoint: how far the partition is "
                           "replicated is unknown")
    target = min(committed, replicated)
    first = entries[0]
    if target < first.src_first:
        # Below the map: exact only if replication began there (nothing below it exists
        # in the destination); otherwise the map does not reach back this far.
        if first.from_origin:
            return Translation(first.dest_first,
                               "waiting" if committed > replicated else "translated")
        return Translation(None, "unmapped", f"offset {target} is below the map, which "
                           f"begins at {first.src_first} (replicated before the map existed, "
                           "pruned, the destination topic recreated or replication started "
                           "again)")
    i = bisect.bisect_right([e.src_first for e in entries], target) - 1
    e = entries[i]
    if target <= e.src_last + 1:
        # Inside the entry, or right after it: every record at or after ``target`` was
        # written after the entry's records before ``target``.
        offset = e.dest_first + e.records_before(target)
    elif i + 1 < len(entries):
        nxt = entries[i + 1]
        return Translation(None, "unmapped", f"source positions {e.src_last + 1}.."
                           f"{nxt.src_first - 1} have no map entry (replicated while the map "
                           "was off, or not consecutive in the destination): where offset "
                           f"{target} resumes cannot be proven")
    else:
        return Translation(None, "unmapped", f"source positions {e.src_last + 1}.."
                           f"{replicated - 1} were replicated without map entries (the map "
                           "was off, at-least-once, or a batch not consecutive in the "
                           "destination)")
    if committed > replicated:
        return Translation(offset, "waiting")
    return Translation(offset, "translated")
