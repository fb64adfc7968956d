"""SegmentUpload → publish_segment → open_segment on the in-memory object store."""

from __future__ import annotations

import gc
import io
from collections.abc import Callable
from typing import Any, BinaryIO

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formats import SegmentMetadata, WriterOptions, get_format, segment_io
from formats.records import Record, read_all_records, records_to_batch
from formats.segment_io import (
    SegmentUpload,
    largest_row_bytes,
    open_segment,
    publish_segment,
    raw_size_of_batch,
)
from replicator.core.errors import (
    ObjectNotFound,
    SegmentCorrupt,
    SegmentNotFound,
    StorageError,
)
from replicator.core.keys import SegmentKey, is_temp_key
from replicator.core.storage import MemoryObjectStore, ObjectInfo, Upload

FORMATS = ["parquet", "arrow"]
TEMP = "data/_tmp"


def key_for(start: int, end: int) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "orders", 2, 0, start, end)


def make_records(start: int, n: int) -> list[Record]:
    return [Record(start + i, 1_700_000_000_000 + i, b"key-%d" % i if i % 3 else None,
                   b"value-" * (i % 7) if i % 5 else None,
                   (("trace", b"t%d" % i), ("é", None)) if i % 2 else ())
            for i in range(n)]


def upload_records(store: MemoryObjectStore, name: str, records: list[Record],
                   options: WriterOptions | None = None,
                   batch_rows: int = 100) -> tuple[SegmentUpload, ObjectInfo]:
    upload = SegmentUpload(store, get_format(name), TEMP, options or WriterOptions())
    for i in range(0, len(records), batch_rows):
        upload.write_batch(records_to_batch(records[i:i + batch_rows]))
    key = key_for(records[0].offset, records[-1].offset)
    return upload, upload.finish(SegmentMetadata.for_key(key, len(records)))


def test_raw_size_of_batch_matches_records_including_slices() -> None:
    records = make_records(0, 50)
    batch = records_to_batch(records)
    assert raw_size_of_batch(batch) == sum(r.raw_size for r in records)
    assert raw_size_of_batch(batch.slice(7, 20)) == sum(r.raw_size for r in records[7:27])
    assert raw_size_of_batch(batch.slice(50)) == 0
    nulls = records_to_batch([Record(0, 0, None, None)])
    assert raw_size_of_batch(nulls) == 0
    # Header names count in UTF-8 bytes: "é" is two.
    assert raw_size_of_batch(records_to_batch([Record(0, 0, b"k", b"vv", (("é", b"x"),))])) \
        == 1 + 2 + 2 + 1


_BYTES = st.one_of(st.none(), st.binary(max_size=12))
_RECORD = st.builds(
    lambda k, v, h, t: Record(0, t, k, v, tuple(h)), _BYTES, _BYTES,
    st.lists(st.tuples(st.text(max_size=4), _BYTES), max_size=3),
    st.integers(-2**40, 2**40))


@settings(max_examples=150, deadline=None)
@given(st.lists(_RECORD, max_size=30), st.integers(0, 30), st.integers(0, 30))
def test_raw_size_of_batch_is_the_records_raw_size_for_any_slice(
        records: list[Record], start: int, length: int) -> None:
    # Read from the offsets buffers where no slot is null, by the kernels where one is: the
    # same figure either way, whatever the slice.
    records = [Record(i, r.timestamp_ms, r.key, r.value, r.headers)
               for i, r in enumerate(records)]
    batch = records_to_batch(records)
    assert raw_size_of_batch(batch) == sum(r.raw_size for r in records)
    part = batch.slice(start, length)
    assert raw_size_of_batch(part) == sum(r.raw_size for r in records[start:start + length])


@settings(max_examples=150, deadline=None)
@given(st.lists(_RECORD, max_size=30), st.booleans(), st.integers(0, 30), st.integers(0, 30))
def test_largest_row_bytes_is_the_longest_key_plus_the_longest_value_of_any_slice(
        records: list[Record], nulls: bool, start: int, length: int) -> None:
    # Offsets buffers where no slot is null, the kernels where one is: the same figure.
    records = [Record(i, r.timestamp_ms, r.key if nulls else r.key or b"",
                      r.value if nulls else r.value or b"", r.headers)
               for i, r in enumerate(records)]
    part = records[start:start + length]
    assert largest_row_bytes(records_to_batch(records).slice(start, length)) == \
        max((len(r.key or b"") for r in part), default=0) + \
        max((len(r.value or b"") for r in part), default=0)


