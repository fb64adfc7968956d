"""What a replay worker does next: a pure decision over its checkpoint and known segments.

Positions, not message counts: egress names segments by partition *position*
(``next.start == prev.end + 1`` even across offset holes), so a gap between the next
position and the earliest known segment always means a segment is missing (late), never
an offset hole.

``next_action`` returns one of:

* ``Produce(segment, skip_through)``: replay ``segment``; records at offsets
  ``<= skip_through`` are already in the destination (a partly covered segment).
* ``WaitFirst(until, since)``: no checkpoint yet; wait ``first_segment_delay`` for
  earlier segments before starting at the earliest one.
* ``WaitLate(until, late)``: positions ``late.first..late.last`` are missing; reload the
  segment list at ``until`` (exponential backoff over ``lost_segment_timeout``).
* ``DeclareLost(first, last)``: the wait is over; log, count and skip the range.
* ``Idle``: nothing known beyond the checkpoint (and no known end ahead of it).

``until`` is where the partition's segments end when that is known (an earlier incarnation
of a topic deleted and created again: ``ingress.incarnations``): positions up to it that no
segment covers are a gap, waited for and reported like any other, never skipped silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from replicator.core.keys import SegmentKey
from replicator.core.retry import backoff_schedule
from replicator.core.settings import IngressSourceSettings


@dataclass(frozen=True)
class LateGap:
    """A missing range being waited for: since when, and how many reloads were done."""

    first: int
    last: int
    since: datetime
    reloads: int = 0

    @property
    def size(self) -> int:
        """Positions in the range."""
        return self.last - self.first + 1


@dataclass(frozen=True)
class Produce:
    """Replay ``segment``, skipping records at offsets ``<= skip_through``."""

    segment: SegmentKey
    skip_through: int | None = None


@dataclass(frozen=True)
class WaitFirst:
    """No checkpoint: wait until ``until`` for earlier segments (``first_segment_delay``)."""

    until: datetime
    since: datetime


@dataclass(frozen=True)
class WaitLate:
    """A gap: reload the segment list at ``until`` unless an event fills it first."""

    until: datetime
    late: LateGap


@dataclass(frozen=True)
class DeclareLost:
    """Positions ``first..last`` (inclusive) will never arrive: skip them."""

    first: int
    last: int

    @property
    def size(self) -> int:
        """Positions in the range."""
        return self.last - self.first + 1


@dataclass(frozen=True)
class Idle:
    """Nothing to do until a new segment is known."""


Action = Produce | WaitFirst | WaitLate | DeclareLost | Idle


def order_segments(segments: Iterable[SegmentKey]) -> list[SegmentKey]:
    """Start order; for equal starts the longest first, then the higher level."""
    return sorted(segments, key=lambda s: (s.start, -s.end, -s.level))


def next_action(checkpoint: int | None, segments: Iterable[SegmentKey], now: datetime,
                source: IngressSourceSettings, *, late: LateGap | None = None,
                first_seen: datetime | None = None, floor: int | None = None,
                until: int | None = None) -> Action:
    """Decide the next step of one partition's replay.

    Args:
        checkpoint: the last source position already replayed, or ``None`` if none.
        segments: every usable segment known for the partition (all levels; the caller
            leaves out unreadable ones).
        now: the current time.
        source: the source's timing settings (``lost_segment_timeout``,
            ``late_segment_retries``, ``first_segment_delay``).
        late: the gap being waited for, as returned in the last ``WaitLate`` (with its
            ``reloads`` count raised by the caller after each reload).
        first_seen: when the caller first saw a segment without a checkpoint (from the
            last ``WaitFirst``).
        floor: without a checkpoint, the lowest start of segments known to exist but left
            out (unreadable or gone): replay may not begin after it silently, so its range
            is treated as late like any gap.
        until: the last position the segments reach, when known: a range up to it that no
            segment covers is a gap (waited for, then lost), not the end.
    """
    next_pos = None if checkpoint is None else checkpoint + 1
    candidates = order_segments(s for s in segments if next_pos is None or s.end >= next_pos)
    if not candidates and (until is None or next_pos is None or next_pos > until):
        return Idle()
    if next_pos is None:
        since = first_seen or now
        first_until = since + source.first_segment_delay
        if now < first_until:
            return WaitFirst(first_until, since)
        if floor is None or floor >= candidates[0].start:
            return Produce(candidates[0])
        checkpoint, next_pos = floor - 1, floor
    assert next_pos is not None
    covering = [s for s in candidates if s.start <= next_pos]
    if covering:
        # The one reaching furthest: a compacted segment beats the level-0 ones it covers.
        best = max(covering, key=lambda s: (s.end, s.level))
        return Produce(best, checkpoint if best.start < next_pos else None)
    gap_last = candidates[0].start - 1 if candidates else until
    assert gap_last is not None
    if late is None or late.first != next_pos:
        late = LateGap(next_pos, gap_last, now, 0)
    elif late.last != gap_last:
        late = LateGap(late.first, gap_last, late.since, late.reloads)
    timeout = source.lost_segment_timeout
    if late.reloads >= source.late_segment_retries and now >= late.since + timeout:
        return DeclareLost(late.first, late.last)
    waits = backoff_schedule(timeout, source.late_segment_retries)
    done = min(late.reloads, len(waits) - 1)
    reload_at = late.since + sum(waits[: done + 1], timedelta())
    return WaitLate(reload_at, late)
