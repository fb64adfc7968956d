"""The replay planner: every branch of ``next_action``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ingress.planner import (
    DeclareLost,
    Idle,
    LateGap,
    Produce,
    WaitFirst,
    WaitLate,
    next_action,
    order_segments,
)
from replicator.core.keys import SegmentKey
from replicator.core.retry import backoff_schedule
from replicator.core.settings import IngressSourceSettings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SRC = IngressSourceSettings(region="us-east-1", topic="t", lost_segment_timeout="60s",
                            late_segment_retries=3, first_segment_delay="10s")


def seg(start: int, end: int, level: int = 0) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "t", 0, level, start, end)


def test_idle_without_segments() -> None:
    assert next_action(None, [], T0, SRC) == Idle()
    assert next_action(99, [], T0, SRC) == Idle()


def test_segments_ending_at_or_before_the_checkpoint_are_skipped() -> None:
    assert next_action(199, [seg(0, 99), seg(100, 199)], T0, SRC) == Idle()
    assert next_action(199, [seg(100, 199), seg(200, 299)], T0, SRC) == Produce(seg(200, 299))


def test_overlap_longest_wins_for_equal_starts() -> None:
    segs = [seg(100, 199), seg(100, 250)]
    assert order_segments(segs) == [seg(100, 250), seg(100, 199)]
    assert next_action(99, segs, T0, SRC) == Produce(seg(100, 250))
    # After the short one the long one still covers the rest: records <= 199 are skipped.
    assert next_action(199, segs, T0, SRC) == Produce(seg(100, 250), 199)


def test_compacted_segment_covering_level0_ones_is_preferred() -> None:
    segs = [seg(0, 99), seg(100, 199), seg(200, 299), seg(0, 299, level=1)]
    assert next_action(None, segs, T0 + timedelta(seconds=11), SRC,
                       first_seen=T0) == Produce(seg(0, 299, 1))
    assert next_action(149, segs, T0, SRC) == Produce(seg(0, 299, 1), 149)


def test_equal_ranges_prefer_the_higher_level() -> None:
    assert next_action(99, [seg(100, 199), seg(100, 199, level=1)], T0, SRC) == \
        Produce(seg(100, 199, 1))


def test_checkpoint_inside_a_segment_skips_the_covered_records() -> None:
    assert next_action(149, [seg(100, 199), seg(200, 299)], T0, SRC) == \
        Produce(seg(100, 199), 149)


def test_first_segment_delay_only_without_checkpoint() -> None:
    segs = [seg(100, 199)]
    a = next_action(None, segs, T0, SRC)
    assert a == WaitFirst(T0 + timedelta(seconds=10), T0)
    assert next_action(None, segs, T0 + timedelta(seconds=9), SRC, first_seen=T0) == \
        WaitFirst(T0 + timedelta(seconds=10), T0)
    # An earlier segment arriving during the delay is where replay starts.
    assert next_action(None, [*segs, seg(0, 99)], T0 + timedelta(seconds=10), SRC,
                       first_seen=T0) == Produce(seg(0, 99))
    # With a checkpoint there is no delay.
    assert next_action(99, segs, T0, SRC) == Produce(seg(100, 199))


def test_gap_is_late_with_backoff_then_lost_with_exact_range() -> None:
    segs = [seg(200, 299)]
    waits = backoff_schedule(timedelta(seconds=60), 3)
    a = next_action(99, segs, T0, SRC)
    assert isinstance(a, WaitLate)
    assert (a.late.first, a.late.last, a.late.since, a.late.reloads) == (100, 199, T0, 0)
    assert a.until == T0 + waits[0]
    late = a.late
    t = T0
    for i in range(1, 3):
        late = LateGap(late.first, late.last, late.since, i)
        t = T0 + sum(waits[:i], timedelta())
        a = next_action(99, segs, t, SRC, late=late)
        assert isinstance(a, WaitLate)
        assert a.until == T0 + sum(waits[: i + 1], timedelta())
    late = LateGap(100, 199, T0, 3)
    # All reloads done but woken early (an unrelated event): keep waiting for the deadline.
    a = next_action(99, segs, T0 + timedelta(seconds=59), SRC, late=late)
    assert isinstance(a, WaitLate) and a.until == T0 + timedelta(seconds=60)
    assert next_action(99, segs, T0 + timedelta(seconds=60), SRC, late=late) == \
        DeclareLost(100, 199)


def test_gap_filled_by_new_segment_resolves_at_once() -> None:
    late = LateGap(100, 199, T0, 1)
    assert next_action(99, [seg(100, 199), seg(200, 299)], T0 + timedelta(seconds=1), SRC,
                       late=late) == Produce(seg(100, 199))


def test_partly_filled_gap_keeps_its_timer_and_shrinks() -> None:
    late = LateGap(100, 199, T0, 2)
    a = next_action(99, [seg(150, 199), seg(200, 299)], T0 + timedelta(seconds=30), SRC,
                    late=late)
    assert isinstance(a, WaitLate)
    assert (a.late.first, a.late.last, a.late.since, a.late.reloads) == (100, 149, T0, 2)


def test_a_new_gap_after_progress_starts_a_new_timer() -> None:
    old = LateGap(100, 199, T0, 3)
    a = next_action(399, [seg(500, 599)], T0 + timedelta(seconds=100), SRC, late=old)
    assert isinstance(a, WaitLate)
    assert (a.late.first, a.late.last, a.late.since) == (400, 499, T0 + timedelta(seconds=100))


def test_offset_holes_do_not_look_like_gaps() -> None:
    # Segments touch by position even where offsets have holes (transactions, compaction).
    segs = [seg(0, 10), seg(11, 40), seg(41, 41)]
    assert next_action(10, segs, T0, SRC) == Produce(seg(11, 40))
    assert next_action(40, segs, T0, SRC) == Produce(seg(41, 41))


@pytest.mark.parametrize("checkpoint", [None, 0, 5, 98, 99])
def test_produce_never_goes_back(checkpoint: int | None) -> None:
    segs = [seg(0, 99), seg(100, 199)]
    a = next_action(checkpoint, segs, T0 + timedelta(hours=1), SRC, first_seen=T0)
    assert isinstance(a, Produce)
    if checkpoint is not None:
        assert a.segment.end > checkpoint
        assert a.skip_through is None or a.skip_through == checkpoint


def test_unreadable_first_segment_without_checkpoint_is_a_gap_not_a_silent_start() -> None:
    segs = [seg(50, 99)]
    a = next_action(None, segs, T0, SRC, first_seen=T0 - timedelta(minutes=1), floor=0)
    assert isinstance(a, WaitLate) and (a.late.first, a.late.last) == (0, 49)
    late = LateGap(0, 49, T0, 3)
    assert next_action(None, segs, T0 + timedelta(seconds=60), SRC, late=late,
                       first_seen=T0 - timedelta(minutes=1), floor=0) == DeclareLost(0, 49)
    # A floor after the first usable segment changes nothing.
    assert next_action(None, segs, T0, SRC, first_seen=T0 - timedelta(minutes=1),
                       floor=60) == Produce(seg(50, 99))
