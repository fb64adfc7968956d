"""Round trips and refusals of the built-in segment formats (docs/architecture.md, "Segment
format"), over both formats.

Longer than 400 lines: the same round trips and refusals, for both formats.
"""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formats import (
    SEGMENT_SCHEMA,
    SegmentFormat,
    SegmentMetadata,
    WriterOptions,
    available_formats,
    get_format,
)
from formats.base import (
    BATCH_OVERHEAD,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    SegmentWriter,
)
from formats.records import Record, batch_to_records, read_all_records, records_to_batch
from replicator.core.errors import ConfigError, SegmentCorrupt
from replicator.core.keys import SegmentKey

FORMATS = ["parquet", "arrow"]
MiB = 1024**2
WHERE = "s3://bucket/some/segment"


def key_for(start: int, end: int, *, topic: str = "sensor.events", partition: int = 3,
            level: int = 0) -> SegmentKey:
    return SegmentKey("data", "us-east-1", topic, partition, level, start, end)


def write_segment(fmt: SegmentFormat, records: list[Record], key: SegmentKey,
                  options: WriterOptions | None = None, *, batch_rows: int = 1000,
                  message_count: int | None = None) -> bytes:
    stream = io.BytesIO()
    writer = fmt.open_writer(stream, options or WriterOptions())
    for i in range(0, len(records), batch_rows):
        writer.write_batch(records_to_batch(records[i:i + batch_rows]))
    count = len(records) if message_count is None else message_count
    writer.finish(SegmentMetadata.for_key(key, count, created_by="tests"))
    return stream.getvalue()


def read_segment(fmt: SegmentFormat, data: bytes, key: SegmentKey | None,
                 batch_size: int = 1000) -> tuple[SegmentMetadata, list[Record]]:
    reader = fmt.open_reader(io.BytesIO(data), key, where=WHERE)
    try:
        return reader.metadata, read_all_records(reader.iter_batches(batch_size))
    finally:
        reader.close()


EDGE_RECORDS = [
    Record(100, 1_700_000_000_123, None, b"null key"),
    Record(101, 1_700_000_000_124, b"", b"empty key"),
    Record(102, 1_700_000_000_125, b"tombstone", None),
    Record(103, 1_700_000_000_126, b"empty value", b""),
    Record(104, 1_700_000_000_127, b"dups", b"v",
           (("h", b"1"), ("h", b"2"), ("other", b""), ("h", b"3"))),
    Record(105, 1_700_000_000_128, b"\x00\xff", b"\xff\x00\x80",
           (("bin", b"\x00\x01\xfe\xff"), ("null", None), ("émoji-✓", b"utf"))),
    Record(106, 1_700_000_000_129, b"lat", b"log append", (),
           TIMESTAMP_LOG_APPEND_TIME),
    Record(107, 1, b"epoch+1ms", b"x", (), TIMESTAMP_CREATE_TIME),
    Record(108, -1, None, None, (), 0),  # no timestamp (librdkafka reports -1, type 0)
    Record(2**63 - 1, 253_402_300_799_999, b"max", b"max offset, year 9999"),
]


def test_registry_knows_both_formats() -> None:
    assert {"parquet", "arrow"} <= set(available_formats())
    assert get_format("parquet").name == "parquet"
    assert get_format("arrow").name == "arrow"
    with pytest.raises(ConfigError, match=r"format\.name"):
        get_format("csv")


@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_preserves_every_field(name: str) -> None:
    fmt = get_format(name)
    key = key_for(100, 2**63 - 1)
    data = write_segment(fmt, EDGE_RECORDS, key, batch_rows=3)
    meta, records = read_segment(fmt, data, key, batch_size=4)
    assert records == EDGE_RECORDS
    # The distinctions the schema exists for, spelled out.
    assert records[0].key is None and records[1].key == b""
    assert records[2].value is None and records[3].value == b""
    assert records[4].headers == (("h", b"1"), ("h", b"2"), ("other", b""), ("h", b"3"))
    assert records[5].headers[1] == ("null", None)
    assert [r.timestamp_type for r in records[5:8]] == [1, 2, 1]
    assert meta.region == "us-east-1" and meta.topic == "sensor.events"
    assert (meta.partition, meta.level, meta.start_offset, meta.end_offset) == (
        3, 0, 100, 2**63 - 1)
    assert meta.message_count == len(EDGE_RECORDS)
    assert meta.created_by == "tests"


