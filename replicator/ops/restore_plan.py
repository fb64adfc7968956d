"""The restore planner: which segments a restore reads, and what it refuses (pure).

``plan(segments, request)`` picks, per partition, the fewest segments of any level that
cover the requested offset range (docs/restore.md):

* **Cover.** From the first position of the range, take among the segments that contain
  it the one reaching furthest (a compacted, higher-level segment replaces the level-0
  ones it covers; on a tie the higher level), then continue after its end. Segments that
  need an S3 restore first (``ARCHIVE_CLASSES``) are taken only where no readable segment
  contains the position.
* **Never a record twice.** Each step restores ``first..last`` of its segment: where two
  chosen segments overlap (overlapping levels, or the range's edges) the later one starts
  after the earlier one's end, and the range's bounds cut the first and last step.
* **Time bounds.** A step whose footer time range (``min_timestamp``/``max_timestamp``)
  misses the requested times is dropped; a segment without footer times is kept (the
  caller reads such segments to find their times and plans again; records are filtered
  by their own timestamp either way).
* **Gaps.** Positions of the range that no segment contains are named in the plan, with
  time bounds too: record times are not ordered by offset (a producer's clock, a backfill),
  so nothing says a missing record's time is outside the bounds. A time-bounded restore
  over a hole is refused unless gaps are allowed, or the offset bounds leave the hole out.

* **A snapshot.** With ``listed`` (the data files a snapshot of the topic's Iceberg table
  lists, docs/archive.md), only those segments are read; a listed segment
  no longer in the bucket is ``missing``: refused (the snapshot is older than the objects
  kept) unless gaps are allowed, when its positions are gaps like any other.

Offsets of a partition's segments touch (``next.start == prev.end + 1`` across the source's
own offset holes), so a position no segment contains is missing from the archive.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from replicator.core.keys import SegmentKey

ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
"""Storage classes whose objects must be restored (S3 ``RestoreObject``) before a GET.
``GLACIER_IR`` (instant retrieval) and the ``STANDARD``/``*_IA`` classes are readable."""


@dataclass(frozen=True)
class ArchivedSegment:
    """A segment as a listing (and, once read, its footer) describes it."""

    key: SegmentKey
    size: int
    storage_class: str | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None

    @property
    def readable(self) -> bool:
        """False when S3 must restore the object before it can be read."""
        return (self.storage_class or "STANDARD") not in ARCHIVE_CLASSES

    @property
    def has_times(self) -> bool:
        """True when the record-time range is known."""
        return self.min_timestamp is not None and self.max_timestamp is not None


@dataclass(frozen=True)
class RestoreRange:
    """What to restore: inclusive offset and record-time (ms) bounds, each optional."""

    from_offset: int | None = None
    to_offset: int | None = None
    from_time: int | None = None
    to_time: int | None = None

    def __post_init__(self) -> None:
        if None not in (self.from_offset, self.to_offset) and \
                self.from_offset > self.to_offset:  # type: ignore[operator]
            raise ValueError(f"--from-offset {self.from_offset} is after --to-offset "
                             f"{self.to_offset}")
        if None not in (self.from_time, self.to_time) and \
                self.from_time > self.to_time:  # type: ignore[operator]
            raise ValueError(f"--from-time {self.from_time} is after --to-time {self.to_time}")

    @property
    def timed(self) -> bool:
        """True when a time bound is given."""
        return self.from_time is not None or self.to_time is not None

    def time_overlaps(self, seg: ArchivedSegment) -> bool:
        """False only when the segment's known times all lie outside the time bounds."""
        if not self.timed or not seg.has_times:
            return True
        lo = self.from_time if self.from_time is not None else seg.min_timestamp
        hi = self.to_time if self.to_time is not None else seg.max_timestamp
        return seg.max_timestamp >= lo and seg.min_timestamp <= hi  # type: ignore[operator]

    def keeps_time(self, ts: int) -> bool:
        """True when a record of time ``ts`` is inside the time bounds."""
        return (self.from_time is None or ts >= self.from_time) and \
            (self.to_time is None or ts <= self.to_time)


