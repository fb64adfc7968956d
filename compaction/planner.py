"""Which segments to merge: a pure function of a partition's listing, the thresholds and now.

The planner works on one (topic, partition) at a time. Its rules:

* **Inputs** are segments whose level lies in ``[min_level, max_level]`` and that are older
  than ``min_segment_age``. The walk stops at the first segment that is too young, so a
  segment still settling never looks like a hole.
* **Higher levels.** Segments above ``max_level`` were written by earlier compactions.
  Candidates entirely covered by one of them are leftovers of a run that died before
  deleting its inputs: they are scheduled for deletion (``covered_to_delete``), never read
  again. The candidates that are not covered are planned wherever they lie, also in the
  stretches *between* higher-level segments: when one merge task of a run failed and a
  later one succeeded, the failed range is merged by the next run instead of being
  stranded below the highest compacted end. A higher-level segment ends the run before it
  (a run never grows across one).
* **Runs.** Candidates are walked in start order. A candidate whose range lies inside what
  the run already holds is skipped (it is deleted once the run's output is durable); an
  overlapping one is read, and the merge keeps only offsets past those already written. A
  run ends at ``max_segment_count`` inputs or when the next input would push it past
  ``max_segment_size`` bytes; the next run starts there. Several tasks per partition are
  normal.
* **Holes.** Segments touch by position (``next.start == prev.end + 1``), so Kafka offset
  gaps never block. A real hole (``next.start > prev.end + 1``: a segment is missing) ends
  the run before it and is reported with its exact bounds; the walk continues after it.
  Holes are reported only before a candidate: a hole between two higher-level segments is
  not looked at again (not retried forever).
* **Minimums.** A run that can still grow (the last one) is skipped while it holds fewer
  than ``min_segment_count`` inputs or ``min_segment_size`` bytes. A run closed by a full
  successor or by a hole cannot grow, so it is merged if it has at least two inputs.
* **Output.** level = highest input level + 1; range = [first input start, **max** input
  end] (the original used the last appended input's end and could mislabel files). Keys are
  deterministic, so a re-run plans the same outputs.
* **Same content, not just the same positions** (``verify_plan``). Positions repeat when a
  topic is recreated or a partition truncated, so a segment covered by position may hold
  other records. Before anything covered is deleted unread, its footer is compared with the
  footers of what covers it (``contradiction``: record count, record-time range, and for a
  higher-level cover also when it was written: an output is written after its inputs). A
  covered segment that contradicts its cover is a ``Conflict``: it is neither deleted nor
  merged, its cover stays too, and a human decides. A merge whose unread covered segment
  contradicts the inputs holding its range is dropped whole, so a merge never mixes
  incarnations (records that overlapping inputs both hold are compared record by record
  as they are merged, ``compaction.merge``). The controller reads the footers, and only
  the footers (``footers_to_check`` says which).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from formats.base import SegmentMetadata
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.settings import CompactionTopicSettings


@dataclass(frozen=True)
class Listed:
    """One listed segment: its key, object size and last-modified time."""

    key: SegmentKey
    size: int
    last_modified: datetime


@dataclass(frozen=True)
class CompactionTask:
    """Merge ``inputs`` (in this order) into ``output``.

    ``covered`` are segments of the same range that need not be read (everything in them is
    in ``inputs``); they are deleted together with the inputs once the output is durable.
    ``bytes`` is the total size of ``inputs``.
    """

    inputs: tuple[SegmentKey, ...]
    output: SegmentKey
    bytes: int
    covered: tuple[SegmentKey, ...] = ()
    input_sizes: tuple[int, ...] = ()

    def describe(self) -> str:
        """``topic[partition] L0..L0 -> L1 start-end (n inputs, bytes)`` for logs."""
        levels = sorted({k.level for k in self.inputs})
        return (f"{self.output.topic}[{self.output.partition}] L{levels[0]}..L{levels[-1]}"
                f" -> L{self.output.level} {self.output.start}-{self.output.end} "
                f"({len(self.inputs)} inputs, {len(self.covered)} covered, {self.bytes} bytes)")


@dataclass(frozen=True)
class Hole:
    """Positions ``[start, end]`` of a partition for which no segment exists."""

    start: int
    end: int


@dataclass
class PartitionPlan:
    """What one compaction run does to one partition."""

    partition: PartitionRef
    tasks: list[CompactionTask] = field(default_factory=list)
    covered_to_delete: list[SegmentKey] = field(default_factory=list)
    holes_reported: list[Hole] = field(default_factory=list)
    covering: dict[SegmentKey, SegmentKey] = field(default_factory=dict)
    """For each of ``covered_to_delete``: the higher-level segment that holds it."""
    skipped_reason: str | None = None
    """Why (part of) the partition was not merged: too few/young segments, and so on."""

    @property
    def empty(self) -> bool:
        """True if the plan neither merges nor deletes anything."""
        return not self.tasks and not self.covered_to_delete


def plan(  # noqa: C901 - one ordered pass over the segments; its rules read as a list
        segments: Sequence[Listed] | Sequence[tuple[SegmentKey, int, datetime]],
        cfg: CompactionTopicSettings, now: datetime) -> PartitionPlan:
    """Plan the compaction of one partition.

    Args:
        segments: every listed segment of the partition (all levels), in any order.
        cfg: the topic's thresholds (with any ``--min-level``/``--max-level`` applied).
        now: the run's time, for ``min_segment_age`` (timezone-aware like ``last_modified``).

    Raises:
        ValueError: the segments belong to more than one partition.
    """
    listed = [s if isinstance(s, Listed) else Listed(*s) for s in segments]
    refs = {s.key.partition_ref for s in listed}
    if len(refs) > 1:
        raise ValueError(f"plan() takes one partition, got {sorted(str(r) for r in refs)}")
    if not listed:
        raise ValueError("plan() needs at least one segment")
    result = PartitionPlan(partition=refs.pop())

    higher = sorted((s.key for s in listed if s.key.level > cfg.max_level),
                    key=lambda k: (k.start, -k.end))
    covers = _Coverage(higher)

    # Bigger (higher-level, longer) segments first among equal starts: what they cover is
    # then recognised as covered instead of being read twice.
    candidates = sorted(
        (s for s in listed if cfg.min_level <= s.key.level <= cfg.max_level),
        key=lambda s: (s.key.start, -s.key.end, -s.key.level))
    if not candidates:
        result.skipped_reason = f"no segments at levels {cfg.min_level}..{cfg.max_level}"
        return result
    walk = sorted([*candidates, *(Listed(k, 0, now) for k in higher)],
                  key=lambda s: (s.key.start, -s.key.end, -s.key.level))

    runs: list[_Run] = []
    run = _Run()
    previous_end: int | None = None
    young: Listed | None = None
    for seg in walk:
        k = seg.key
        if k.level > cfg.max_level:
            # Compacted already: the run before it cannot grow past it.
            if run.inputs:
                run.closed = True
                runs.append(run)
                run = _Run()
            previous_end = k.end if previous_end is None else max(previous_end, k.end)
            continue
        cover = covers.cover(k)
        if cover is not None:
            result.covered_to_delete.append(k)
            result.covering[k] = cover
            continue
        if now - seg.last_modified < cfg.min_segment_age:
            young = seg
            break
        if run.inputs and k.end <= run.end:
            run.covered.append(k)
            continue
        if previous_end is not None and k.start > previous_end + 1:
            result.holes_reported.append(Hole(previous_end + 1, k.start - 1))
            if run.inputs:
                run.closed = True
                runs.append(run)
                run = _Run()
        elif run.inputs and (len(run.inputs) >= cfg.max_segment_count
                             or run.bytes + seg.size > cfg.max_segment_size):
            run.closed = True
            runs.append(run)
            run = _Run()
        run.add(seg)
        previous_end = k.end if previous_end is None else max(previous_end, k.end)
    if run.inputs:
        runs.append(run)

    reasons: list[str] = []
    for r in runs:
        reason = r.too_small(cfg)
        if reason is None:
            result.tasks.append(r.task())
        else:
            reasons.append(reason)
    if young is not None:
        reasons.append(f"segment {young.key.start}-{young.key.end} (L{young.key.level}) is "
                       f"younger than min_segment_age; later segments wait")
    if reasons:
        result.skipped_reason = "; ".join(reasons)
    return result


def plan_all(segments: Iterable[Listed], cfg: CompactionTopicSettings, now: datetime,
             ) -> list[PartitionPlan]:
    """``plan`` for every partition present in ``segments`` (ordered by partition)."""
    by_partition: dict[PartitionRef, list[Listed]] = defaultdict(list)
    for s in segments:
        by_partition[s.key.partition_ref].append(s)
    return [plan(by_partition[ref], cfg, now) for ref in sorted(by_partition)]


@dataclass
class _Run:
    inputs: list[Listed] = field(default_factory=list)
    covered: list[SegmentKey] = field(default_factory=list)
    end: int = -1
    bytes: int = 0
    closed: bool = False
    """True when the run cannot grow any more (a full successor or a hole follows)."""

    def add(self, seg: Listed) -> None:
        self.inputs.append(seg)
        self.end = max(self.end, seg.key.end)
        self.bytes += seg.size

    def too_small(self, cfg: CompactionTopicSettings) -> str | None:
        n = len(self.inputs)
        first, last = self.inputs[0].key.start, self.end
        if self.closed:
            if n >= 2 or (n >= cfg.min_segment_count and self.bytes >= cfg.min_segment_size):
                return None
            return f"{first}-{last}: a single segment between holes/full runs"
        if n < cfg.min_segment_count:
            return f"{first}-{last}: {n} segment(s) < min_segment_count {cfg.min_segment_count}"
        if self.bytes < cfg.min_segment_size:
            return (f"{first}-{last}: {self.bytes} bytes < min_segment_size "
                    f"{cfg.min_segment_size}")
        return None

    def task(self) -> CompactionTask:
        keys = [s.key for s in self.inputs]
        first = keys[0]
        # The inputs share one partition of one incarnation (``plan`` groups by
        # ``partition_ref``): the output stays in that incarnation's location.
        output = SegmentKey(first.prefix, first.region, first.topic, first.partition,
                            max(k.level for k in keys) + 1, first.start, self.end,
                            first.incarnation)
        return CompactionTask(tuple(keys), output, self.bytes, tuple(self.covered),
                              tuple(s.size for s in self.inputs))


class _Coverage:
    """Answers "is this range inside one higher-level segment?" in O(log n)."""

    def __init__(self, higher: list[SegmentKey]) -> None:
        self._starts = [k.start for k in higher]
        self._widest: list[SegmentKey] = []
        """Per prefix of ``higher``: the segment reaching furthest."""
        best: SegmentKey | None = None
        for k in higher:
            if best is None or k.end > best.end:
                best = k
            self._widest.append(best)

    def cover(self, k: SegmentKey) -> SegmentKey | None:
        """A higher-level segment holding all of ``k``, or ``None``."""
        i = bisect.bisect_right(self._starts, k.start) - 1
        if i >= 0 and self._widest[i].end >= k.end:
            return self._widest[i]
        return None


# --- same content, not just the same positions ------------------------------------------------


@dataclass(frozen=True)
class Conflict:
    """``segment`` lies inside ``holders`` by position, but its footer says it cannot hold
    the same records (another topic incarnation, a truncated or reset partition). Both are
    kept: nothing of them is deleted or merged until a human decides.
    """

    segment: SegmentKey
    holders: tuple[SegmentKey, ...]
    reason: str

    def describe(self) -> str:
        """One line naming both sides, for the ERROR and the run report."""
        held = ", ".join(k.to_key() for k in self.holders)
        return (f"{self.segment.to_key()} lies inside {held} by position but cannot hold the "
                f"same records ({self.reason}); both are kept, neither deleted nor merged")


def contradiction(part: SegmentMetadata, holders: Sequence[SegmentMetadata], *,
                  merged_into: bool) -> str | None:
    """Why ``part`` cannot hold only records that ``holders`` hold, or ``None``.

    Footer facts only (cheap to read): every record of ``part`` would be one of theirs, so
    it cannot hold more records than they do together, nor records with times outside
    theirs (checked when both sides carry the time range). With ``merged_into`` the single
    holder is a higher-level segment that ``part`` would be an input of; an output is
    written after its inputs, so ``part`` cannot have been written later. Without it (a
    segment inside a merge's other inputs), a later write is normal: egress rewrites a
    range it published but had not committed when it restarted.

    The footer's start and end offsets are the key's (``SegmentMetadata.check_key``) and it
    carries no topic id, so these are the facts there are. They err towards keeping: a
    range egress rewrote *after* it was merged (a crash between copy and commit, then down
    for longer than ``min_segment_age``) holds the same records but was written after the
    output, and is reported and kept like another incarnation.
    """
    reasons: list[str] = []
    total = sum(h.message_count for h in holders)
    if part.message_count > total:
        reasons.append(f"it has {part.message_count} records, they have {total}")
    times = [(h.min_timestamp, h.max_timestamp) for h in holders]
    if part.min_timestamp is not None and part.max_timestamp is not None and times \
            and all(lo is not None and hi is not None for lo, hi in times):
        lo = min(t[0] for t in times if t[0] is not None)
        hi = max(t[1] for t in times if t[1] is not None)
        if part.min_timestamp < lo or part.max_timestamp > hi:
            reasons.append(f"its record times {part.min_timestamp}..{part.max_timestamp} ms "
                           f"are not within theirs {lo}..{hi} ms")
    if merged_into and len(holders) == 1 and part.created_at > holders[0].created_at:
        reasons.append(f"it was written at {part.created_at.isoformat()}, after the "
                       f"segment covering it ({holders[0].created_at.isoformat()}), so it "
                       f"cannot be one of that segment's inputs")
    return "; ".join(reasons) or None


def _overlaps(a: SegmentKey, b: SegmentKey) -> bool:
    return a.start <= b.end and b.start <= a.end


def _holders(task: CompactionTask, covered: SegmentKey) -> tuple[SegmentKey, ...]:
    """The inputs of ``task`` whose range meets ``covered`` (together they hold it)."""
    return tuple(k for k in task.inputs if _overlaps(k, covered))


def footers_to_check(p: PartitionPlan) -> list[SegmentKey]:
    """The segments whose footers ``verify_plan`` needs: what would be deleted unread and
    what covers it. In the usual run (segments that touch, nothing left over) none.
    """
    keys: set[SegmentKey] = set(p.covered_to_delete)
    keys.update(p.covering[k] for k in p.covered_to_delete)
    for t in p.tasks:
        for c in t.covered:
            keys.add(c)
            keys.update(_holders(t, c))
    return sorted(keys, key=lambda k: (k.start, k.end, k.level))


FooterOrError = SegmentMetadata | str
"""A footer as read, or why it could not be read (corrupt, unknown format)."""


def verify_plan(p: PartitionPlan, footers: Mapping[SegmentKey, FooterOrError],
                ) -> tuple[PartitionPlan, list[Conflict]]:
    """The plan without what contradicts what covers it, and the conflicts found.

    ``footers`` holds what was read for ``footers_to_check(p)``; a key missing from it is
    gone (deleted meanwhile). A covered segment that is gone needs no deletion; one whose
    cover is gone is left for the next run. An unreadable footer is a conflict: nothing
    says the records are the same. A merge with a conflicting covered segment is dropped
    (its inputs and the covered segment stay); other merges are not affected.
    """
    conflicts: list[Conflict] = []

    def check(part: SegmentKey, holders: tuple[SegmentKey, ...], merged_into: bool) -> bool:
        """True if ``part`` may be deleted unread (or is gone)."""
        mine = footers.get(part)
        theirs = [footers.get(h) for h in holders]
        if mine is None:
            return True                     # gone already: deleting it is a no-op
        unreadable = [f"{k.to_key()}: {f}" for k, f in ((part, mine), *zip(holders, theirs,
                                                                           strict=True))
                      if isinstance(f, str)]
        if unreadable:
            conflicts.append(Conflict(part, holders, "footer unreadable: "
                                      + "; ".join(unreadable)))
            return False
        if any(f is None for f in theirs):
            # A cover gone: keep what it covered, the next run plans it again. An input of
            # a merge gone: the merge fails on it and says so.
            return not merged_into
        assert isinstance(mine, SegmentMetadata)
        why = contradiction(mine, [f for f in theirs if isinstance(f, SegmentMetadata)],
                            merged_into=merged_into)
        if why is not None:
            conflicts.append(Conflict(part, holders, why))
            return False
        return True

    covered = [k for k in p.covered_to_delete
               if k in footers and check(k, (p.covering[k],), True)]
    tasks = [t for t in p.tasks
             if all([check(c, _holders(t, c), False) for c in t.covered])]
    if not conflicts and len(covered) == len(p.covered_to_delete):
        return p, []
    return replace(p, tasks=tasks, covered_to_delete=covered,
                   covering={k: p.covering[k] for k in covered}), conflicts
