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
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

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
        output = SegmentKey(first.prefix, first.region, first.topic, first.partition,
                            max(k.level for k in keys) + 1, first.start, self.end)
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
