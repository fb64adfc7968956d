"""Pure egress decisions: rotation and segment starts."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from egress.rotation import (
    CloseReason,
    SegmentLimits,
    SegmentStats,
    StartDecision,
    decide_start,
    room_for,
    should_rotate,
)
from replicator.core.settings import EgressTopicSettings

LIMITS = SegmentLimits(max_messages=100, max_bytes=1000, max_age=60.0)


def test_limits_from_settings() -> None:
    s = EgressTopicSettings(max_segment_messages=5, max_segment_size="1KiB",
                            max_segment_age=timedelta(seconds=90))
    assert SegmentLimits.from_settings(s) == SegmentLimits(5, 1024, 90.0)


def test_empty_segment_never_rotates() -> None:
    assert should_rotate(SegmentStats(0, 0, None), LIMITS, 1e9) is None
    assert should_rotate(SegmentStats(0, 5000, 0.0), LIMITS, 1e9) is None


def test_each_reason() -> None:
    assert should_rotate(SegmentStats(99, 999, 0.0), LIMITS, 59.9) is None
    assert should_rotate(SegmentStats(100, 10, 0.0), LIMITS, 1.0) is CloseReason.COUNT
    assert should_rotate(SegmentStats(1, 1000, 0.0), LIMITS, 1.0) is CloseReason.SIZE
    assert should_rotate(SegmentStats(1, 10, 0.0), LIMITS, 60.0) is CloseReason.AGE


def test_count_wins_over_size_and_age() -> None:
    assert should_rotate(SegmentStats(100, 5000, 0.0), LIMITS, 100.0) is CloseReason.COUNT
    assert should_rotate(SegmentStats(5, 5000, 0.0), LIMITS, 100.0) is CloseReason.SIZE


def test_age_counts_from_the_first_message() -> None:
    assert should_rotate(SegmentStats(1, 1, 100.0), LIMITS, 159.0) is None
    assert should_rotate(SegmentStats(1, 1, 100.0), LIMITS, 160.0) is CloseReason.AGE


def test_room() -> None:
    assert room_for(SegmentStats(30, 0, 0.0), LIMITS) == 70
    assert room_for(SegmentStats(130, 0, 0.0), LIMITS) == 0


def test_no_commit_starts_at_first_message() -> None:
    assert decide_start(None, 42) == StartDecision(42)


def test_resume_exactly_at_commit() -> None:
    assert decide_start(100, 100) == StartDecision(100)


def test_offset_hole_is_not_loss() -> None:
    # A transaction marker at 100: the first record is 101, the log starts at 0.
    assert decide_start(100, 101, low_watermark=0) == StartDecision(100)
    # Compacted away records: same, no loss, segments touch.
    assert decide_start(100, 250, low_watermark=50) == StartDecision(100)
    # Unknown log start: nothing can be claimed lost.
    assert decide_start(100, 250, low_watermark=None) == StartDecision(100)


def test_retention_hole_is_lost_once_and_segments_still_touch() -> None:
    d = decide_start(100, 180, low_watermark=150)
    assert d.start == 100          # touches the previous segment: ingress sees no gap
    assert d.lost == (100, 149)    # exactly the deleted positions
    # The log start is past the first record read (the log moved on meanwhile).
    assert decide_start(100, 180, low_watermark=200).lost == (100, 179)


def test_truncated_source_resets() -> None:
    d = decide_start(500, 0, low_watermark=0)
    assert d == StartDecision(0, reset=True)


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_start_never_leaves_a_gap(expected: int, first: int, low: int) -> None:
    d = decide_start(expected, first, low)
    if first >= expected:
        assert d.start == expected
        if d.lost is not None:
            assert expected <= d.lost[0] <= d.lost[1] < first
    else:
        assert d.reset and d.start == first