@pytest.mark.parametrize("name", FORMATS)
def test_batches_keep_the_schema_and_respect_batch_size(name: str) -> None:
    fmt = get_format(name)
    records = [Record(i, 1000 + i, b"k%d" % i, b"v" * (i % 50)) for i in range(1000)]
    key = key_for(0, 999)
    # Small groups so the reader crosses group boundaries while re-chunking.
    data = write_segment(fmt, records, key, WriterOptions(row_group_size=4096), batch_rows=37)
    reader = fmt.open_reader(io.BytesIO(data), key)
    batches = list(reader.iter_batches(64))
    assert all(0 < b.num_rows <= 64 for b in batches)
    assert all(b.schema.equals(SEGMENT_SCHEMA, check_metadata=False) for b in batches)
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(1000))


@pytest.mark.parametrize("name", FORMATS)
def test_footer_metadata_round_trips_exactly(name: str) -> None:
    fmt = get_format(name)
    key = key_for(5, 9, level=1)
    created = datetime(2026, 11, 21, 5, 49, 25, 123456, tzinfo=UTC)
    meta = SegmentMetadata.for_key(key, 2, created_by="example_app", created_at=created)
    stream = io.BytesIO()
    writer = fmt.open_writer(stream, WriterOptions())
    writer.write_batch(records_to_batch([Record(5, 1, None, None), Record(9, 2, None, None)]))
    writer.finish(meta)
    stream.seek(0)
    # Parquet records the layout it wrote (2: microseconds and field ids).
    import dataclasses

    want = dataclasses.replace(meta, format_version=2) if name == "parquet" else meta
    assert fmt.open_reader(stream, key).metadata == want


@pytest.mark.parametrize("name", FORMATS)
def test_five_mib_values_span_several_groups(name: str) -> None:
    fmt = get_format(name)
    rng = np.random.default_rng(7)
    records = [Record(i, 1000 + i, b"big-%d" % i, rng.bytes(5 * MiB),
                      (("part", str(i).encode()),)) for i in range(5)]
    records.insert(2, Record(5, 2000, b"small", b"between the big ones"))
    records = [Record(i, r.timestamp_ms, r.key, r.value, r.headers)
               for i, r in enumerate(records)]
    key = key_for(0, 5)
    options = WriterOptions(row_group_size=8 * MiB)
    data = write_segment(fmt, records, key, options, batch_rows=1)
    # Incompressible values: the file holds them all, in more than one group.
    assert len(data) > 25 * MiB
    if name == "parquet":
        assert pq.ParquetFile(io.BytesIO(data)).metadata.num_row_groups >= 2
    _, back = read_segment(fmt, data, key, batch_size=2)
    assert back == records


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("compression,level", [
    ("zstd", None), ("zstd", 9), ("lz4", None), ("snappy", None), ("gzip", None),
    ("brotli", None), ("none", None), ("uncompressed", None), ("ZSTD", 1),
])
def test_every_codec_round_trips(name: str, compression: str, level: int | None) -> None:
    fmt = get_format(name)
    records = [Record(i, 1000 + i, b"k", b"compressible value " * 20) for i in range(300)]
    key = key_for(0, 299)
    data = write_segment(fmt, records, key, WriterOptions(compression=compression,
                                                          compression_level=level))
    assert read_segment(fmt, data, key)[1] == records
    raw = sum(r.raw_size for r in records)
    compresses = compression.lower() in ({"zstd", "lz4", "snappy", "gzip", "brotli"}
                                         if name == "parquet" else {"zstd", "lz4"})
    assert (len(data) < raw / 3) == compresses


def test_parquet_codec_is_recorded_and_unknown_codec_refused() -> None:
    fmt = get_format("parquet")
    records = [Record(0, 1, b"k", b"v")]
    data = write_segment(fmt, records, key_for(0, 0))
    column = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(4)
    assert column.compression == "ZSTD"  # the default
    with pytest.raises(ValueError, match="unknown Parquet compression"):
        fmt.open_writer(io.BytesIO(), WriterOptions(compression="lzma"))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("field,wrong_key", [
    ("topic", key_for(0, 9, topic="other.topic")),
    ("partition", key_for(0, 9, partition=4)),
    ("level", key_for(0, 9, level=1)),
    ("start_offset", key_for(1, 9)),
    ("end_offset", key_for(0, 10)),
])
def test_footer_that_disagrees_with_the_key_is_refused(name: str, field: str,
                                                       wrong_key: SegmentKey) -> None:
    fmt = get_format(name)
    records = [Record(i, i, None, b"v") for i in range(10)]
    data = write_segment(fmt, records, key_for(0, 9))
    with pytest.raises(SegmentCorrupt, match=field):
        fmt.open_reader(io.BytesIO(data), wrong_key, where=WHERE)
    # Without an expected key, the footer is only parsed.
    assert read_segment(fmt, data, None)[1] == records