def test_timestamp_range_is_taken_over_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # The range is taken once per TIMESTAMP_RANGE_ROWS rows and at finish: the extremes of
    # batches on either side of a reduction, and of the last ones, all reach the footer.
    monkeypatch.setattr(segment_io, "TIMESTAMP_RANGE_ROWS", 5)
    stamps = [50, 7, 60, 3, 55, 99, 10, 8, 40, 20, 30, 2, 98, 9, 1, 100]
    records = [Record(i, t, b"k", b"v") for i, t in enumerate(stamps)]
    store = MemoryObjectStore("bucket")
    _, temp = upload_records(store, "parquet", records, batch_rows=3)
    reader = get_format("parquet").open_reader(io.BytesIO(store.get(temp.key)),
                                               key_for(0, len(stamps) - 1))
    meta = reader.metadata
    assert (meta.min_timestamp, meta.max_timestamp) == (1, 100)


@pytest.mark.parametrize("name", FORMATS)
def test_upload_publish_open_round_trip(name: str) -> None:
    store = MemoryObjectStore("bucket")
    records = make_records(1000, 950)
    upload, temp = upload_records(store, name, records)
    key = key_for(1000, 1949)

    assert is_temp_key(upload.temp_key, TEMP)
    assert temp.key == upload.temp_key and temp.size == upload.bytes_uploaded
    assert store.keys() == [upload.temp_key]  # only the temp object is visible
    assert upload.message_count == 950
    assert (upload.first_offset, upload.last_offset) == (1000, 1949)
    assert upload.raw_bytes == sum(r.raw_size for r in records)

    final = publish_segment(store, temp.key, key, "STANDARD_IA").info
    assert final.key == key.to_key() and final.storage_class == "STANDARD_IA"
    assert store.keys() == [key.to_key()]
    assert final.size == temp.size

    with open_segment(store, key, buffer_size=64 * 1024) as reader:
        assert reader.metadata.message_count == 950
        assert reader.metadata.start_offset == 1000
        assert read_all_records(reader.iter_batches(128)) == records


@pytest.mark.parametrize("name", FORMATS)
def test_buffered_bytes_counts_writer_and_upload(name: str) -> None:
    store = MemoryObjectStore("bucket", part_size=64 * 1024)
    upload = SegmentUpload(store, get_format(name), TEMP,
                           WriterOptions(row_group_size=64 * 1024))
    assert upload.first_offset is None and upload.last_offset is None
    big = [Record(i, 0, b"k", bytes(1000)) for i in range(100)]
    upload.write_batch(records_to_batch(big[:10]))
    assert upload.buffered_bytes > 10_000  # the writer holds the first batch
    seen = []
    for i in range(10, 100, 10):
        upload.write_batch(records_to_batch(big[i:i + 10]))
        seen.append(upload.buffered_bytes)
        # At most one group plus one batch in the writer, one part in the upload.
        assert upload.buffered_bytes < 64 * 1024 + 20_000 + 64 * 1024
    assert upload.bytes_uploaded > 0
    assert len(set(seen)) > 1
    upload.finish(SegmentMetadata.for_key(key_for(0, 99), 100))


@pytest.mark.parametrize("name", FORMATS)
def test_abort_leaves_nothing_visible(name: str) -> None:
    store = MemoryObjectStore("bucket", part_size=8 * 1024)
    upload = SegmentUpload(store, get_format(name), TEMP,
                           WriterOptions(row_group_size=4096, compression="none"))
    for start in range(0, 500, 50):
        upload.write_batch(records_to_batch(make_records(start, 50)))
    assert upload.bytes_uploaded > 8 * 1024  # parts were "sent"
    upload.abort()
    upload.abort()  # idempotent
    assert store.keys() == []
    assert store.uploads_open == set()
    with pytest.raises(ValueError, match="aborted"):
        upload.write_batch(records_to_batch(make_records(500, 1)))
    with pytest.raises(ValueError, match="aborted"):
        upload.finish(SegmentMetadata.for_key(key_for(0, 499), 500))


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("name", FORMATS)
def test_aborted_writer_collected_later_writes_nowhere(name: str) -> None:
    store = MemoryObjectStore("bucket")
    upload = SegmentUpload(store, get_format(name), TEMP, WriterOptions())
    upload.write_batch(records_to_batch(make_records(0, 10)))
    upload.abort()
    del upload
    gc.collect()  # Parquet's writer closes itself in __del__: it must not hit the upload
    assert store.keys() == []


def test_abort_after_finish_deletes_the_temp_object() -> None:
    store = MemoryObjectStore("bucket")
    upload, _ = upload_records(store, "parquet", make_records(0, 10))
    assert store.keys() == [upload.temp_key]
    upload.abort()
    assert store.keys() == []


