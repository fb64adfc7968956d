"""The restore planner (``replicator/ops/restore_plan.py``): fewest segments, never a record
twice, time bounds from footers, gaps and archive storage classes named."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.core.keys import SegmentKey
from replicator.ops.restore_plan import ArchivedSegment, Plan, RestoreRange, plan, with_times


def seg(start: int, end: int, level: int = 0, partition: int = 0, *,
        storage_class: str | None = None, times: tuple[int, int] | None = None,
        size: int | None = None) -> ArchivedSegment:
    key = SegmentKey("data", "us-east-1", "orders", partition, level, start, end)
    lo, hi = times if times is not None else (None, None)
    return ArchivedSegment(key, size if size is not None else (end - start + 1) * 10,
                           storage_class, lo, hi)


def spans(p: Plan) -> list[tuple[int, int, int, int]]:
    """(level, segment start, first, last) of each step."""
    return [(s.segment.key.level, s.segment.key.start, s.first, s.last) for s in p.steps]


def level0(n: int, width: int = 100, partition: int = 0) -> list[ArchivedSegment]:
    return [seg(i * width, (i + 1) * width - 1, partition=partition) for i in range(n)]


def test_whole_archive_of_one_level_is_every_segment_once() -> None:
    p = plan(level0(3), RestoreRange())
    assert spans(p) == [(0, 0, 0, 99), (0, 100, 100, 199), (0, 200, 200, 299)]
    assert p.gaps == [] and p.refusals() == []
    assert p.est_records == 300 and p.bytes_to_read == 3000


def test_a_compacted_segment_replaces_the_level0_ones_it_covers() -> None:
    # Level 1 covers 0-299 (its level-0 inputs still there), level 0 goes on to 499.
    segs = [*level0(5), seg(0, 299, level=1)]
    p = plan(segs, RestoreRange())
    assert spans(p) == [(1, 0, 0, 299), (0, 300, 300, 399), (0, 400, 400, 499)]


def test_range_edges_cut_the_first_and_last_segment() -> None:
    segs = [*level0(5), seg(0, 299, level=1)]
    p = plan(segs, RestoreRange(from_offset=150, to_offset=420))
    assert spans(p) == [(1, 0, 150, 299), (0, 300, 300, 399), (0, 400, 400, 420)]
    assert p.est_records == 271
    assert p.partitions[0].first == 150 and p.partitions[0].last == 420


def test_overlapping_segments_never_give_a_position_twice() -> None:
    # Two levels overlapping without nesting: 0-249 at level 1, 200-399 at level 2.
    segs = [*level0(4), seg(0, 249, level=1), seg(200, 399, level=2)]
    p = plan(segs, RestoreRange())
    assert spans(p) == [(1, 0, 0, 249), (2, 200, 250, 399)]


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(0, 2)),
                min_size=1, max_size=12),
       st.integers(0, 40), st.integers(0, 40))
def test_steps_tile_the_range_exactly_with_the_gaps(
        raw: list[tuple[int, int, int]], a: int, b: int) -> None:
    """Property: steps and gaps together cover every position of the range once, in
    order; a step's positions lie inside its segment."""
    segs = [seg(s, s + w, level) for s, w, level in raw]
    lo, hi = min(a, b), max(a, b)
    p = plan(segs, RestoreRange(from_offset=lo, to_offset=hi))
    pieces = sorted([(s.first, s.last) for s in p.steps] + [(g[1], g[2]) for g in p.gaps])
    pos = lo
    for first, last in pieces:
        assert first == pos and last >= first
        pos = last + 1
    assert pos == hi + 1
    for s in p.steps:
        assert s.segment.key.start <= s.first and s.last <= s.segment.key.end
    # Fewest segments: no two steps could be replaced by one existing segment.
    for x, y in zip(p.steps, p.steps[1:], strict=False):
        if x.last + 1 == y.first:
            assert not any(s.key.start <= x.first and s.key.end >= y.last for s in segs)


def test_gaps_are_named_with_their_positions() -> None:
    segs = [seg(0, 99), seg(200, 299), seg(0, 99, partition=1)]
    p = plan(segs, RestoreRange(to_offset=349))
    assert p.gaps == [(0, 100, 199), (0, 300, 349), (1, 100, 349)]
    refusals = p.refusals()
    assert "us-east-1/orders[0]: positions 100-199 (100) are missing" in refusals[0]
    assert p.refusals(allow_gaps=True) == []


def test_a_range_below_the_archive_is_a_gap() -> None:
    p = plan([seg(100, 199)], RestoreRange(from_offset=50))
    assert p.gaps == [(0, 50, 99)] and spans(p) == [(0, 100, 100, 199)]