@pytest.mark.parametrize("name", FORMATS)
def test_message_count_that_disagrees_with_the_rows_is_refused(name: str) -> None:
    fmt = get_format(name)
    records = [Record(i, i, None, b"v") for i in range(3)]
    data = write_segment(fmt, records, key_for(0, 9), message_count=5)
    with pytest.raises(SegmentCorrupt, match="message_count"):
        read_segment(fmt, data, key_for(0, 9))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("garbage", [
    b"", b"x", b"KSR1", b"PAR1", b"not a segment at all" * 100,
    b"PAR1" + b"\x00" * 100 + b"PAR1", b"\x00" * 20 + b"\x10\x00\x00\x00KSR1",
    os.urandom(4096) + b"PAR1",
])
def test_garbage_bytes_are_corrupt(name: str, garbage: bytes) -> None:
    with pytest.raises(SegmentCorrupt, match=WHERE):
        read_segment(get_format(name), garbage, key_for(0, 9))


@pytest.mark.parametrize("name", FORMATS)
def test_truncated_object_is_corrupt(name: str) -> None:
    fmt = get_format(name)
    records = [Record(i, i, b"k", b"value %d" % i) for i in range(500)]
    key = key_for(0, 499)
    data = write_segment(fmt, records, key, WriterOptions(row_group_size=2048))
    for cut in (len(data) - 1, len(data) - 5, len(data) - 12, len(data) // 2, 100, 8, 0):
        with pytest.raises(SegmentCorrupt, match=WHERE):
            read_segment(fmt, data[:cut], key)


@pytest.mark.parametrize("name", FORMATS)
def test_flipped_bytes_in_the_data_are_corrupt(name: str) -> None:
    fmt = get_format(name)
    records = [Record(i, i, b"k", os.urandom(64)) for i in range(200)]
    key = key_for(0, 199)
    data = bytearray(write_segment(fmt, records, key, WriterOptions(compression="none")))
    # Overwrite a stretch inside the data pages with 0xFF: lengths/offsets become absurd.
    middle = len(data) // 3
    data[middle:middle + 64] = b"\xff" * 64
    try:
        _, back = read_segment(fmt, bytes(data), key)
    except SegmentCorrupt as e:
        assert WHERE in str(e)
    else:
        # Uncompressed value bytes may be hit without breaking the structure; then the
        # corruption is silent at this layer, but the record count still holds.
        assert len(back) == 200


@pytest.mark.parametrize("name", FORMATS)
def test_wrong_schema_with_a_valid_footer_is_corrupt(name: str) -> None:
    fmt = get_format(name)
    key = key_for(0, 0)
    other = pa.schema([pa.field("offset", pa.int64()), pa.field("payload", pa.string())])
    batch = pa.RecordBatch.from_pylist([{"offset": 0, "payload": "x"}], schema=other)
    footer = SegmentMetadata.for_key(key, 1).to_footer()
    stream = io.BytesIO()
    if name == "parquet":
        writer = pq.ParquetWriter(stream, other)
        writer.write_batch(batch)
        writer.add_key_value_metadata(footer)
        writer.close()
    else:
        from formats.arrow_ipc import _TRAILER, MAGIC
        with pa.ipc.new_stream(stream, other) as ipc:
            ipc.write_batch(batch)
        raw = __import__("json").dumps(footer).encode()
        stream.write(raw + _TRAILER.pack(len(raw), MAGIC))
    with pytest.raises(SegmentCorrupt, match="schema"):
        read_segment(fmt, stream.getvalue(), key)


@pytest.mark.parametrize("name", FORMATS)
def test_writer_refuses_a_batch_of_another_schema(name: str) -> None:
    writer = get_format(name).open_writer(io.BytesIO(), WriterOptions())
    loose = pa.RecordBatch.from_pylist([{"offset": 1, "value": b"x"}])
    with pytest.raises(ValueError, match="SEGMENT_SCHEMA"):
        writer.write_batch(loose)


@pytest.mark.parametrize("name", FORMATS)
def test_writer_holds_at_most_one_group(name: str) -> None:
    fmt = get_format(name)
    stream = io.BytesIO()
    writer = fmt.open_writer(stream, WriterOptions(row_group_size=256 * 1024))
    sizes = []
    for i in range(20):
        start = i * 50
        writer.write_batch(records_to_batch(
            [Record(start + j, 0, b"k", b"v" * 1000) for j in range(50)]))
        # At most a group of buffers, plus each held batch's own cost (five ~50 KB ones).
        assert 0 < writer.buffered_bytes <= 256 * 1024 + 5 * BATCH_OVERHEAD
        sizes.append((writer.buffered_bytes, stream.tell()))
    # Buffered bytes grow, drop when a group is written, and the stream grows then.
    drops = [i for i in range(1, 20) if sizes[i][0] < sizes[i - 1][0]]
    assert drops
    assert all(sizes[i][1] > sizes[i - 1][1] for i in drops)
    writer.finish(SegmentMetadata.for_key(key_for(0, 999), 1000))
    assert writer.buffered_bytes == 0
    stream.seek(0)
    assert sum(b.num_rows for b in fmt.open_reader(stream).iter_batches(100)) == 1000


@pytest.mark.parametrize("name", FORMATS)
def test_a_group_counts_as_buffered_while_it_is_encoded(name: str) -> None:
    # The group buffer lets go of a group before it is encoded; the writer still holds it
    # (and egress's memory budget must see it) until it is on the stream.
    writers: list[SegmentWriter] = []

    class Watching(io.BytesIO):
        seen: list[int] = []

        def write(self, b: bytes) -> int:  # type: ignore[override]
            self.seen.extend(w.buffered_bytes for w in writers)  # none yet while opening
            return super().write(b)

    stream = Watching()
    writer = get_format(name).open_writer(stream, WriterOptions(row_group_size=256 * 1024))
    writers.append(writer)
    batch = records_to_batch([Record(j, 0, b"k", os.urandom(1000)) for j in range(300)])
    writer.write_batch(batch)     # more than a group: written at once
    assert stream.seen and max(stream.seen) >= 200 * 1024
    assert writer.buffered_bytes < batch.nbytes


@pytest.mark.parametrize("name", FORMATS)
def test_a_batch_larger_than_a_group_is_cut_into_groups(name: str) -> None:
    fmt = get_format(name)
    group = 256 * 1024
    records = [Record(5 + i, i, b"k%d" % i, os.urandom(1000)) for i in range(2000)]  # 2 MB
    small = [Record(i if i < 5 else 2000 + i, i, b"s", b"x" * 100) for i in range(10)]
    stream = io.BytesIO()
    writer = fmt.open_writer(stream, WriterOptions(row_group_size=group, compression="none"))
    writer.write_batch(records_to_batch(small[:5]))
    writer.write_batch(records_to_batch(records))  # one batch, eight groups' worth
    assert writer.buffered_bytes <= group
    # Small batches after the big one: the leftover slice plus these still fit one group.
    writer.write_batch(records_to_batch(small[5:]))
    writer.finish(SegmentMetadata.for_key(key_for(0, 2009), 2010))
    data = stream.getvalue()
    if name == "parquet":
        meta = pq.ParquetFile(io.BytesIO(data)).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        sizes = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
    else:
        batches = list(pa.ipc.open_stream(io.BytesIO(data)))
        groups = [b.num_rows for b in batches]
        sizes = [b.nbytes for b in batches]
    assert sum(groups) == 2010
    assert len(groups) >= 8
    assert max(sizes) <= group * 1.1, sizes  # uncompressed: encoded size ≈ Arrow size
    assert read_segment(fmt, data, None)[1] == small[:5] + records + small[5:]


@pytest.mark.parametrize("name", FORMATS)
def test_empty_segment_round_trips(name: str) -> None:
    fmt = get_format(name)
    key = key_for(0, 9)
    meta, records = read_segment(fmt, write_segment(fmt, [], key), key)
    assert records == [] and meta.message_count == 0


def test_writer_does_not_close_the_stream() -> None:
    for name in FORMATS:
        stream = io.BytesIO()
        writer = get_format(name).open_writer(stream, WriterOptions())
        writer.finish(SegmentMetadata.for_key(key_for(0, 0), 0))
        del writer
        gc.collect()
        assert not stream.closed
        stream.write(b"")  # still usable


# --- property test ------------------------------------------------------------------------

_bytes_or_none = st.none() | st.binary(max_size=40)
_record_parts = st.tuples(
    st.integers(min_value=0, max_value=5),                     # offset gap (compacted)
    st.integers(min_value=-1, max_value=2**41),                # timestamp ms
    st.sampled_from([0, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME]),
    _bytes_or_none,
    _bytes_or_none,
    st.lists(st.tuples(st.text(max_size=8), _bytes_or_none), max_size=4),
)


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(_record_parts, max_size=60), batch_rows=st.integers(1, 25),
       batch_size=st.integers(1, 30), first=st.integers(0, 2**62))
