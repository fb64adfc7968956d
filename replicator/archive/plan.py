"""Which segments a table lists, and what a commit changes: pure functions.

A table lists, per source partition, every offset position of the bucket's segments
exactly once: each position belongs to one segment (``claims``), and a segment is listed
whole when it keeps all of its range, as a trimmed copy of the positions it keeps when
other segments hold some of them, and not at all when they hold all of them. A compaction
output hides the inputs it was merged from (while both exist); two segments egress wrote
over the same positions (a rebalance or a failed offset commit after a copy) share them
without listing any record twice. What a commit changes follows from the table's files
and a listing of the bucket made **after** the table was loaded: a file of the table that
the listing lacks was deleted (compaction deletes only what the table no longer lists;
anything else is a lifecycle rule, retention or an operator), and a concurrent commit is
refused by the catalog, after which both are read again.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from replicator.core.keys import PartitionRef, SegmentKey


def visible(keys: Iterable[SegmentKey]) -> set[SegmentKey]:
    """The keys no other key covers (same partition, a range containing theirs, and larger,
    or equal at a higher level).
    """
    by_part: dict[PartitionRef, list[SegmentKey]] = defaultdict(list)
    for k in set(keys):
        by_part[k.partition_ref].append(k)
    out: set[SegmentKey] = set()
    for ks in by_part.values():
        # Start ascending, then the widest and highest first: a key is covered exactly
        # when a key before it reaches at least as far.
        ks.sort(key=lambda k: (k.start, -k.end, -k.level))
        reach = -1
        for k in ks:
            if k.end > reach:
                out.add(k)
                reach = k.end
    return out


@dataclass(frozen=True, order=True)
class Piece:
    """The positions ``lo``..``hi`` (inclusive) of segment ``key``: the whole segment, or
    the rows of a trimmed copy of it.
    """

    key: SegmentKey
    lo: int
    hi: int

    @property
    def whole(self) -> bool:
        return (self.lo, self.hi) == (self.key.start, self.key.end)

    @classmethod
    def of(cls, key: SegmentKey) -> Piece:
        return cls(key, key.start, key.end)

    def __str__(self) -> str:
        return str(self.key) if self.whole else f"{self.key}[{self.lo}-{self.hi}]"


def claims(keys: Iterable[SegmentKey], prefer: Iterable[SegmentKey] = (),
           listed: Iterable[SegmentKey] = ()) -> set[Piece]:
    """Per partition, the pieces that hold every position of ``keys``' ranges once.

    A key another key covers gets nothing (``visible``: a compaction output hides its
    inputs). The others, which only partly overlap, claim positions in order: the keys
    the table lists whole (``prefer``; they never overlap one another), then those it
    lists trimmed copies of (``listed``), then new ones — so a segment that lands late is
    trimmed and what the table lists stays, and a commit never adds a file that holds
    positions a file it keeps already holds —; within each, the widest first (trimmed
    copies stay small), the highest level, then by start. A key gets the positions of its
    range no earlier key took: its whole range (``Piece.whole``), part of it (one or more
    trimmed pieces), or nothing.
    """
    whole = set(prefer)
    trimmed = set(listed)
    by_part: dict[PartitionRef, list[SegmentKey]] = defaultdict(list)
    for k in visible(keys):
        by_part[k.partition_ref].append(k)
    out: set[Piece] = set()
    for ks in by_part.values():
        ks.sort(key=lambda k: (0 if k in whole else 1 if k in trimmed else 2, -k.span,
                               -k.level, k.start, k.end, k.to_key()))
        # Disjoint, sorted, never adjacent: what earlier keys took.
        starts: list[int] = []
        ends: list[int] = []
        for k in ks:
            i = bisect.bisect_left(ends, k.start)   # first taken interval ending at/after start
            lo = k.start
            j = i
            while j < len(starts) and starts[j] <= k.end:
                if starts[j] > lo:
                    out.add(Piece(k, lo, starts[j] - 1))
                lo = max(lo, ends[j] + 1)
                j += 1
            if lo <= k.end:
                out.add(Piece(k, lo, k.end))
            # The union of the taken intervals i..j-1 and the key's range.
            a = min(k.start, starts[i]) if i < j else k.start
            b = max(k.end, ends[j - 1]) if i < j else k.end
            # Merge with neighbours that touch it (adjacent positions).
            if i > 0 and ends[i - 1] + 1 == a:
                i -= 1
                a = starts[i]
            if j < len(starts) and starts[j] - 1 == b:
                b = ends[j]
                j += 1
            starts[i:j] = [a]
            ends[i:j] = [b]
    return out


@dataclass(frozen=True)
class TablePlan:
    """What one commit changes: keys to add whole, trimmed pieces to write and add, table
    paths to remove (and why).
    """

    add: list[SegmentKey] = field(default_factory=list)
    remove_covered: list[str] = field(default_factory=list)
    """Files whose records other listed files hold, or that compaction is about to delete
    (``deleting``)."""
    remove_gone: list[str] = field(default_factory=list)
    """Files no longer in the bucket (lifecycle, retention, an operator): a trimmed copy
    whose segment left the bucket is one of them."""
    trim: list[Piece] = field(default_factory=list)
    """Pieces of segments to list as trimmed copies (written by the caller)."""

    @property
    def empty(self) -> bool:
        return not (self.add or self.trim or self.remove_covered or self.remove_gone)

    @property
    def remove(self) -> list[str]:
        return sorted([*self.remove_covered, *self.remove_gone])


def _no_trims(_path: str) -> Piece | None:
    return None


def plan_table(table_paths: Iterable[str], listed: Iterable[SegmentKey], *,
               url: Callable[[SegmentKey], str],
               key_of: Callable[[str], SegmentKey | None],
               trim_of: Callable[[str], Piece | None] = _no_trims,
               unaddable: Iterable[SegmentKey] = (),
               deleting: Iterable[SegmentKey] = ()) -> TablePlan:
    """The commit that makes the table list exactly ``claims`` of the listing (a piece
    the commit would add that holds both positions of files it removes as covered and
    positions no file held is added as two or more trimmed copies, ``split_at``, and
    copies that together hold a claimed piece count as listing it).

    Args:
        table_paths: the files of the table's current snapshot.
        listed: the segments in the bucket (listed after the table was loaded).
        url: a key's file path in the table.
        key_of: a path's key (``None``: not a segment of this topic).
        trim_of: the piece a trimmed copy's path holds (``None``: not a trimmed copy;
            a path neither names is left alone).
        unaddable: segments that cannot be data files (not Parquet): they neither enter the
            table nor hide what they cover.
        deleting: segments about to be deleted (compaction): treated as gone.
    """
    deleted = set(deleting)
    skip = set(unaddable) | deleted
    present = set(listed) - deleted
    in_table: dict[Piece, list[str]] = defaultdict(list)
    for path in table_paths:
        k = key_of(path)
        piece = Piece.of(k) if k is not None else trim_of(path)
        if piece is not None:
            in_table[piece].append(path)
    whole = {p.key for p in in_table if p.whole}
    target = claims((k for k in present if k not in skip), prefer=whole,
                    listed={p.key for p in in_table})
    keep, new = _unlisted(target, in_table)
    covered: list[str] = []
    gone: list[str] = []
    swapped_out: list[Piece] = []
    for piece, paths in in_table.items():
        extra = sorted(paths)[1:] if piece in keep else sorted(paths)
        for path in extra:
            if piece.key in present or piece.key in deleted:
                covered.append(path)
                swapped_out.append(piece)
            else:
                gone.append(path)
    # A new piece holding both positions the covered files held and positions no file
    # held is split (``split_at``): appended whole, the append snapshot would list the
    # former twice (the covered files leave in the later ``replace``); swapped in whole,
    # streaming readers, which skip replaces, would never read the latter.
    held = ranges_by_partition(swapped_out)
    new = [q for p in new for q in split_at(p, held.get(p.key.partition_ref, []))]
    add = sorted(p.key for p in new if p.whole)
    trim = sorted(p for p in new if not p.whole)
    return TablePlan(add, sorted(covered), sorted(gone), trim)


def _unlisted(target: set[Piece], in_table: Iterable[Piece]
              ) -> tuple[set[Piece], list[Piece]]:
    """The pieces of the table to keep (``target``'s, and the copies that together hold
    one of them), and the pieces of ``target`` the table does not list.
    """
    listed = set(in_table)
    keep = set(target)
    new: list[Piece] = []
    copies: dict[SegmentKey, list[Piece]] = defaultdict(list)
    for p in listed:
        if not p.whole:
            copies[p.key].append(p)
    for p in target:
        if p in listed:
            continue
        tiles = _tiling(p, copies.get(p.key, []))
        if tiles:
            keep |= tiles   # listed already, as the pieces an earlier commit split it into
        else:
            new.append(p)
    return keep, new


def _tiling(piece: Piece, copies: Iterable[Piece]) -> set[Piece]:
    """The ``copies`` (of ``piece``'s segment) that hold exactly its positions, each once
    (``split_at`` made them), or the empty set.
    """
    parts = sorted(q for q in copies if piece.lo <= q.lo and q.hi <= piece.hi)
    reach = piece.lo - 1
    for q in parts:
        if q.lo != reach + 1:
            return set()
        reach = q.hi
    return set(parts) if parts and reach == piece.hi else set()


def split_at(piece: Piece, ranges: Iterable[tuple[int, int, SegmentKey]]) -> list[Piece]:
    """``piece`` cut where the positions the sorted inclusive ``ranges`` hold begin and
    end: each part lies wholly inside them or wholly outside (``[piece]`` when it already
    does).
    """
    merged: list[list[int]] = []
    for a, b, _ in ranges:
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    cuts: list[Piece] = []
    lo = piece.lo
    for a, b in merged:
        if b < lo or a > piece.hi:
            continue
        if a > lo:
            cuts.append(Piece(piece.key, lo, a - 1))
        cuts.append(Piece(piece.key, max(a, lo), min(b, piece.hi)))
        lo = min(b, piece.hi) + 1
    if lo <= piece.hi and cuts:
        cuts.append(Piece(piece.key, lo, piece.hi))
    return cuts if len(cuts) > 1 else [piece]


def ranges_by_partition(pieces: Iterable[Piece]
                        ) -> dict[PartitionRef, list[tuple[int, int, SegmentKey]]]:
    """The pieces' ranges per partition, sorted (with the segment each is of)."""
    out: dict[PartitionRef, list[tuple[int, int, SegmentKey]]] = defaultdict(list)
    for p in pieces:
        out[p.key.partition_ref].append((p.lo, p.hi, p.key))
    for ranges in out.values():
        ranges.sort()
    return dict(out)


def holds(ranges: Iterable[tuple[int, int, SegmentKey]], lo: int, hi: int) -> bool:
    """True when the sorted inclusive ``ranges`` together hold every position of
    ``lo``..``hi``.
    """
    reach = lo - 1
    for a, b, _ in ranges:
        if a > reach + 1:
            return False   # reach + 1 (<= hi) is in no range
        reach = max(reach, b)
        if reach >= hi:
            return True
    return reach >= hi