def test_a_partition_without_segments_is_refused() -> None:
    p = plan(level0(1), RestoreRange(), partitions=[0, 3])
    assert p.refusals() == ["partition 3 has no segment in the archive"]
    p = plan(level0(1), RestoreRange(from_offset=0, to_offset=9), partitions=[3])
    assert p.gaps == [(3, 0, 9)]


def test_archive_storage_classes_are_refused_by_name_unless_avoidable() -> None:
    glacier = seg(0, 299, level=1, storage_class="GLACIER")
    p = plan([glacier, seg(300, 399)], RestoreRange())
    assert [s.segment for s in p.needs_restore] == [glacier]
    assert p.refusals(allow_gaps=True) == [
        f"{glacier.key} is in storage class GLACIER: restore it from the archive first "
        "(S3 RestoreObject), then run again"]
    # Readable level-0 segments under the GLACIER level 1 are read instead.
    p = plan([*level0(4), glacier], RestoreRange())
    assert spans(p) == [(0, 0, 0, 99), (0, 100, 100, 199), (0, 200, 200, 299),
                        (0, 300, 300, 399)]
    assert p.refusals() == []
    # GLACIER_IR and the infrequent-access classes are readable as they are.
    for cls in ("GLACIER_IR", "STANDARD_IA", "INTELLIGENT_TIERING"):
        assert plan([seg(0, 9, storage_class=cls)], RestoreRange()).refusals() == []
    assert plan([seg(0, 9, storage_class="DEEP_ARCHIVE")], RestoreRange()).needs_restore


def test_time_bounds_drop_segments_whose_footer_times_miss_them() -> None:
    segs = [seg(0, 99, times=(1000, 1999)), seg(100, 199, times=(2000, 2999)),
            seg(200, 299, times=(3000, 3999)), seg(300, 399, times=(4000, 4999))]
    p = plan(segs, RestoreRange(from_time=2500, to_time=3100))
    assert spans(p) == [(0, 100, 100, 199), (0, 200, 200, 299)]
    assert p.without_times == []
    # Open-ended bounds.
    assert len(plan(segs, RestoreRange(from_time=3500)).steps) == 2
    assert len(plan(segs, RestoreRange(to_time=1000)).steps) == 1


def test_segments_without_times_are_kept_and_reported_until_their_times_are_known() -> None:
    segs = [seg(0, 99, times=(1000, 1999)), seg(100, 199), seg(200, 299, times=(3000, 3999))]
    rng = RestoreRange(from_time=3000)
    p = plan(segs, rng)
    assert [s.segment.key.start for s in p.without_times] == [100]
    assert spans(p) == [(0, 100, 100, 199), (0, 200, 200, 299)]
    # The caller read segment 100-199: its records are older, so it drops out.
    p = plan(with_times(segs, {segs[1].key: (2000, 2999)}), rng)
    assert spans(p) == [(0, 200, 200, 299)] and p.without_times == []
    # Without time bounds, times are never needed.
    assert plan(segs, RestoreRange()).without_times == []


def test_with_time_bounds_every_hole_of_the_range_is_a_gap() -> None:
    segs = [seg(0, 99, times=(1000, 1999)), seg(200, 299, times=(2000, 2999)),
            seg(400, 499, times=(3000, 3999)), seg(600, 699, times=(4000, 4999))]
    p = plan(segs, RestoreRange(from_time=3000, to_time=3500))
    # 100-199 lies between two segments older than the bounds, but record times are not
    # ordered by offset: its records may be inside them (a late producer, a backfill).
    assert p.gaps == [(0, 100, 199), (0, 300, 399), (0, 500, 599)]
    refusal = p.refusals()[0]
    assert "positions 100-199 (100) are missing" in refusal
    assert "--from-offset/--to-offset can leave them out" in refusal
    # Offset bounds that leave the holes out restore the window without refusal.
    assert plan(segs, RestoreRange(400, 499, 3000, 3500)).refusals() == []


@st.composite
def archives(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, int]], list[bool]]:
    """A partition's record times, its segments, which of them are archived."""
    n = draw(st.integers(1, 40))
    # Mostly in offset order, as most producers write, with a few records out of order.
    times = sorted(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)))
    for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        times[i] = draw(st.integers(0, 60))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=8)))) \
        if n > 1 else []
    bounds = list(zip([0, *cuts], [*[c - 1 for c in cuts], n - 1], strict=True))
    present = draw(st.lists(st.booleans(), min_size=len(bounds), max_size=len(bounds)))
    return times, bounds, present


@settings(max_examples=400)
@given(archives(), st.integers(-1, 61), st.integers(-1, 61),
       st.one_of(st.none(), st.integers(0, 45)), st.one_of(st.none(), st.integers(0, 45)))
