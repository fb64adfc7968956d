"""Compaction never deletes or merges away records of another topic incarnation (a topic
recreated, a partition truncated or reset): a segment covered by position is deleted unread
only when its footer agrees with what covers it, and a merge never mixes segments whose
records disagree. The decisions are pure (``compaction.planner``); the controller reads the
footers, and only the footers."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from compaction.merge import InputsDisagree, TaskSpec, merge_segments
from compaction.planner import (
    CompactionTask,
    PartitionPlan,
    contradiction,
    footers_to_check,
    verify_plan,
)
from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record
from formats.registry import get_format
from formats.segment_io import read_footer
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_compaction_controller import (
    controller,
    k,
    listing,
    seed,
    segment_keys,
)
from tests.unit.test_compaction_helpers import make_records, read_segment, write_segment

T0 = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
MS = 1_700_000_000_000


def meta(key: SegmentKey, count: int, lo: int | None = MS, hi: int | None = MS + 99,
         created: datetime = T0) -> SegmentMetadata:
    return replace(SegmentMetadata.for_key(key, count, created_at=created),
                   min_timestamp=lo, max_timestamp=hi)


# --- the pure decisions ---------------------------------------------------------------------


def test_a_leftover_input_agrees_with_the_output_it_was_merged_into() -> None:
    part = meta(k(0, 0, 99), 100, MS, MS + 99, T0)
    cover = meta(k(1, 0, 199), 200, MS, MS + 199, T0 + timedelta(hours=1))
    assert contradiction(part, [cover], merged_into=True) is None


@pytest.mark.parametrize(("change", "says"), [
    ({"message_count": 201}, "201 records"),                       # more than the cover holds
    ({"max_timestamp": MS + 5_000}, "record times"),               # newer records
    ({"min_timestamp": MS - 1}, "record times"),                   # older records
    ({"created_at": T0 + timedelta(hours=2)}, "written"),          # written after the merge
])
def test_a_covered_segment_that_cannot_be_in_its_cover_is_a_contradiction(
        change: dict[str, object], says: str) -> None:
    part = replace(meta(k(0, 0, 99), 100, MS, MS + 99, T0), **change)  # type: ignore[arg-type]
    cover = meta(k(1, 0, 199), 200, MS, MS + 199, T0 + timedelta(hours=1))
    why = contradiction(part, [cover], merged_into=True)
    assert why is not None and says in why


def test_footers_without_record_times_are_compared_by_what_they_have() -> None:
    part = meta(k(0, 0, 99), 100, None, None, T0)
    cover = meta(k(1, 0, 199), 200, MS, MS + 199, T0 + timedelta(hours=1))
    assert contradiction(part, [cover], merged_into=True) is None
    assert contradiction(replace(part, message_count=300), [cover], merged_into=True)


def test_a_segment_inside_a_run_is_compared_with_the_inputs_holding_its_range() -> None:
    # Egress rewrote [0-49] after a crash (later, same records): no contradiction; only
    # the merged-into check knows an output is younger than its inputs.
    a, b = meta(k(0, 0, 99), 100, MS, MS + 99), meta(k(0, 100, 199), 100, MS + 100, MS + 199)
    rewrite = meta(k(0, 0, 149), 150, MS, MS + 149, T0 + timedelta(days=1))
    assert contradiction(rewrite, [a, b], merged_into=False) is None
    newer = meta(k(0, 0, 149), 150, MS + 10**9, MS + 10**9 + 149, T0 + timedelta(days=1))
    assert contradiction(newer, [a, b], merged_into=False)


def _plan_with_covered() -> PartitionPlan:
    p = PartitionPlan(PartitionRef("data", "r1", "t", 0))
    old, new_a, new_b = k(1, 0, 199), k(0, 0, 49), k(0, 50, 99)
    leftover = k(0, 100, 199)
    p.covered_to_delete = [new_a, new_b, leftover]
    p.covering = {new_a: old, new_b: old, leftover: old}
    return p


def test_verify_plan_keeps_what_contradicts_its_cover_and_deletes_the_rest() -> None:
    p = _plan_with_covered()
    assert set(footers_to_check(p)) == {k(1, 0, 199), k(0, 0, 49), k(0, 50, 99),
                                        k(0, 100, 199)}
    recreated = T0 + timedelta(days=3)
    footers: dict[SegmentKey, SegmentMetadata | str] = {
        k(1, 0, 199): meta(k(1, 0, 199), 200, MS, MS + 199, T0 + timedelta(hours=1)),
        k(0, 0, 49): meta(k(0, 0, 49), 50, MS + 10**9, MS + 10**9 + 49, recreated),
        k(0, 50, 99): "footer unreadable: not a segment",
        k(0, 100, 199): meta(k(0, 100, 199), 100, MS + 100, MS + 199, T0),
    }
    verified, conflicts = verify_plan(p, footers)
    assert verified.covered_to_delete == [k(0, 100, 199)]
    assert {(c.segment, c.holders) for c in conflicts} == {
        (k(0, 0, 49), (k(1, 0, 199),)), (k(0, 50, 99), (k(1, 0, 199),))}
    assert all(c.reason for c in conflicts)
    # A covered segment that is gone needs no deletion; one whose cover is gone stays.
    footers.pop(k(0, 100, 199))
    assert verify_plan(p, footers)[0].covered_to_delete == []


def test_verify_plan_drops_a_merge_that_would_mix_incarnations() -> None:
    old_a, old_b, new = k(0, 0, 99), k(0, 100, 199), k(0, 0, 49)
    task = CompactionTask((old_a, old_b), k(1, 0, 199), 200, covered=(new,),
                          input_sizes=(100, 100))
    keep = CompactionTask((k(0, 200, 299), k(0, 300, 399)), k(1, 200, 399), 200)
    p = PartitionPlan(PartitionRef("data", "r1", "t", 0), tasks=[task, keep])
    assert set(footers_to_check(p)) == {old_a, new}       # only what overlaps the covered one
    footers: dict[SegmentKey, SegmentMetadata | str] = {
        old_a: meta(old_a, 100, MS, MS + 99),
        new: meta(new, 50, MS + 10**9, MS + 10**9 + 49, T0 + timedelta(days=3)),
    }
    verified, conflicts = verify_plan(p, footers)
    assert verified.tasks == [keep]
    assert [(c.segment, c.holders) for c in conflicts] == [(new, (old_a,))]
    footers[new] = meta(new, 50, MS, MS + 49, T0 + timedelta(days=3))   # a rewrite: fine
    assert verify_plan(p, footers) == (p, [])


# --- the controller ---------------------------------------------------------------------------


def new_incarnation(start: int, end: int) -> list[Record]:
    """Records of the recreated topic at the same positions: other values, later times."""
    return [Record(o, MS + 10**9 + o, b"new", f"new-{o}".encode()) for o in range(start, end + 1)]


def test_level0_segments_of_a_recreated_topic_are_not_deleted_as_covered(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 99), (100, 199)])
    c = controller(store)
    assert c.run_once().outcome == "success"
    assert segment_keys(store) == [k(1, 0, 199).to_key()]
    # The topic is deleted and created again: its new level-0 segments start at 0 again,
    # inside the old level-1 segment's range.
    fresh = [k(0, 0, 49), k(0, 50, 99)]
    for key in fresh:
        write_segment(store, key, new_incarnation(key.start, key.end))
    with caplog.at_level(logging.INFO, logger="compaction"):
        report = c.run_once()
    assert report.deleted == []
    assert all(x.to_key() in listing(store) for x in [*fresh, k(1, 0, 199)])
    assert read_segment(store, fresh[0]) == new_incarnation(0, 49)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    for key in fresh:
        assert any(key.to_key() in e and k(1, 0, 199).to_key() in e for e in errors), errors
    assert c.metrics.total("compaction_conflicts_total", region="r1", topic="t") == 2
    assert len(report.errors) == 2


def test_a_new_incarnation_with_the_same_record_times_is_caught_by_when_it_was_written() -> None:
    # Records restored with their original timestamps: only the footer's created_at tells
    # the new segment from a leftover input (a leftover was written before its output).
    store = MemoryObjectStore()
    seed(store, [(0, 99), (100, 199)])
    c = controller(store)
    c.run_once()
    write_segment(store, k(0, 0, 99), [replace(r, value=b"other")
                                       for r in make_records(0, 99)])
    report = c.run_once()
    assert report.deleted == [] and k(0, 0, 99).to_key() in listing(store)
    assert c.metrics.total("compaction_conflicts_total", region="r1", topic="t") == 1


def test_a_new_segment_inside_a_run_of_old_ones_is_not_deleted_unread() -> None:
    # The topic was recreated before its old level-0 segments were compacted: the new
    # [0-49] lies inside the run [0-99] + [100-199], would be skipped as covered and
    # deleted with the inputs once the output is durable.
    store = MemoryObjectStore()
    old = seed(store, [(0, 99), (100, 199)])
    write_segment(store, k(0, 0, 49), new_incarnation(0, 49))
    c = controller(store)
    report = c.run_once()
    assert report.tasks == [] and report.deleted == []
    assert sorted(segment_keys(store)) == sorted(x.to_key() for x in [*old, k(0, 0, 49)])
    assert any(k(0, 0, 49).to_key() in e and old[0].to_key() in e for e in report.errors)
    assert c.metrics.total("compaction_conflicts_total", region="r1", topic="t") == 1


def test_leftovers_of_an_interrupted_run_are_still_deleted() -> None:
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 99), (100, 199)])
    c = controller(store, settings=None)
    # The run published its output, then died before deleting: put the inputs back.
    saved = {x: store.get(x.to_key()) for x in inputs}
    c.run_once()
    for key, data in saved.items():
        store.put(key.to_key(), data)
    report = c.run_once()
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
    assert c.metrics.total("compaction_conflicts_total", region="r1") == 0


def test_a_merge_never_mixes_a_truncated_partitions_new_records_with_the_old_ones() -> None:
    # The partition was truncated at 60 (an unclean leader election) and egress went on
    # from there: [60-159] holds other records than [0-99] at positions 60-99. The merge
    # kept only offsets past those written, dropping the new 60-99 with one INFO line.
    store = MemoryObjectStore()
    write_segment(store, k(0, 0, 99), make_records(0, 99))
    write_segment(store, k(0, 60, 159), new_incarnation(60, 159))
    c = controller(store)
    report = c.run_once()
    assert report.deleted == []
    assert sorted(segment_keys(store)) == sorted([k(0, 0, 99).to_key(), k(0, 60, 159).to_key()])
    assert any(k(0, 0, 99).to_key() in e and k(0, 60, 159).to_key() in e
               for e in report.errors), report.errors
    assert c.metrics.total("compaction_conflicts_total", region="r1", topic="t") == 1


@pytest.mark.parametrize(("earlier", "later", "says"), [
    ((0, 99, 2), (50, 149, 1), "no earlier input holds"),    # the later one holds more
    ((0, 99, 1), (50, 149, 2), "where earlier inputs hold"),   # the later one holds less
])
def test_overlapping_inputs_must_hold_the_same_offsets_where_they_overlap(
        earlier: tuple[int, int, int], later: tuple[int, int, int], says: str) -> None:
    # Same timestamps (make_records), other offsets: not the same log either.
    store = MemoryObjectStore()
    a, b = k(0, earlier[0], earlier[1]), k(0, later[0], later[1])
    write_segment(store, a, make_records(*earlier))
    write_segment(store, b, make_records(*later))
    spec = TaskSpec([a.to_key(), b.to_key()], [1, 1], k(1, 0, 149).to_key(), 7)
    with pytest.raises(InputsDisagree, match=says):
        merge_segments(store, get_format("parquet"), WriterOptions(), "temp", spec)
    assert k(1, 0, 149).to_key() not in listing(store)
    assert [x for x in listing(store) if x.startswith("temp/")] == []


def test_overlapping_rewrites_of_the_same_records_still_merge() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 99), (50, 149), (150, 199)])       # [50-149] rewrote 50-99
    report = controller(store).run_once()
    assert report.outcome == "success", report.errors
    assert segment_keys(store) == [k(1, 0, 199).to_key()]


class CountingStore(MemoryObjectStore):
    """Counts the bytes read; a whole-object ``get`` of a segment fails the test."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0

    def get_range(self, key: str, start: int, length: int) -> bytes:
        data = super().get_range(key, start, length)
        self.read += len(data)
        return data

    def get(self, key: str) -> bytes:
        assert SegmentKey.try_parse(key) is None, f"whole-object read of {key}"
        return super().get(key)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_footer_is_read_from_the_end_of_the_object_only(fmt: str) -> None:
    store = CountingStore()
    key = k(0, 0, 19_999)
    rng = random.Random(35)        # incompressible values: the object is really large
    records = [Record(o, MS + o, b"k", rng.randbytes(300)) for o in range(20_000)]
    write_segment(store, key, records, fmt)
    size = store.head(key.to_key()).size
    store.read = 0
    footer = read_footer(store, key)
    assert footer.message_count == 20_000 and footer.max_timestamp == MS + 19_999
    assert size > 5_000_000 and store.read <= 128 * 1024
