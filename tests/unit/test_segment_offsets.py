"""A segment's records are read only while their offsets fit its key: strictly increasing,
across batches too, within the key's range (``formats.segment_io.check_offsets``). A record
out of place would move a replay's checkpoint past records of later segments (passed over
as replayed) or write one twice; it is a corrupt segment instead, reported, never skipped.
"""

from __future__ import annotations

from itertools import pairwise

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from formats.segment_io import check_offsets
from replicator.core.errors import SegmentCorrupt
from replicator.core.keys import SegmentKey

KEY = SegmentKey("data", "r1", "t", 0, 0, 10, 19)


def batches(*runs: list[int]) -> list[pa.RecordBatch]:
    return [pa.record_batch({"offset": pa.array(r, pa.int64())}) for r in runs]


def read(*runs: list[int]) -> list[int]:
    return [o for b in check_offsets(iter(batches(*runs)), KEY)
            for o in b.column("offset").to_pylist()]


def test_records_that_fit_their_key_are_read_as_they_are() -> None:
    assert read([10, 12], [], [13, 19]) == [10, 12, 13, 19]   # holes are fine


@pytest.mark.parametrize(("runs", "bad"), [
    (([9, 10],), 9),                 # below the key
    (([18, 20],), 20),               # above it
    (([10, 12, 12],), 12),           # twice in a batch
    (([10, 12, 11],), 11),           # backwards in a batch
    (([10, 12], [12, 13]), 12),      # twice across batches
    (([10, 14], [11, 15]), 11),      # backwards across batches
])
def test_a_record_out_of_place_makes_the_segment_corrupt(runs: tuple[list[int], ...],
                                                        bad: int) -> None:
    with pytest.raises(SegmentCorrupt, match=f"record offset {bad} out of place"):
        read(*runs)


@given(st.lists(st.integers(0, 30), max_size=12), st.integers(1, 4))
def test_exactly_the_reads_a_strictly_increasing_run_within_the_key_passes(
        offsets: list[int], cut: int) -> None:
    runs = [offsets[i:i + cut] for i in range(0, len(offsets), cut)] or [[]]
    fits = all(10 <= o <= 19 for o in offsets) and \
        all(a < b for a, b in pairwise(offsets))
    if fits:
        assert read(*runs) == offsets
    else:
        with pytest.raises(SegmentCorrupt):
            read(*runs)