def test_a_time_bounded_plan_restores_every_archived_record_or_names_the_hole(
        archive: tuple[list[int], list[tuple[int, int]], list[bool]], t1: int, t2: int,
        o1: int | None, o2: int | None) -> None:
    """Property, against a brute-force model: every record of the request that the archive
    holds is inside a step; a record of the request the archive lacks means a named gap
    (refused unless --allow-gaps), whatever the order of record times."""
    times, bounds, present = archive
    if o1 is not None and o2 is not None and o1 > o2:
        o1, o2 = o2, o1
    segs = [seg(a, b, times=(min(times[a:b + 1]), max(times[a:b + 1])))
            for (a, b), here in zip(bounds, present, strict=True) if here]
    rng = RestoreRange(o1, o2, min(t1, t2), max(t1, t2))
    p = plan(segs, rng)
    if not segs:
        return
    lo = o1 if o1 is not None else segs[0].key.start
    hi = o2 if o2 is not None else segs[-1].key.end
    wanted = {o for o in range(lo, hi + 1) if o >= len(times) or rng.keeps_time(times[o])}
    archived = {o for s in segs for o in range(s.key.start, s.key.end + 1)}
    stepped = {o for s in p.steps for o in range(s.first, s.last + 1)}
    assert wanted & archived <= stepped
    if wanted - archived:
        assert p.refusals() and not p.refusals(allow_gaps=True)


def test_bad_ranges_are_refused() -> None:
    with pytest.raises(ValueError, match="--from-offset 5 is after --to-offset 4"):
        RestoreRange(from_offset=5, to_offset=4)
    with pytest.raises(ValueError, match="--from-time"):
        RestoreRange(from_time=5, to_time=4)


# --- a table snapshot as the restore point --------------------------------------------


def test_a_snapshot_restores_exactly_the_segments_it_lists() -> None:
    # Snapshot A listed the three level-0 segments; since, compaction added level 1 over
    # them (kept in the bucket for now) and egress added 300-399: neither is A's.
    a = level0(3)
    bucket = [*a, seg(0, 299, level=1), seg(300, 399)]
    p = plan(bucket, RestoreRange(), listed=[s.key for s in a], snapshot=7)
    assert spans(p) == [(0, 0, 0, 99), (0, 100, 100, 199), (0, 200, 200, 299)]
    assert p.missing == () and p.snapshot_refusals() == [] and p.refusals() == []


def test_a_snapshot_combines_with_offset_bounds_and_partitions() -> None:
    a = [*level0(3), *level0(2, partition=1)]
    p = plan([*a, seg(300, 399)], RestoreRange(from_offset=150, to_offset=350),
             partitions=[0], listed=[s.key for s in a], snapshot=7)
    assert [pp.partition for pp in p.partitions] == [0]
    assert spans(p) == [(0, 100, 150, 199), (0, 200, 200, 299)]
    # Positions past what the snapshot lists are a gap of the range, not another segment.
    assert p.gaps == [(0, 300, 350)]


def test_a_snapshot_segment_deleted_since_is_refused_unless_gaps_are_allowed() -> None:
    a = level0(3)
    # Compaction replaced A's segments by a level-1 one and deleted them.
    bucket = [seg(0, 299, level=1)]
    p = plan(bucket, RestoreRange(), listed=[s.key for s in a], snapshot=7)
    assert p.steps == [] and p.missing == tuple(s.key for s in a)
    (why,) = p.snapshot_refusals()
    assert "snapshot 7 lists 3 segment(s) no longer in the bucket" in why
    assert str(a[0].key) in why and "older than the objects kept" in why
    # Allowed: the missing positions are gaps, skipped like any other hole.
    assert p.snapshot_refusals(allow_gaps=True) == []
    assert p.gaps == [(0, 0, 299)] and p.refusals(allow_gaps=True) == []


def test_a_missing_last_segment_of_a_snapshot_is_a_gap_at_its_end() -> None:
    a = level0(3)
    p = plan(a[:2], RestoreRange(), listed=[s.key for s in a], snapshot=7)
    assert p.missing == (a[2].key,)
    assert spans(p) == [(0, 0, 0, 99), (0, 100, 100, 199)] and p.gaps == [(0, 200, 299)]


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 9), max_size=10), st.sets(st.integers(0, 9), max_size=10))
def test_a_snapshot_plan_reads_only_listed_segments_and_names_every_missing_one(
        listed_ix: set[int], present_ix: set[int]) -> None:
    segs = level0(10, width=10)
    listed = [segs[i].key for i in listed_ix]
    p = plan([segs[i] for i in present_ix], RestoreRange(), listed=listed, snapshot=1)
    read = {s.segment.key for s in p.steps}
    assert read == {segs[i].key for i in listed_ix & present_ix}
    assert set(p.missing) == {segs[i].key for i in listed_ix - present_ix}
    # Each missing segment's positions are in a gap (never silently dropped).
    for k in p.missing:
        assert any(a <= k.start and k.end <= b for _, a, b in p.gaps)