def test_offsets_must_ascend_and_count_must_match() -> None:
    store = MemoryObjectStore("bucket")
    upload = SegmentUpload(store, get_format("parquet"), TEMP, WriterOptions())
    upload.write_batch(records_to_batch(make_records(10, 5)))
    with pytest.raises(ValueError, match="offset 14 after 14"):
        upload.write_batch(records_to_batch(make_records(14, 2)))
    upload.write_batch(records_to_batch([]))  # empty batches are ignored
    with pytest.raises(ValueError, match="message_count=6"):
        upload.finish(SegmentMetadata.for_key(key_for(10, 15), 6))
    assert upload.finish(SegmentMetadata.for_key(key_for(10, 14), 5)).size > 0


class _FlakyUpload(Upload):
    """Delegates to a real upload; ``complete`` fails the first ``failures`` times."""

    def __init__(self, inner: Upload, failures: int) -> None:
        self.inner = inner
        self.key = inner.key
        self.failures = failures

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self.inner.write(data)

    def complete(self) -> ObjectInfo:
        if self.failures > 0:
            self.failures -= 1
            raise StorageError(f"s3://bucket/{self.key}: 503 SlowDown")
        return self.inner.complete()

    def abort(self) -> None:
        self.inner.abort()

    @property
    def bytes_written(self) -> int:
        return self.inner.bytes_written

    @property
    def buffered_bytes(self) -> int:
        return self.inner.buffered_bytes


class _FlakyStore(MemoryObjectStore):
    def __init__(self, failures: int) -> None:
        super().__init__("bucket")
        self.failures = failures
        self.streams: list[BinaryIO] = []

    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        return _FlakyUpload(super().open_upload(key, storage_class=storage_class),
                            self.failures)

    def open_read(self, key: str, *, buffer_size: int = 8 * 1024**2) -> BinaryIO:
        stream = super().open_read(key, buffer_size=buffer_size)
        self.streams.append(stream)
        return stream


@pytest.mark.parametrize("name", FORMATS)
def test_finish_can_be_retried_after_a_failed_complete(name: str) -> None:
    store = _FlakyStore(failures=2)
    records = make_records(0, 100)
    upload = SegmentUpload(store, get_format(name), TEMP, WriterOptions())
    upload.write_batch(records_to_batch(records))
    meta = SegmentMetadata.for_key(key_for(0, 99), 100)
    for _ in range(2):
        with pytest.raises(StorageError):
            upload.finish(meta)
    temp = upload.finish(meta)  # the footer was written once; the object is whole
    publish_segment(store, temp.key, key_for(0, 99))
    with open_segment(store, key_for(0, 99)) as reader:
        assert read_all_records(reader.iter_batches(1000)) == records


def test_publish_is_safe_to_repeat() -> None:
    store = MemoryObjectStore("bucket")
    _, temp = upload_records(store, "arrow", make_records(0, 20))
    key = key_for(0, 19)
    first = publish_segment(store, temp.key, key).info
    again = publish_segment(store, temp.key, key).info  # temp gone, final there
    assert again.key == first.key == key.to_key()
    assert store.keys() == [key.to_key()]
    with pytest.raises(ObjectNotFound):
        publish_segment(store, "data/_tmp/never-written", key_for(100, 119))


def test_publish_reports_a_temp_left_behind_and_runs_each_step_through_attempt() -> None:
    class NoDelete(MemoryObjectStore):
        def delete(self, key: str) -> None:
            raise StorageError(f"injected delete failure for {key}")

    store = NoDelete("bucket")
    _, temp = upload_records(store, "parquet", make_records(0, 20))
    steps: list[str] = []

    def attempt(fn: Callable[[], Any], what: str) -> Any:
        steps.append(what.split(maxsplit=1)[0])
        return fn()

    published = publish_segment(store, temp.key, key_for(0, 19), attempt=attempt)
    assert steps == ["copy", "delete"]
    assert published.info.key == key_for(0, 19).to_key()
    assert isinstance(published.temp_error, StorageError)    # returned, not raised
    assert store.keys() == sorted([temp.key, key_for(0, 19).to_key()])


def test_open_segment_refuses_missing_and_mismatched_objects() -> None:
    store = _FlakyStore(failures=0)
    with pytest.raises(SegmentNotFound, match="s3://bucket/data/us-east-1/orders/2/0/"):
        open_segment(store, key_for(0, 19))
    _, temp = upload_records(store, "parquet", make_records(0, 20))
    wrong = key_for(0, 29)
    store.copy(temp.key, wrong.to_key())  # right bytes, wrong key
    with pytest.raises(SegmentCorrupt, match=r"end_offset") as err:
        open_segment(store, wrong)
    assert wrong.to_key() in str(err.value)
    assert store.streams[-1].closed  # a refused segment does not leak its stream
    store.put(key_for(50, 59).to_key(), b"garbage bytes, not parquet")
    with pytest.raises(SegmentCorrupt, match=r"s3://bucket/.*00000000000000000050"):
        open_segment(store, key_for(50, 59))
    publish_segment(store, temp.key, key_for(0, 19))
    with open_segment(store, key_for(0, 19)) as reader:  # the segment's own bytes name it
        assert reader.format is not None and reader.format.name == "parquet"


