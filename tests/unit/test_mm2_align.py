"""Placing MirrorMaker 2's copies at their source offsets (replicator.ops.mm2_align)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.core.offset_map import live_entries, translate
from replicator.ops.mm2_align import AlignmentError, Row, align, map_entries


def _source(offsets: list[int], *, same: set[int] | None = None) -> list[Row]:
    """Rows at ``offsets``; the records at ``same`` all have one content."""
    return [(o, b"same" if same and o in same else f"r{o}".encode()) for o in offsets]


def _copy(source: list[Row], indices: list[int], dest_first: int = 0) -> list[Row]:
    return [(dest_first + n, source[k][1]) for n, k in enumerate(indices)]


@st.composite
def mm2_runs(draw: st.DrawFn) -> tuple[list[Row], list[int], int]:
    """A source with holes, what MM2 copied (in order, with rewinds: restarts that send a
    run again), and the source index the segments begin at."""
    n = draw(st.integers(2, 60))
    gaps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    offsets = [sum(gaps[:i + 1]) for i in range(n)]
    source = _source(offsets)
    stop = draw(st.integers(1, n))          # MM2 copied source[:stop]
    copied: list[int] = []
    k = 0
    while k < stop:
        copied.append(k)
        k += 1
        if k < stop and draw(st.integers(0, 9)) == 0:
            k = draw(st.integers(0, k - 1))   # a restart: at least once
    seg_from = draw(st.integers(0, stop - 1))
    return source, copied, seg_from


@settings(max_examples=200, deadline=None)
@given(mm2_runs())
def test_the_checkpoint_is_the_last_copied_record_and_groups_translate_exactly(
        run: tuple[list[Row], list[int], int]) -> None:
    source, copied, seg_from = run
    dest = _copy(source, copied, dest_first=100)
    segments = source[seg_from:]
    al = align(dest, segments)
    # The checkpoint: the source offset of MM2's last copy; ingress resumes right after it.
    assert segments[al.pairs[-1][0]][0] == source[copied[-1]][0]
    # Records copied before the segments begin are the head, not an error.
    first_in = next(i for i, k in enumerate(copied) if k >= seg_from)
    assert al.head == first_in
    assert al.unplaced == sum(1 for k in copied[first_in:] if k < seg_from)
    entries = live_entries(map_entries(al, segments, incarnation="t", source_incarnation=""),
                           "t")
    # A group committed at any source offset of the newest replay resumes at the
    # destination record of that offset (the last occurrence: after MM2's last rewind).
    replicated = source[copied[-1]][0] + 1
    last_run = len(copied) - 1
    while last_run > 0 and copied[last_run - 1] == copied[last_run] - 1 \
            and copied[last_run - 1] >= seg_from:
        last_run -= 1
    for pos in range(last_run, len(copied)):
        k = copied[pos]
        if k < seg_from:
            continue
        got = translate(entries, source[k][0], replicated)
        assert (got.state, got.offset) == ("translated", 100 + pos), (k, entries)


def test_a_repeated_record_is_placed_by_the_records_after_it() -> None:
    source = _source(list(range(20)), same={3, 12})
    dest = _copy(source, list(range(12, 18)))
    al = align(dest, source)
    assert [k for k, _ in al.pairs] == list(range(12, 18))


def test_two_places_that_fit_are_refused() -> None:
    source = [(o, b"x") for o in range(10)]
    with pytest.raises(AlignmentError, match="several places"):
        align(_copy(source, [4, 5]), source)


def test_a_record_not_in_the_segments_is_counted_and_never_the_checkpoint() -> None:
    source = _source(list(range(10)))
    dest = [*_copy(source, [0, 1, 2]), (3, b"written by someone else"), (4, source[3][1])]
    al = align(dest, source)
    assert (al.unplaced, al.pairs[-1]) == (1, (3, 4))
    with pytest.raises(AlignmentError, match="egress has not archived"):
        align(dest[:4], source)


def test_segments_that_end_before_mm2s_last_copy_are_refused() -> None:
    source = _source(list(range(10)))
    dest = _copy(source, list(range(10)))
    with pytest.raises(AlignmentError, match="egress has not archived"):
        align([*dest[:9], (9, b"after the segments")], source)


def test_a_gap_mm2_left_is_reported_and_not_mapped() -> None:
    source = _source(list(range(10)))
    al = align(_copy(source, [0, 1, 2, 6, 7]), source)
    assert al.skipped == [(3, 5)]
    entries = live_entries(map_entries(al, source, incarnation=None, source_incarnation=""),
                           None)
    assert translate(entries, 4, 8).state == "unmapped"
    assert translate(entries, 6, 8).offset == 3