def test_random_records_round_trip(name: str, parts: list[tuple[int, int, int, bytes | None,
                                   bytes | None, list[tuple[str, bytes | None]]]],
                                   batch_rows: int, batch_size: int, first: int) -> None:
    records: list[Record] = []
    offset = first
    for gap, ts, ts_type, k, v, hs in parts:
        offset += gap + (1 if records else 0)
        records.append(Record(offset, ts, k, v, tuple(hs), ts_type))
    end = records[-1].offset if records else first
    key = key_for(first, end)
    fmt = get_format(name)
    data = write_segment(fmt, records, key, WriterOptions(row_group_size=512),
                         batch_rows=batch_rows)
    assert read_segment(fmt, data, key, batch_size=batch_size)[1] == records


# --- streaming memory -------------------------------------------------------------------

STREAM_RECORDS = 1_000_000
STREAM_BATCH = 10_000


def fixed_width(data: np.ndarray, type_: pa.DataType | None = None) -> pa.Array:
    """A binary/string array over a fixed-width numpy ``S`` array, without Python objects."""
    n, width = len(data), data.dtype.itemsize
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(type_ or pa.binary(), n, [None, pa.py_buffer(offsets),
                                            pa.py_buffer(data.tobytes())])


def small_batch(start: int, n: int) -> pa.RecordBatch:
    """``n`` small records (16-byte key, 40-byte value, one header), built column-wise."""
    offsets = np.arange(start, start + n, dtype=np.int64)
    keys = np.char.zfill(offsets.astype("S16"), 16)
    values = np.char.add(np.char.add(b"value-", keys), b"-padding-to-40!!!!")
    header_type = SEGMENT_SCHEMA.field("headers").type
    struct = pa.StructArray.from_arrays(
        [fixed_width(np.full(n, b"trace", dtype="S5"), pa.string()), fixed_width(keys)],
        fields=list(header_type.value_type))
    headers = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), struct,
                                       type=header_type)
    return pa.RecordBatch.from_arrays([
        pa.array(offsets),
        pa.array(1_700_000_000_000 + offsets).cast(pa.timestamp("ms", tz="UTC")),
        pa.array(np.ones(n, dtype=np.int8)),
        fixed_width(keys),
        fixed_width(values),
        headers,
    ], schema=SEGMENT_SCHEMA)