@dataclass(frozen=True)
class Step:
    """One segment to read, and the positions ``first..last`` restored from it."""

    segment: ArchivedSegment
    first: int
    last: int

    @property
    def positions(self) -> int:
        """Offsets ``first..last`` (an upper bound on its records: offsets have holes)."""
        return self.last - self.first + 1

    @property
    def est_bytes(self) -> int:
        """The stored bytes of its share of the segment (pro rata of positions)."""
        return self.segment.size * self.positions // self.segment.key.span


@dataclass(frozen=True)
class PartitionPlan:
    """One partition: its steps in offset order and the positions missing."""

    partition: int
    first: int | None
    last: int | None
    steps: tuple[Step, ...] = ()
    gaps: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Plan:
    """Every partition's steps; what the restore would refuse."""

    range: RestoreRange
    partitions: tuple[PartitionPlan, ...] = field(default=())
    snapshot: int | None = None
    """The table snapshot whose files are read (``None``: the bucket's listing)."""
    missing: tuple[SegmentKey, ...] = ()
    """Segments the snapshot lists that are no longer in the bucket."""

    @property
    def steps(self) -> list[Step]:
        """All steps, partition by partition."""
        return [s for p in self.partitions for s in p.steps]

    @property
    def gaps(self) -> list[tuple[int, int, int]]:
        """``(partition, first, last)`` of every missing range."""
        return [(p.partition, a, b) for p in self.partitions for a, b in p.gaps]

    @property
    def needs_restore(self) -> list[Step]:
        """Steps whose segment must be restored from an archive storage class first."""
        return [s for s in self.steps if not s.segment.readable]

    @property
    def without_times(self) -> list[Step]:
        """Steps whose segment's record times are unknown (with time bounds only)."""
        return [s for s in self.steps if self.range.timed and not s.segment.has_times]

    @property
    def bytes_to_read(self) -> int:
        """Stored bytes of every segment read (whole segments are streamed)."""
        return sum(s.segment.size for s in self.steps)

    @property
    def est_records(self) -> int:
        """Offsets restored at most (offset holes and time bounds make it fewer)."""
        return sum(s.positions for s in self.steps)

    @property
    def est_bytes(self) -> int:
        """Stored bytes of the restored positions (pro rata)."""
        return sum(s.est_bytes for s in self.steps)

    def snapshot_refusals(self, *, allow_gaps: bool = False) -> list[str]:
        """Why the snapshot cannot be restored (empty when it can): segments it lists
        that compaction or lifecycle deleted since, unless ``allow_gaps``.
        """
        if not self.missing or allow_gaps:
            return []
        shown = ", ".join(str(k) for k in self.missing[:5])
        more = f" and {len(self.missing) - 5} more" if len(self.missing) > 5 else ""
        return [f"snapshot {self.snapshot} lists {len(self.missing)} segment(s) no longer "
                f"in the bucket: {shown}{more}; the snapshot is older than the objects kept "
                "(compaction or lifecycle deleted them since): restore a later snapshot, "
                "or --allow-gaps skips their positions"]

    def refusals(self, *, allow_gaps: bool = False) -> list[str]:
        """Why this plan cannot run as it is (empty when it can).

        Segments in an archive storage class are always refused (named, with their class);
        gaps unless ``allow_gaps``.
        """
        out = [f"{s.segment.key} is in storage class {s.segment.storage_class}: restore it "
               f"from the archive first (S3 RestoreObject), then run again"
               for s in self.needs_restore]
        if not allow_gaps:
            why = ("their records' times are unknown, so they may fall inside the time "
                   "bounds; --from-offset/--to-offset can leave them out, "
                   if self.range.timed else "")
            out += [f"{_where(self, p)}: positions {a}-{b} ({b - a + 1}) are missing from "
                    f"the archive ({why}--allow-gaps skips them)" for p, a, b in self.gaps]
            out += [f"partition {p.partition} has no segment in the archive"
                    for p in self.partitions if p.first is None]
        return out


def _where(plan: Plan, partition: int) -> str:
    for p in plan.partitions:
        for s in p.steps:
            return f"{s.segment.key.region}/{s.segment.key.topic}[{partition}]"
    return f"partition {partition}"


