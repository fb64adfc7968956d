"""Throughput and peak memory of the segment formats, through SegmentUpload and open_segment.

Usage::

    ARROW_DEFAULT_MEMORY_POOL=system MALLOC_MMAP_THRESHOLD_=65536 \\
        .venv/bin/python bench/formats_memory.py [--records N] [--value-size B] [--format F]

Writes N records (in batches of 10k, built column-wise like the egress hot path) through
``SegmentUpload`` onto a ``MemoryObjectStore`` whose uploads keep only a byte count (so the
store itself holds nothing), then reads a real segment back with ``open_segment``. Prints
raw MB/s per core (process CPU time) and the peak RSS growth of each phase (kernel VmHWM).
The system allocator settings make RSS track live memory (mimalloc keeps freed pages).
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa

from formats import SEGMENT_SCHEMA, SegmentMetadata, WriterOptions, get_format
from formats.segment_io import SegmentUpload, open_segment, publish_segment
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore, ObjectInfo, Upload

MiB = 1024**2


class _CountingUpload(Upload):
    """Accepts bytes and forgets them: measures the writer, not the store."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._n = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._n += len(data)
        return len(data)

    def complete(self) -> ObjectInfo:
        from datetime import UTC, datetime
        return ObjectInfo(self.key, self._n, datetime.now(UTC))

    def abort(self) -> None:
        self._n = 0

    @property
    def bytes_written(self) -> int:
        return self._n

    @property
    def buffered_bytes(self) -> int:
        return 0


class _CountingStore(MemoryObjectStore):
    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        return _CountingUpload(key)


def _fixed(data: np.ndarray, type_: pa.DataType) -> pa.Array:
    n, width = len(data), data.dtype.itemsize
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets),
                                            pa.py_buffer(data.tobytes())])


def make_batch(start: int, n: int, value_size: int, rng: np.random.Generator) -> pa.RecordBatch:
    """JSON-ish values (a vocabulary of words plus random digits): about 3-5x compressible."""
    offsets = np.arange(start, start + n, dtype=np.int64)
    keys = np.char.zfill((offsets % 10_000).astype("S12"), 12)
    words = rng.choice(np.array([b'{"id":', b'"temp":', b'"sensor-', b'","ok":true,',
                                 b'"reading":', b' 12.5', b'"unit":"C"}'], dtype="S12"),
                       size=n * (value_size // 8 + 1))
    text = b"".join(words.tolist())
    body = np.frombuffer(text[: n * value_size], dtype=np.uint8).copy()
    body[::11] = rng.integers(48, 58, size=body[::11].size, dtype=np.uint8)
    values = body.view(f"S{value_size}")
    header_type = SEGMENT_SCHEMA.field("headers").type
    struct = pa.StructArray.from_arrays(
        [_fixed(np.full(n, b"trace-id", dtype="S8"), pa.string()), _fixed(keys, pa.binary())],
        fields=list(header_type.value_type))
    headers = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), struct,
                                       type=header_type)
    return pa.RecordBatch.from_arrays([
        pa.array(offsets),
        pa.array(1_700_000_000_000 + offsets).cast(pa.timestamp("ms", tz="UTC")),
        pa.array(np.ones(n, dtype=np.int8)),
        _fixed(keys, pa.binary()),
        _fixed(values, pa.binary()),
        headers,
    ], schema=SEGMENT_SCHEMA)


def renumber(batch: pa.RecordBatch, start: int) -> pa.RecordBatch:
    """The same records with offsets ``start, start + 1, ...``."""
    offsets = pa.array(np.arange(start, start + batch.num_rows, dtype=np.int64))
    return batch.set_column(0, SEGMENT_SCHEMA.field("offset"), offsets)


def _hwm_reset() -> None:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")


def _hwm() -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def run(name: str, records: int, value_size: int, compression: str) -> None:
    fmt = get_format(name)
    rng = np.random.default_rng(1)
    batch_rows = 10_000
    batches = [make_batch(0, batch_rows, value_size, rng) for _ in range(4)]
    proc = psutil.Process()
    options = WriterOptions(compression=compression)

    # Write phase: the upload forgets bytes, so memory is the writer's alone.
    _hwm_reset()
    base = proc.memory_info().rss
    cpu0, wall0 = time.process_time(), time.perf_counter()
    upload = SegmentUpload(_CountingStore("bench"), fmt, "data/_tmp", options)
    for i, start in enumerate(range(0, records, batch_rows)):
        b = batches[i % len(batches)]
        n = min(batch_rows, records - start)
        # Same column data, new offsets: the offset column is cheap to rebuild.
        b = renumber(b.slice(0, n), start)
        upload.write_batch(b)
    key = SegmentKey("data", "us-east-1", "bench", 0, 0, 0, records - 1)
    info = upload.finish(SegmentMetadata.for_key(key, records))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    write_peak = _hwm() - base
    raw = upload.raw_bytes
    print(f"{name:8} {compression:5} value={value_size:6}B write: {raw / cpu / 1e6:7.1f} MB/s/cpu "
          f"{raw / wall / 1e6:7.1f} MB/s wall, ratio {info.size / raw:.3f}, "
          f"peak +{write_peak / MiB:.1f} MiB")

    # Read phase: a real segment in the memory store (its bytes count in RSS; subtract).
    store = MemoryObjectStore("bench")
    upload = SegmentUpload(store, fmt, "data/_tmp", options)
    for start in range(0, records, batch_rows):
        n = min(batch_rows, records - start)
        b = renumber(batches[0].slice(0, n), start)
        upload.write_batch(b)
    publish_segment(store, upload.finish(SegmentMetadata.for_key(key, records)).key, key)
    del batches
    _hwm_reset()
    base = proc.memory_info().rss
    cpu0, wall0 = time.process_time(), time.perf_counter()
    rows = 0
    with open_segment(store, key) as reader:
        for batch in reader.iter_batches(10_000):
            rows += batch.num_rows
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert rows == records
    print(f"{'':8} {'':5} {'':13} read:  {raw / cpu / 1e6:7.1f} MB/s/cpu "
          f"{raw / wall / 1e6:7.1f} MB/s wall, peak +{(_hwm() - base) / MiB:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-size", type=int, action="append")
    parser.add_argument("--format", action="append", choices=["parquet", "arrow"])
    parser.add_argument("--compression", action="append")
    args = parser.parse_args()
    for name in args.format or ["parquet", "arrow"]:
        for compression in args.compression or ["zstd"]:
            for size in args.value_size or [100, 1024, 10_240]:
                run(name, args.records, size, compression)


if __name__ == "__main__":
    main()
