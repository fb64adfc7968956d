"""The compaction planner: every threshold, watermark, covered/overlapping inputs, holes."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.planner import CompactionTask, Hole, Listed, plan, plan_all
from replicator.core.keys import SegmentKey
from replicator.core.settings import CompactionTopicSettings

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(hours=3)


def key(level: int, start: int, end: int, partition: int = 0, topic: str = "t") -> SegmentKey:
    return SegmentKey("data", "r1", topic, partition, level, start, end)


def seg(level: int, start: int, end: int, size: int = 100, modified: datetime = OLD,
        partition: int = 0) -> Listed:
    return Listed(key(level, start, end, partition), size, modified)


def cfg(**kw: Any) -> CompactionTopicSettings:
    base: dict[str, Any] = {"min_segment_age": "1h", "min_segment_count": 2,
                            "min_segment_size": 1, "max_segment_count": 1000,
                            "max_segment_size": "1GiB"}
    base.update(kw)
    return CompactionTopicSettings.model_validate(base)


def chain(n: int, level: int = 0, start: int = 0, width: int = 100, size: int = 100,
          modified: datetime = OLD) -> list[Listed]:
    return [seg(level, start + i * width, start + (i + 1) * width - 1, size, modified)
            for i in range(n)]


def ranges(task: CompactionTask) -> list[tuple[int, int]]:
    return [(k.start, k.end) for k in task.inputs]


def test_level0_chain_merges_into_one_level1_segment() -> None:
    p = plan(chain(5), cfg(), NOW)
    assert len(p.tasks) == 1
    t = p.tasks[0]
    assert ranges(t) == [(0, 99), (100, 199), (200, 299), (300, 399), (400, 499)]
    assert t.output == key(1, 0, 499)
    assert t.bytes == 500
    assert p.covered_to_delete == [] and p.holes_reported == []


def test_accepts_plain_tuples_in_any_order() -> None:
    segs = [(s.key, s.size, s.last_modified) for s in reversed(chain(3))]
    assert plan(segs, cfg(), NOW).tasks[0].output == key(1, 0, 299)


def test_min_segment_age_stops_the_walk_at_the_first_young_segment() -> None:
    segs = [*chain(3), seg(0, 300, 399, modified=NOW - timedelta(minutes=10)),
            seg(0, 400, 499)]
    p = plan(segs, cfg(), NOW)
    assert ranges(p.tasks[0]) == [(0, 99), (100, 199), (200, 299)]
    assert "younger than min_segment_age" in (p.skipped_reason or "")
    # exactly at the age limit counts as old enough
    p2 = plan([*chain(2), seg(0, 200, 299, modified=NOW - timedelta(hours=1))], cfg(), NOW)
    assert p2.tasks[0].output.end == 299


def test_min_segment_count_skips_the_growing_run() -> None:
    p = plan(chain(3), cfg(min_segment_count=4), NOW)
    assert p.tasks == []
    assert "3 segment(s) < min_segment_count 4" in (p.skipped_reason or "")
    assert len(plan(chain(4), cfg(min_segment_count=4), NOW).tasks) == 1


def test_min_segment_size_skips_the_growing_run() -> None:
    p = plan(chain(3, size=100), cfg(min_segment_size=301), NOW)
    assert p.tasks == []
    assert "300 bytes < min_segment_size 301" in (p.skipped_reason or "")
    assert len(plan(chain(3, size=100), cfg(min_segment_size=300), NOW).tasks) == 1


def test_max_segment_count_splits_into_several_tasks() -> None:
    p = plan(chain(7), cfg(max_segment_count=3, min_segment_count=2), NOW)
    assert [ranges(t) for t in p.tasks] == [
        [(0, 99), (100, 199), (200, 299)],
        [(300, 399), (400, 499), (500, 599)],
    ]
    # the seventh segment alone is a growing run below min_segment_count
    assert "600-699: 1 segment(s)" in (p.skipped_reason or "")
    assert [t.output for t in p.tasks] == [key(1, 0, 299), key(1, 300, 599)]


def test_max_segment_size_splits_before_the_input_that_would_exceed_it() -> None:
    p = plan(chain(5, size=100), cfg(max_segment_size=250, min_segment_count=1), NOW)
    assert [ranges(t) for t in p.tasks] == [
        [(0, 99), (100, 199)], [(200, 299), (300, 399)], [(400, 499)]]
    # a single input larger than the maximum still forms a run of its own
    big = [seg(0, 0, 99, size=1000), *chain(2, start=100)]
    p2 = plan(big, cfg(max_segment_size=250, min_segment_count=1), NOW)
    assert [ranges(t) for t in p2.tasks] == [[(0, 99)], [(100, 199), (200, 299)]]


def test_watermark_leftovers_of_an_earlier_run_are_deleted_not_reread() -> None:
    # An earlier run wrote L1 0-299 and died before deleting its three L0 inputs.
    segs = [seg(1, 0, 299, size=250), *chain(6)]
    p = plan(segs, cfg(), NOW)
    assert p.covered_to_delete == [key(0, 0, 99), key(0, 100, 199), key(0, 200, 299)]
    assert [ranges(t) for t in p.tasks] == [[(300, 399), (400, 499), (500, 599)]]
    assert p.tasks[0].output == key(1, 300, 599)


def test_rerun_after_complete_run_plans_nothing() -> None:
    p = plan([seg(1, 0, 299)], cfg(), NOW)
    assert p.empty and p.tasks == []
    assert p.skipped_reason == "no segments at levels 0..0"


def test_overlapping_inputs_are_read_and_output_takes_the_max_end() -> None:
    # egress crashed after publishing 100-199, restarted and wrote 100-250 again
    segs = [seg(0, 0, 99), seg(0, 100, 199), seg(0, 100, 250), seg(0, 251, 260),
            seg(0, 200, 230)]
    p = plan(segs, cfg(), NOW)
    t = p.tasks[0]
    # the longer of the two equal starts is read; what it covers is skipped
    assert ranges(t) == [(0, 99), (100, 250), (251, 260)]
    assert set(t.covered) == {key(0, 100, 199), key(0, 200, 230)}
    assert t.output == key(1, 0, 260)


def test_output_end_is_the_max_end_not_the_last_appended_end() -> None:
    segs = [seg(0, 0, 150), seg(0, 100, 120), seg(0, 140, 149)]
    p = plan(segs, cfg(min_segment_count=1), NOW)
    t = p.tasks[0]
    assert t.output == key(1, 0, 150)
    assert ranges(t) == [(0, 150)]
    assert set(t.covered) == {key(0, 100, 120), key(0, 140, 149)}


def test_partially_overlapping_chain_output_end_is_max() -> None:
    segs = [seg(0, 0, 300), seg(0, 200, 250)]
    p = plan(segs, cfg(min_segment_count=1), NOW)
    assert p.tasks[0].output.end == 300


def test_real_hole_ends_the_run_and_is_reported_once_with_exact_bounds() -> None:
    segs = [*chain(3), *chain(3, start=500)]   # 300..499 missing
    p = plan(segs, cfg(min_segment_count=3), NOW)
    assert p.holes_reported == [Hole(300, 499)]
    assert [t.output for t in p.tasks] == [key(1, 0, 299), key(1, 500, 799)]
    # next run: everything below the new watermark, the hole is not seen again
    after = [seg(1, 0, 299), seg(1, 500, 799), *chain(2, start=800)]
    p2 = plan(after, cfg(min_segment_count=3), NOW)
    assert p2.holes_reported == []
    assert p2.tasks == []


def test_hole_closed_run_is_merged_even_below_minimums() -> None:
    segs = [*chain(2), *chain(10, start=1000)]
    p = plan(segs, cfg(min_segment_count=10), NOW)
    assert p.holes_reported == [Hole(200, 999)]
    assert [t.output for t in p.tasks] == [key(1, 0, 199), key(1, 1000, 1999)]


def test_single_segment_before_a_hole_is_left_and_said_why() -> None:
    segs = [seg(0, 0, 99), *chain(3, start=200)]
    p = plan(segs, cfg(min_segment_count=3), NOW)
    assert [t.output for t in p.tasks] == [key(1, 200, 499)]
    assert "single segment" in (p.skipped_reason or "")


def test_hole_after_the_watermark_is_reported() -> None:
    segs = [seg(1, 0, 99), *chain(2, start=150)]
    p = plan(segs, cfg(), NOW)
    assert p.holes_reported == [Hole(100, 149)]
    assert p.tasks[0].output == key(1, 150, 349)


def test_offset_gaps_inside_touching_segments_never_block() -> None:
    # positions touch although Kafka offsets inside them have gaps (transactions)
    segs = [seg(0, 0, 10), seg(0, 11, 500), seg(0, 501, 502)]
    p = plan(segs, cfg(), NOW)
    assert p.holes_reported == [] and p.tasks[0].output == key(1, 0, 502)


def test_level_range_1_to_2_ignores_level0_and_uses_level2_watermark() -> None:
    segs = [seg(2, 0, 999), seg(1, 0, 499), seg(1, 500, 999),   # leftovers
            seg(1, 1000, 1999), seg(1, 2000, 2999),
            *chain(5, start=3000)]                              # fresh level 0
    p = plan(segs, cfg(min_level=1, max_level=1), NOW)
    assert p.covered_to_delete == [key(1, 0, 499), key(1, 500, 999)]
    assert [t.output for t in p.tasks] == [key(2, 1000, 2999)]
    assert ranges(p.tasks[0]) == [(1000, 1999), (2000, 2999)]


def test_mixed_level_range_output_level_is_highest_input_plus_one() -> None:
    segs = [seg(1, 0, 499), *chain(3, start=500)]
    p = plan(segs, cfg(min_level=0, max_level=1), NOW)
    assert p.tasks[0].output == key(2, 0, 799)
    # an earlier L1 that covers L0 segments within the range: covered, not re-read
    segs2 = [seg(1, 0, 199), seg(0, 0, 99), seg(0, 100, 199), seg(0, 200, 299)]
    p2 = plan(segs2, cfg(min_level=0, max_level=1), NOW)
    t = p2.tasks[0]
    assert ranges(t) == [(0, 199), (200, 299)]
    assert set(t.covered) == {key(0, 0, 99), key(0, 100, 199)}
    assert t.output == key(2, 0, 299)


def test_a_single_uncovered_segment_between_compacted_ones_is_left_not_deleted() -> None:
    segs = [seg(1, 0, 199), seg(1, 300, 499), seg(0, 200, 299)]
    p = plan(segs, cfg(), NOW)
    assert p.covered_to_delete == [] and p.tasks == []
    assert "single segment" in (p.skipped_reason or "")


def test_the_range_of_a_failed_merge_task_is_merged_by_the_next_run() -> None:
    # One run planned 0-199, 200-399 and 400-599; the middle task failed, the others
    # published their outputs (and deleted their inputs). The middle range lies below the
    # highest compacted end, between two level-1 segments: it is planned again.
    segs = [seg(1, 0, 199), *chain(2, start=200), seg(1, 400, 599), *chain(3, start=600)]
    p = plan(segs, cfg(min_segment_count=3), NOW)
    assert [t.output for t in p.tasks] == [key(1, 200, 399), key(1, 600, 899)]
    assert ranges(p.tasks[0]) == [(200, 299), (300, 399)]
    assert p.holes_reported == [] and p.covered_to_delete == []


def test_plan_all_groups_by_partition_and_refuses_mixed_input() -> None:
    segs = [*chain(2), *[Listed(key(0, s.key.start, s.key.end, partition=3), 1, OLD)
                         for s in chain(2)]]
    plans = plan_all(segs, cfg(), NOW)
    assert [p.partition.partition for p in plans] == [0, 3]
    assert all(len(p.tasks) == 1 for p in plans)
    with pytest.raises(ValueError, match="one partition"):
        plan(segs, cfg(), NOW)


def test_describe_names_partition_levels_and_range() -> None:
    t = plan(chain(2), cfg(), NOW).tasks[0]
    assert t.describe() == "t[0] L0..L0 -> L1 0-199 (2 inputs, 0 covered, 200 bytes)"


@settings(max_examples=200, deadline=None)
@given(widths=st.lists(st.integers(1, 50), min_size=1, max_size=40),
       gaps=st.lists(st.integers(0, 3), min_size=40, max_size=40),
       overlaps=st.lists(st.integers(0, 2), min_size=40, max_size=40),
       sizes=st.lists(st.integers(1, 300), min_size=40, max_size=40),
       max_count=st.integers(1, 8), min_count=st.integers(1, 8),
       max_size=st.integers(100, 1000))
def test_plan_invariants(widths: list[int], gaps: list[int], overlaps: list[int],
                         sizes: list[int], max_count: int, min_count: int,
                         max_size: int) -> None:
    segs, start = [], 0
    for i, w in enumerate(widths):
        # a gap of 3 is a real hole; an overlap re-covers part of the previous segment
        s = start + (1 if gaps[i] == 3 else 0)
        s = max(0, s - overlaps[i] * (w // 2)) if i else s
        segs.append(seg(0, s, s + w - 1, size=sizes[i]))
        start = max(start, s + w)
    c = cfg(max_segment_count=max_count, min_segment_count=min(min_count, max_count),
            max_segment_size=max_size, min_segment_size=1)
    p = plan(segs, c, NOW)
    used: set[SegmentKey] = set()
    for t in p.tasks:
        assert t.output.level == 1
        assert t.output.start == t.inputs[0].start
        assert t.output.end == max(k.end for k in t.inputs)
        assert len(t.inputs) <= max_count
        assert len(t.inputs) == 1 or t.bytes <= max_size
        reach = t.inputs[0].end
        for k in t.inputs[1:]:
            assert k.start <= reach + 1, "a task never spans a hole"
            assert k.end > reach, "a read input always adds positions"
            reach = k.end
        for k in t.covered:
            assert t.output.covers(k)
        both = set(t.inputs) | set(t.covered)
        assert not (both & used), "a segment belongs to one task"
        used |= both
    outputs = sorted((t.output for t in p.tasks), key=lambda k: k.start)
    for a, b in itertools.pairwise(outputs):
        assert a.end < b.end


def test_two_incarnations_are_planned_apart_and_outputs_stay_in_their_own() -> None:
    # A topic deleted and created again: the same positions in two locations. Each is
    # merged on its own; the later one's output is never named at the documented shape.
    def inc(k: SegmentKey) -> SegmentKey:
        return SegmentKey(k.prefix, k.region, k.topic, k.partition, k.level, k.start, k.end,
                          "IdB")
    later = [Listed(inc(s.key), s.size, s.last_modified) for s in chain(3)]
    plans = plan_all([*chain(4), *later], cfg(), NOW)
    assert len(plans) == 2
    outputs = sorted((t.output for p in plans for t in p.tasks), key=str)
    assert outputs == [key(1, 0, 399), inc(key(1, 0, 299))]
    for p in plans:
        for t in p.tasks:
            assert {k.incarnation for k in t.inputs} == {t.output.incarnation}
        assert p.covered_to_delete == []
