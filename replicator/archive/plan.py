"""Which segments a table lists, and what a commit changes: pure functions.

A table lists, per source partition, the segments of the bucket that no other segment
covers: a compaction output hides the inputs it was merged from (while both exist), so
every record is listed once. What a commit changes follows from the table's files and a
listing of the bucket made **after** the table was loaded: a file of the table that the
listing lacks was deleted (compaction deletes only what the table no longer lists; anything
else is a lifecycle rule, retention or an operator), and a concurrent commit is refused by
the catalog, after which both are read again.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class TablePlan:
    """What one commit changes: keys to add, table paths to remove (and why)."""

    add: list[SegmentKey] = field(default_factory=list)
    remove_covered: list[str] = field(default_factory=list)
    """Files whose records a listed segment covering them holds, or that compaction is
    about to delete (``deleting``)."""
    remove_gone: list[str] = field(default_factory=list)
    """Files no longer in the bucket (lifecycle, retention, an operator)."""

    @property
    def empty(self) -> bool:
        return not (self.add or self.remove_covered or self.remove_gone)

    @property
    def remove(self) -> list[str]:
        return sorted([*self.remove_covered, *self.remove_gone])


def plan_table(table_paths: Iterable[str], listed: Iterable[SegmentKey], *,
               url: Callable[[SegmentKey], str],
               key_of: Callable[[str], SegmentKey | None],
               unaddable: Iterable[SegmentKey] = (),
               deleting: Iterable[SegmentKey] = ()) -> TablePlan:
    """The commit that makes the table list exactly ``visible`` of the listing.

    Args:
        table_paths: the files of the table's current snapshot.
        listed: the segments in the bucket (listed after the table was loaded).
        url: a key's file path in the table.
        key_of: a path's key (``None``: not a segment of this topic; left alone).
        unaddable: segments that cannot be data files (not Parquet): they neither enter the
            table nor hide what they cover.
        deleting: segments about to be deleted (compaction): treated as gone.
    """
    deleted = set(deleting)
    skip = set(unaddable) | deleted
    present = set(listed) - deleted
    target = visible(k for k in present if k not in skip)
    in_table: dict[SegmentKey, str] = {}
    for path in table_paths:
        k = key_of(path)
        if k is not None:
            in_table[k] = path
    add = sorted(k for k in target if k not in in_table)
    covered: list[str] = []
    gone: list[str] = []
    for k, path in sorted(in_table.items()):
        if k in target:
            continue
        (covered if k in present or k in deleted else gone).append(path)
    return TablePlan(add, covered, gone)