def test_reader_closes_its_stream() -> None:
    store = _FlakyStore(failures=0)
    _, temp = upload_records(store, "parquet", make_records(0, 20))
    publish_segment(store, temp.key, key_for(0, 19))
    reader = open_segment(store, key_for(0, 19))
    assert not store.streams[-1].closed
    assert sum(b.num_rows for b in reader.iter_batches(7)) == 20
    reader.close()
    assert store.streams[-1].closed


def test_upload_accepts_columnar_batches_without_records() -> None:
    """The egress hot path builds columns directly; SegmentUpload must take them as-is."""
    from formats import SEGMENT_SCHEMA

    n = 1000
    headers_type = SEGMENT_SCHEMA.field("headers").type
    batch = pa.RecordBatch.from_arrays([
        pa.array(range(n), pa.int64()),
        pa.array([0] * n, pa.timestamp("ms", tz="UTC")),
        pa.array([1] * n, pa.int8()),
        pa.array([b"k"] * n, pa.binary()),
        pa.array([b"v" * 10] * n, pa.binary()),
        pa.array([[]] * n, headers_type),
    ], schema=SEGMENT_SCHEMA)
    store = MemoryObjectStore("bucket")
    upload = SegmentUpload(store, get_format("parquet"), TEMP, WriterOptions())
    upload.write_batch(batch.slice(0, 600))
    upload.write_batch(batch.slice(600))
    assert upload.raw_bytes == 11 * n
    temp = upload.finish(SegmentMetadata.for_key(key_for(0, n - 1), n))
    data = store.get(temp.key)
    reader = get_format("parquet").open_reader(io.BytesIO(data), key_for(0, n - 1))
    assert sum(b.num_rows for b in reader.iter_batches(256)) == n


class _FailingReads(MemoryObjectStore):
    """``get_range`` raises a retriable error on its ``fail_at``-th call."""

    def __init__(self) -> None:
        super().__init__("bucket")
        self.fail_at = 0
        self.calls = 0

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.calls += 1
        if self.calls == self.fail_at:
            raise StorageError(f"s3://{self.bucket}/{key}: 503 SlowDown")
        return super().get_range(key, start, length)


@pytest.mark.parametrize("name", FORMATS)
def test_storage_errors_while_reading_stay_retriable(name: str) -> None:
    """A 503 in the middle of a segment is a StorageError to retry, never SegmentCorrupt."""
    import os

    store = _FailingReads()
    records = [Record(i, 0, None, os.urandom(1024)) for i in range(1000)]
    _, temp = upload_records(store, name, records,
                             WriterOptions(row_group_size=64 * 1024, compression="none"))
    key = key_for(0, 999)
    publish_segment(store, temp.key, key)
    with open_segment(store, key, buffer_size=64 * 1024) as reader:
        assert sum(b.num_rows for b in reader.iter_batches(100)) == 1000
    total = store.calls
    assert total > 10
    for fail_at in (1, 2, total // 2, total):
        store.calls, store.fail_at = 0, fail_at
        with pytest.raises(StorageError, match="503"), \
                open_segment(store, key, buffer_size=64 * 1024) as reader:
            for _ in reader.iter_batches(100):
                pass


@pytest.mark.parametrize("name", FORMATS)
def test_storage_errors_while_writing_stay_retriable(name: str) -> None:
    class _FailingUpload(_FlakyUpload):
        """Takes the format's header bytes, then fails like a part upload would."""

        def write(self, data: bytes | bytearray | memoryview) -> int:
            if self.inner.bytes_written >= 4:
                raise StorageError(f"s3://bucket/{self.key}: part upload failed")
            return self.inner.write(data)

    class _Store(MemoryObjectStore):
        def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
            return _FailingUpload(super().open_upload(key), 0)

    store = _Store("bucket")
    upload = SegmentUpload(store, get_format(name), TEMP, WriterOptions(row_group_size=65536))
    with pytest.raises(StorageError, match="part upload failed"):
        for start in range(0, 1000, 100):
            upload.write_batch(records_to_batch(
                [Record(start + i, 0, None, bytes(1000)) for i in range(100)]))
        upload.finish(SegmentMetadata.for_key(key_for(0, 999), 1000))
    upload.abort()
    assert store.keys() == []