class PeakRss:
    """Peak resident memory of this process over a stretch of code.

    Uses the kernel's high-water mark (``VmHWM``, reset through ``clear_refs``) so peaks
    inside a call are seen; falls back to psutil samples taken by ``sample()``.
    """

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.base = self.peak = 0
        self.kernel = Path("/proc/self/clear_refs").exists()

    def _hwm(self) -> int:
        status = Path("/proc/self/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def start(self) -> None:
        gc.collect()
        if self.kernel:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.kernel = False
        self.base = self.peak = self.proc.memory_info().rss

    def sample(self) -> None:
        self.peak = max(self.peak, self.proc.memory_info().rss)

    def growth(self) -> int:
        self.sample()
        if self.kernel:
            self.peak = max(self.peak, self._hwm())
        return self.peak - self.base


def measure_streaming(name: str, path: str, mode: str,
                      compression: str = "zstd") -> dict[str, int]:
    """Write then read 1M records through format ``name``; RSS growth of each phase.

    ``mode="naive"`` instead keeps every batch in memory: the control that shows the bound
    would catch an implementation that holds the segment.
    """
    fmt = get_format(name)
    key = key_for(0, STREAM_RECORDS - 1)
    rss = PeakRss()
    small_batch(0, STREAM_BATCH)  # warm up imports and caches
    if mode == "naive":
        rss.start()
        held = []
        for start in range(0, STREAM_RECORDS, STREAM_BATCH):
            held.append(small_batch(start, STREAM_BATCH))
            rss.sample()
        return {"write": rss.growth(), "read": 0, "rows": sum(b.num_rows for b in held)}
    rss.start()
    with open(path, "wb") as f:
        writer = fmt.open_writer(f, WriterOptions(compression=compression,
                                                  row_group_size=4 * MiB))
        for start in range(0, STREAM_RECORDS, STREAM_BATCH):
            writer.write_batch(small_batch(start, STREAM_BATCH))
            rss.sample()
        writer.finish(SegmentMetadata.for_key(key, STREAM_RECORDS))
    write_growth = rss.growth()
    rss.start()
    rows, expected_next = 0, 0
    with open(path, "rb") as f:
        reader = fmt.open_reader(f, key, where=path)
        for batch in reader.iter_batches(STREAM_BATCH):
            offsets = batch.column("offset")
            assert offsets[0].as_py() == expected_next
            expected_next = offsets[-1].as_py() + 1
            rows += batch.num_rows
            rss.sample()
        reader.close()
    return {"write": write_growth, "read": rss.growth(), "rows": rows}


def run_measurement(name: str, path: Path, mode: str,
                    compression: str = "zstd") -> dict[str, int]:
    """``measure_streaming`` in a fresh interpreter with allocators that give memory back.

    Arrow's default allocator (mimalloc) and glibc's adaptive mmap threshold keep freed
    memory mapped, so RSS in a long test process measures throughput and history, not what
    is held. The system pool and a fixed mmap threshold make RSS track live memory.
    """
    env = dict(os.environ, ARROW_DEFAULT_MEMORY_POOL="system",
               MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
    code = ("import json, sys; from tests.unit.test_formats import measure_streaming; "
            "print(json.dumps(measure_streaming(*sys.argv[1:5])))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code, name, str(path), mode, compression],
                         env=env,
                         cwd=root, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    result: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


STREAM_BOUND = 40 * MiB
"""RSS growth allowed while streaming 1M records (about 110 MiB of Arrow data).

Measured (system allocator, peak RSS): Parquet 15 MiB writing / 14 MiB reading with 4 MiB
groups, Arrow IPC 11 / 10 MiB; holding the batches instead grows RSS by about 110 MiB.
"""


def test_holding_a_million_records_would_break_the_bound(tmp_path: Path) -> None:
    naive = run_measurement("parquet", tmp_path / "unused", "naive")
    assert naive["rows"] == STREAM_RECORDS
    assert naive["write"] > 2 * STREAM_BOUND, naive


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_million_records_stream_in_bounded_memory(name: str, compression: str,
                                                    tmp_path: Path) -> None:
    """Writing and reading 1M small records holds one group, not the segment.

    Uncompressed, the file itself (~70 MB) is bigger than the bound, so a reader that
    buffers the file (as Arrow's Parquet pre-buffering of all row groups does) fails too.
    """
    path = tmp_path / "segment"
    result = run_measurement(name, path, "stream", compression)
    assert result["rows"] == STREAM_RECORDS
    min_size = 3 * MiB if compression == "zstd" else 2 * STREAM_BOUND
    assert path.stat().st_size > min_size
    assert result["write"] < STREAM_BOUND, f"writer RSS grew {result['write'] / MiB:.1f} MiB"
    assert result["read"] < STREAM_BOUND, f"reader RSS grew {result['read'] / MiB:.1f} MiB"


def test_batch_to_records_matches_records_to_batch() -> None:
    batch = records_to_batch(EDGE_RECORDS)
    assert batch.schema.equals(SEGMENT_SCHEMA)
    assert list(batch_to_records(batch)) == EDGE_RECORDS
    assert list(batch_to_records(batch.slice(4, 2))) == EDGE_RECORDS[4:6]
    assert records_to_batch([]).num_rows == 0


@pytest.mark.parametrize("source,target", [("parquet", "arrow"), ("arrow", "parquet"),
                                           ("parquet", "parquet")])
def test_batches_read_from_one_format_write_to_another(source: str, target: str) -> None:
    """Compaction's path: batches of several segments merged into one, across formats."""
    records = EDGE_RECORDS[:-1]
    first = write_segment(get_format(source), records[:4], key_for(100, 103))
    second = write_segment(get_format(source), records[4:], key_for(104, 108))
    stream = io.BytesIO()
    writer = get_format(target).open_writer(stream, WriterOptions())
    for data, key in ((first, key_for(100, 103)), (second, key_for(104, 108))):
        for batch in get_format(source).open_reader(io.BytesIO(data), key).iter_batches(3):
            assert str(batch.schema) == str(SEGMENT_SCHEMA)  # same names, no metadata
            assert batch.schema.metadata is None
            writer.write_batch(batch)
    writer.finish(SegmentMetadata.for_key(key_for(100, 108, level=1), len(records)))
    assert read_segment(get_format(target), stream.getvalue(),
                        key_for(100, 108, level=1))[1] == records


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("compression,level", [("zstd", 23), ("gzip", 12), ("snappy", 3),
                                               ("lz4", 0)])
def test_bad_compression_level_is_refused_when_the_writer_opens(
        name: str, compression: str, level: int) -> None:
    ipc_ignores = name == "arrow" and compression in {"gzip", "snappy"}
    if ipc_ignores:  # Arrow IPC writes these uncompressed, so the level means nothing
        get_format(name).open_writer(io.BytesIO(), WriterOptions(compression, level))
        return
    with pytest.raises(ValueError, match="compression"):
        get_format(name).open_writer(io.BytesIO(), WriterOptions(compression, level))


def _stored_reader_rows(name: str, data: bytes, key: SegmentKey) -> int:
    """Rows read through the real store path (a buffered reader over ranged GETs)."""
    from formats.segment_io import open_segment
    from replicator.core.storage import MemoryObjectStore

    store = MemoryObjectStore("bucket")
    store.put(key.to_key(), data)
    with open_segment(store, key, buffer_size=4096) as reader:
        return sum(b.num_rows for b in reader.iter_batches(7))


@pytest.mark.parametrize("name", FORMATS)
def test_damaged_bytes_are_corrupt_or_harmless_never_another_error(name: str) -> None:
    """Random byte damage anywhere: SegmentCorrupt, or (damage in value bytes or unused
    metadata) a full read. Never MemoryError, UnicodeDecodeError or a raw Arrow error."""
    import random

    fmt = get_format(name)
    key = key_for(0, 99)
    records = [Record(i, i, b"k%d" % i, b"v" * (i % 30), (("h", b"x"),) if i % 2 else ())
               for i in range(100)]
    good = write_segment(fmt, records, key, WriterOptions(row_group_size=4096), batch_rows=100)
    rnd = random.Random(20261121)
    corrupt = 0
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rnd.choice([1, 2, 4, 8])):
            # Half the damage lands in the last 600 bytes: footers and trailers.
            pos = (rnd.randrange(len(data)) if rnd.random() < 0.5
                   else len(data) - 1 - rnd.randrange(600))
            data[pos] = rnd.choice([0, 0xFF, 0x7F, 0x80, rnd.randrange(256)])
        try:
            assert _stored_reader_rows(name, bytes(data), key) == 100
        except SegmentCorrupt:
            corrupt += 1
    assert corrupt > 200


def test_arrow_message_with_a_huge_body_length_is_corrupt() -> None:
    """A damaged length field must not make the buffered reader allocate 1 TiB."""
    import struct

    key = key_for(0, 9)
    data = bytearray(write_segment(get_format("arrow"),
                                   [Record(i, 0, b"k", b"v" * 100) for i in range(10)], key,
                                   WriterOptions(compression="none")))
    messages = pa.ipc.MessageReader.open_stream(io.BytesIO(bytes(data)))
    schema_message = messages.read_next_message()
    body = messages.read_next_message().body.size
    at = data.find(struct.pack("<q", body), schema_message.serialize().size)
    assert at > 0
    data[at:at + 8] = struct.pack("<q", 2**40)
    with pytest.raises(SegmentCorrupt, match="message body"):
        _stored_reader_rows("arrow", bytes(data), key)