def with_times(segments: Iterable[ArchivedSegment],
               times: dict[SegmentKey, tuple[int, int]]) -> list[ArchivedSegment]:
    """``segments`` with the record-time ranges of ``times`` filled in."""
    return [replace(s, min_timestamp=times[s.key][0], max_timestamp=times[s.key][1])
            if s.key in times else s for s in segments]


def plan(segments: Iterable[ArchivedSegment], rng: RestoreRange,
         partitions: Sequence[int] | None = None, *,
         listed: Collection[SegmentKey] | None = None, snapshot: int | None = None) -> Plan:
    """The steps of a restore of ``rng`` from ``segments`` (of one topic of one region).

    Args:
        segments: the topic's segments, any level, any partition.
        rng: the offset and time bounds (open bounds: the archive's first/last position,
            with ``listed``: the first/last position the snapshot lists).
        partitions: which partitions (default: every partition with a segment, with
            ``listed``: every partition the snapshot lists).
        listed: only these segments (a table snapshot's data files); those not among
            ``segments`` are the plan's ``missing``.
        snapshot: the snapshot ``listed`` comes from (named in refusals).
    """
    extent: dict[int, tuple[int, int]] = {}
    missing: list[SegmentKey] = []
    if listed is not None:
        wanted_keys = set(listed)
        present = {s.key for s in segments}
        segments = [s for s in segments if s.key in wanted_keys]
        for k in wanted_keys:
            a, b = extent.get(k.partition, (k.start, k.end))
            extent[k.partition] = (min(a, k.start), max(b, k.end))
        missing = sorted((k for k in wanted_keys - present
                          if partitions is None or k.partition in partitions),
                         key=lambda k: (k.partition, k.start, k.level))
    by_part: dict[int, list[ArchivedSegment]] = {}
    for s in segments:
        by_part.setdefault(s.key.partition, []).append(s)
    known = set(by_part) | set(extent)
    wanted = sorted(known) if partitions is None else sorted(set(partitions))
    return Plan(rng, tuple(_plan_partition(p, by_part.get(p, []), rng, extent.get(p))
                           for p in wanted), snapshot, tuple(missing))


def _plan_partition(partition: int, segs: list[ArchivedSegment], rng: RestoreRange,
                    extent: tuple[int, int] | None = None) -> PartitionPlan:
    if not segs:
        lo_, hi_ = extent if extent is not None else (None, None)
        lo_ = rng.from_offset if rng.from_offset is not None else lo_
        hi_ = rng.to_offset if rng.to_offset is not None else hi_
        if lo_ is not None and hi_ is not None and lo_ <= hi_:
            return PartitionPlan(partition, lo_, hi_, (), ((lo_, hi_),))
        return PartitionPlan(partition, None, None)
    segs = sorted(segs, key=lambda s: (s.key.start, -s.key.end, -s.key.level))
    first = segs[0].key.start if extent is None else min(extent[0], segs[0].key.start)
    end = max(s.key.end for s in segs)
    end = end if extent is None else max(extent[1], end)
    lo = rng.from_offset if rng.from_offset is not None else first
    hi = rng.to_offset if rng.to_offset is not None else end
    # (first, last, step or None for a gap): the cover in offset order.
    pieces: list[tuple[int, int, Step | None]] = []
    pos, i = lo, 0
    open_: list[ArchivedSegment] = []
    while pos <= hi:
        while i < len(segs) and segs[i].key.start <= pos:
            open_.append(segs[i])
            i += 1
        open_ = [s for s in open_ if s.key.end >= pos]
        if not open_:
            nxt = segs[i].key.start if i < len(segs) else hi + 1
            end = min(hi, nxt - 1)
            pieces.append((pos, end, None))
            pos = end + 1
            continue
        pool = [s for s in open_ if s.readable] or open_
        best = max(pool, key=lambda s: (s.key.end, s.key.level, -s.size))
        last = min(best.key.end, hi)
        pieces.append((pos, last, Step(best, pos, last)))
        pos = last + 1
    steps = tuple(step for _, _, step in pieces
                  if step is not None and rng.time_overlaps(step.segment))
    # Every hole counts, with time bounds too: a missing record's time is unknown (times
    # are not ordered by offset), so it may lie inside the bounds.
    gaps = tuple((a, b) for a, b, step in pieces if step is None)
    return PartitionPlan(partition, lo, hi, steps, gaps)
