"""The second built-in format: an Arrow IPC stream followed by a small trailer.

Layout::

    <Arrow IPC stream: schema, record batches, end-of-stream marker>
    <footer: UTF-8 JSON object of SegmentMetadata.to_footer()>
    <footer length: 4 bytes, little-endian unsigned>
    <magic: b"KSR1">

The IPC stream format (not the file format) is used because it is written strictly
forwards, so it streams onto a multipart upload. The trailer lets a reader check the footer
against the key before it decodes a single record.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa

from formats._common import (
    NO_COMPRESSION,
    ClampedReader,
    GroupBuffer,
    check_batch_schema,
    check_level,
    check_read_schema,
    corrupt_on_arrow_error,
    describe,
    guarded_iter,
)
from formats.base import (
    BATCH_OVERHEAD,
    SEGMENT_SCHEMA,
    SegmentFormat,
    SegmentMetadata,
    SegmentReader,
    SegmentWriter,
    WriterOptions,
)
from replicator.core.errors import SegmentCorrupt
from replicator.core.keys import SegmentKey

MAGIC = b"KSR1"
_TRAILER = struct.Struct("<I4s")
MAX_FOOTER_BYTES = 1024**2
"""A footer is a few hundred bytes; a larger length field means the object is corrupt."""

IPC_CODECS = frozenset({"zstd", "lz4"})
"""Codecs Arrow IPC supports (``lz4`` is LZ4 frame); any other setting writes uncompressed."""


def ipc_codec(options: WriterOptions) -> str | None:
    """The IPC buffer compression for ``options``: zstd or lz4, else none.

    Arrow IPC compresses buffers with those two codecs only; a segment written with
    ``format.compression = "snappy"`` is therefore uncompressed (and its level ignored).
    """
    name = options.compression.lower()
    if name in NO_COMPRESSION or name not in IPC_CODECS:
        return None
    return name


class ArrowIpcSegmentWriter(SegmentWriter):
    """Writes bounded IPC record batches, then the trailer at ``finish``."""

    def __init__(self, stream: BinaryIO, options: WriterOptions) -> None:
        self._stream = stream
        self._buffer = GroupBuffer(options.row_group_size)
        codec = ipc_codec(options)
        level = check_level(codec, options.compression_level) if codec is not None else None
        compression = pa.Codec(codec, level) if codec is not None and level is not None \
            else codec
        self._writer = pa.ipc.new_stream(
            pa.PythonFile(stream, mode="w"), SEGMENT_SCHEMA,
            options=pa.ipc.IpcWriteOptions(compression=compression),
        )
        self._encoding = 0
        self._finished = False

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if self._finished:
            raise ValueError("segment writer is finished")
        check_batch_schema(batch)
        if batch.num_rows == 0:
            return
        for group in self._buffer.add(batch):
            self._write_group(group)

    def _write_group(self, batches: list[pa.RecordBatch]) -> None:
        if not batches:
            return
        # One IPC batch per group: compression works on whole buffers, so tiny batches
        # compress badly. Concatenating copies the group once (bounded by the group size).
        batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        # Held until written, though GroupBuffer has let go of it (as in the Parquet writer).
        self._encoding = batch.nbytes + BATCH_OVERHEAD * len(batches)
        try:
            self._writer.write_batch(batch)
        finally:
            self._encoding = 0

    def finish(self, metadata: SegmentMetadata) -> None:
        if self._finished:
            return
        self._write_group(self._buffer.take())
        self._writer.close()  # writes the end-of-stream marker; the stream stays open
        footer = json.dumps(metadata.to_footer(), sort_keys=True).encode()
        self._stream.write(footer + _TRAILER.pack(len(footer), MAGIC))
        self._finished = True

    @property
    def buffered_bytes(self) -> int:
        return self._buffer.held_bytes + self._encoding


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = stream.read(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_trailer(stream: BinaryIO, where: str) -> tuple[dict[str, str], int]:
    """The footer pairs from the end of an Arrow segment, and where the IPC stream ends.

    The stream position moves.

    Raises:
        SegmentCorrupt: no trailer, a bad length or unparsable JSON.
    """
    name = describe(where)
    size = stream.seek(0, io.SEEK_END)
    if size < _TRAILER.size:
        raise SegmentCorrupt(f"{name}: {size} bytes is too short for an Arrow segment")
    stream.seek(size - _TRAILER.size)
    length, magic = _TRAILER.unpack(_read_exact(stream, _TRAILER.size))
    if magic != MAGIC:
        raise SegmentCorrupt(f"{name}: no Arrow segment trailer (magic {magic!r})")
    if length > min(MAX_FOOTER_BYTES, size - _TRAILER.size):
        raise SegmentCorrupt(f"{name}: footer length {length} does not fit the object")
    stream.seek(size - _TRAILER.size - length)
    raw = _read_exact(stream, length)
    try:
        pairs = json.loads(raw)
    except ValueError as e:
        raise SegmentCorrupt(f"{name}: footer is not JSON: {e}") from e
    if not isinstance(pairs, dict) or not all(isinstance(v, str) for v in pairs.values()):
        raise SegmentCorrupt(f"{name}: footer is not an object of strings")
    return pairs, size - _TRAILER.size - length


class ArrowIpcSegmentReader(SegmentReader):
    """Checks the trailer first, then streams the IPC batches from the start."""

    def __init__(self, stream: BinaryIO, expected: SegmentKey | None, where: str) -> None:
        self._where = where
        self._stream = stream
        pairs, ipc_end = read_trailer(stream, where)
        self._metadata = SegmentMetadata.from_footer(pairs, where=describe(where))
        if expected is not None:
            self._metadata.check_key(expected)
        # The IPC reader must not read into the trailer, nor trust a corrupt length field.
        with corrupt_on_arrow_error(where, "read the Arrow IPC schema"):
            self._reader = pa.ipc.open_stream(
                pa.PythonFile(ClampedReader(stream, ipc_end), mode="r"))
        check_read_schema(self._reader.schema, where)

    @property
    def metadata(self) -> SegmentMetadata:
        return self._metadata

    def iter_batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        rows = 0
        for batch in guarded_iter(iter(self._reader), self._where, "read Arrow IPC batches"):
            rows += batch.num_rows
            # Zero-copy slices: a stored batch is one group, usually larger than batch_size.
            for start in range(0, batch.num_rows, batch_size):
                yield batch.slice(start, batch_size)
            del batch  # before the next batch is decoded
        if rows != self._metadata.message_count:
            raise SegmentCorrupt(f"{describe(self._where)}: footer says message_count="
                                 f"{self._metadata.message_count}, stream held {rows} rows")


class ArrowIpcFormat(SegmentFormat):
    """``arrow``: an Arrow IPC stream of ``SEGMENT_SCHEMA`` batches plus a JSON trailer."""

    name = "arrow"
    magic = MAGIC

    def open_writer(self, stream: BinaryIO, options: WriterOptions) -> SegmentWriter:
        return ArrowIpcSegmentWriter(stream, options)

    def open_reader(self, stream: BinaryIO, expected: SegmentKey | None = None,
                    *, where: str = "") -> SegmentReader:
        return ArrowIpcSegmentReader(stream, expected, where)
