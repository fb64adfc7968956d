"""Segment reads against the moto server: a segment no larger than the read buffer is one
HEAD and one GET; a larger one is read through ranged GETs, none of the whole object.
Records are the same either way, in both formats.
"""

from __future__ import annotations

from typing import Any

import pytest

from formats.records import batch_to_records
from formats.segment_io import open_segment
from replicator.core.keys import SegmentKey
from replicator.core.s3 import S3ObjectStore
from tests.unit.test_compaction_helpers import make_records, write_segment


@pytest.fixture
def store(s3_client: Any, bucket: str) -> S3ObjectStore:
    return S3ObjectStore(s3_client, bucket)


def _requests(store: S3ObjectStore) -> list[tuple[str, str | None]]:
    """Every S3 call of ``store`` from now on: (operation, Range header)."""
    seen: list[tuple[str, str | None]] = []

    def capture(model: Any, params: dict[str, Any], **kw: Any) -> None:
        seen.append((model.name, params.get("headers", {}).get("Range")))

    store.client.meta.events.register("before-call.s3", capture)
    return seen


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_small_segment_is_one_head_and_one_get(store: S3ObjectStore, fmt: str) -> None:
    records = make_records(0, 4999)
    key = SegmentKey("data", "us-east-1", "orders", 0, 0, 0, 4999)
    write_segment(store, key, records, fmt)
    size = store.head(key.to_key()).size
    seen = _requests(store)
    with open_segment(store, key) as reader:
        got = [r for b in reader.iter_batches(1000) for r in batch_to_records(b)]
    assert got == records
    assert seen == [("HeadObject", None), ("GetObject", f"bytes=0-{size - 1}")]


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_segment_larger_than_the_buffer_is_read_in_ranges(
        store: S3ObjectStore, fmt: str) -> None:
    records = make_records(0, 19_999)
    key = SegmentKey("data", "us-east-1", "orders", 0, 0, 0, 19_999)
    write_segment(store, key, records, fmt)
    size = store.head(key.to_key()).size
    buffer = 16 * 1024
    assert size > 4 * buffer
    seen = _requests(store)
    with open_segment(store, key, buffer_size=buffer) as reader:
        got = [r for b in reader.iter_batches(1000) for r in batch_to_records(b)]
    assert got == records
    gets = [r for op, r in seen if op == "GetObject"]
    assert len(gets) > 2
    for r in gets:
        assert r is not None
        lo, hi = (int(x) for x in r.removeprefix("bytes=").split("-"))
        assert hi - lo + 1 < size, r
