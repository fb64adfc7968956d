"""Segment reports (gaps, overlaps) and the verify classifier (lost, duplicated, reordered)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectInfo
from replicator.ops.segments import coverage_gaps, level_overlaps, summarize
from replicator.ops.verify import compare_fan_in, compare_streams, count_reordered

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def k(start: int, end: int, level: int = 0, partition: int = 0) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "t", partition, level, start, end)


def test_touching_segments_have_no_gap() -> None:
    assert coverage_gaps([k(0, 9), k(10, 19), k(20, 20)]) == []


def test_gap_bounds_are_exact_and_covered_ranges_close_gaps() -> None:
    assert coverage_gaps([k(0, 9), k(15, 19)]) == [(10, 14)]
    assert coverage_gaps([k(0, 9), k(15, 19), k(0, 30, level=1)]) == []
    assert coverage_gaps([k(100, 199), k(100, 250), k(251, 300), k(400, 401)]) == [(301, 399)]


def test_overlaps_only_within_a_level() -> None:
    assert level_overlaps([k(0, 9), k(0, 99, level=1)]) == []
    assert level_overlaps([k(100, 199), k(150, 250)]) == [(k(100, 199).to_key(),
                                                           k(150, 250).to_key())]


def test_summarize_groups_by_partition_and_level() -> None:
    objs = [ObjectInfo(key.to_key(), 10, NOW) for key in
            (k(0, 9), k(10, 19), k(0, 19, level=1), k(0, 4, partition=1))]
    objs.append(ObjectInfo("data/us-east-1/t/_topic.json", 5, NOW))
    parts = summarize(objs)
    assert [(p.partition, sorted(p.levels)) for p in parts] == [(0, [0, 1]), (1, [0])]
    lv0 = parts[0].levels[0]
    assert (lv0.count, lv0.bytes, lv0.first, lv0.last) == (2, 20, 0, 19)


class FakeMsg:
    def __init__(self, value: bytes, offset: int = 0, key: bytes | None = b"k",
                 ts: int = 1000) -> None:
        self._v, self._o, self._k, self._ts = value, offset, key, ts

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> Any:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def offset(self) -> int:
        return self._o

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def __len__(self) -> int:
        return len(self._v)


def msgs(values: list[int]) -> Any:
    return iter([FakeMsg(str(v).encode(), i) for i, v in enumerate(values)])


def test_identical_streams_pass() -> None:
    v = compare_streams(0, msgs([1, 2, 3]), msgs([1, 2, 3]))
    assert v.ok and v.source_records == v.destination_records == 3


def test_lost_duplicated_reordered_are_counted() -> None:
    v = compare_streams(0, msgs([1, 2, 3, 4, 5]), msgs([1, 3, 2, 3, 5, 9]))
    assert (v.lost, v.duplicated, v.reordered) == (1, 2, 1)
    assert not v.ok
    assert v.first_difference is not None and v.first_difference["index"] == 1


def test_fan_in_compares_only_the_records_of_the_source() -> None:
    # The destination interleaves another source's records (100+): they are not counted.
    ok = compare_fan_in(0, msgs([1, 2, 3]), msgs([100, 1, 101, 2, 3, 102]))
    assert ok.ok and (ok.source_records, ok.destination_records) == (3, 3)
    bad = compare_fan_in(0, msgs([1, 2, 3, 4]), msgs([100, 2, 1, 101, 2, 3]))
    assert (bad.lost, bad.duplicated, bad.reordered) == (1, 1, 1)
    assert bad.first_difference is not None and bad.first_difference["index"] == 0
    assert not bad.ok


def test_null_and_empty_keys_differ() -> None:
    src = iter([FakeMsg(b"v", key=None)])
    dst = iter([FakeMsg(b"v", key=b"")])
    v = compare_streams(0, src, dst)
    assert (v.lost, v.duplicated) == (1, 1)


def test_timestamp_difference_is_a_difference() -> None:
    v = compare_streams(0, iter([FakeMsg(b"v", ts=1)]), iter([FakeMsg(b"v", ts=2)]))
    assert not v.ok


def test_count_reordered() -> None:
    assert count_reordered([0, 1, 2, 3]) == 0
    assert count_reordered([1, 0, 2, 3]) == 1
    assert count_reordered([3, 2, 1, 0]) == 3
