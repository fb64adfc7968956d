"""Pieces both built-in formats share: row-group bounds, schema checks, error translation."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO, TypeVar

import pyarrow as pa

from formats.base import BATCH_OVERHEAD, SEGMENT_SCHEMA
from replicator.core.errors import SegmentCorrupt

T = TypeVar("T")

MAX_GROUP_BYTES = 1024**3
"""Hard cap on the Arrow bytes of one row group / IPC batch, whatever ``row_group_size`` says.

Arrow's ``binary`` arrays have 32-bit offsets: a single column chunk read or concatenated
back into one array must stay well below 2 GiB, so a group is cut at 1 GiB.
"""

MAX_GROUP_ROWS = 1024 * 1024
"""Row cap per group (Parquet's own default), so tiny records do not make giant groups."""

NO_COMPRESSION = frozenset({"none", "uncompressed", ""})


def check_level(codec: str, level: int | None) -> int | None:
    """``level`` if ``codec`` accepts it (``None`` means the codec's default).

    Checked when a writer opens: Arrow would otherwise fail only when the first group is
    encoded, or at ``finish``, long after the setting was read.

    Raises:
        ValueError: the codec has no levels, or the level is out of its range.
    """
    if level is None:
        return None
    if not pa.Codec.supports_compression_level(codec):
        raise ValueError(f"compression {codec!r} does not take a compression_level")
    low = pa.Codec.minimum_compression_level(codec)
    high = pa.Codec.maximum_compression_level(codec)
    if not low <= level <= high:
        raise ValueError(f"compression_level {level} is outside {low}..{high} for {codec!r}")
    return level


def describe(where: str) -> str:
    """The name to put in an error message."""
    return where or "segment"


def check_batch_schema(batch: pa.RecordBatch) -> None:
    """Refuse a batch whose schema is not ``SEGMENT_SCHEMA`` (a caller bug, not data).

    Raises:
        ValueError: naming both schemas.
    """
    if not batch.schema.equals(SEGMENT_SCHEMA, check_metadata=False):
        raise ValueError(f"batch schema differs from SEGMENT_SCHEMA:\n{batch.schema}\n"
                         f"expected:\n{SEGMENT_SCHEMA}")


def check_read_schema(schema: pa.Schema, where: str) -> None:
    """Refuse a stored schema that is not ``SEGMENT_SCHEMA``.

    Raises:
        SegmentCorrupt: naming ``where``.
    """
    if not schema.equals(SEGMENT_SCHEMA, check_metadata=False):
        raise SegmentCorrupt(f"{describe(where)}: schema differs from the segment schema: "
                             f"{schema}")


class GroupBuffer:
    """Holds incoming batches until they make one bounded group.

    ``add`` yields the batches to write as one group (possibly none); the caller encodes
    them. Group bounds are Arrow buffer bytes (``RecordBatch.nbytes``, slice-aware);
    ``held_bytes`` adds each held batch's own cost (``BATCH_OVERHEAD``). A batch larger
    than a group is cut into zero-copy slices of about a group each, so groups stay bounded
    whatever batch sizes the caller uses.
    """

    def __init__(self, group_bytes: int) -> None:
        self.group_bytes = max(1, min(group_bytes, MAX_GROUP_BYTES))
        self._batches: list[pa.RecordBatch] = []
        self.nbytes = 0
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> Iterator[list[pa.RecordBatch]]:
        """Buffer ``batch``; yield each group that is ready to be written."""
        for piece in self._pieces(batch):
            yield from self._add_piece(piece)

    def _pieces(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        size, rows = batch.nbytes, batch.num_rows
        if size <= self.group_bytes and rows <= MAX_GROUP_ROWS:
            yield batch
            return
        # Rows per slice from the average row size: vectorised, no per-row sizes. A slice
        # of uneven rows may exceed a group somewhat.
        step = max(1, min(MAX_GROUP_ROWS, rows * self.group_bytes // max(1, size)))
        for start in range(0, rows, step):
            yield batch.slice(start, step)

    def _add_piece(self, batch: pa.RecordBatch) -> Iterator[list[pa.RecordBatch]]:
        size = batch.nbytes
        if self._batches and (self.nbytes + size > self.group_bytes
                              or self.rows + batch.num_rows > MAX_GROUP_ROWS):
            # The batch would push the group past its bound: write what is held first, so
            # no group (and nothing held) exceeds the bound unless one batch alone does.
            yield self.take()
        self._batches.append(batch)
        self.nbytes += size
        self.rows += batch.num_rows
        if self.nbytes >= self.group_bytes or self.rows >= MAX_GROUP_ROWS:
            yield self.take()

    def would_emit(self, batch: pa.RecordBatch) -> bool:
        """Whether ``add(batch)`` would yield a group."""
        size: int = batch.nbytes
        rows: int = batch.num_rows
        return self.nbytes + size >= self.group_bytes or self.rows + rows >= MAX_GROUP_ROWS

    @property
    def held_bytes(self) -> int:
        """Memory the buffered batches hold: their buffers plus ``BATCH_OVERHEAD`` each."""
        return self.nbytes + BATCH_OVERHEAD * len(self._batches)

    def take(self) -> list[pa.RecordBatch]:
        """Everything buffered (the buffer is emptied)."""
        out, self._batches = self._batches, []
        self.nbytes = 0
        self.rows = 0
        return out


class ClampedReader(io.RawIOBase):
    """A seekable reader that never reads past ``end`` of the stream it wraps.

    Arrow asks for as many bytes as a (possibly corrupt) length field says. A buffered
    reader allocates the whole request up front, so a garbage length of 2**40 would be a
    ``MemoryError``; clamped, it is a short read that Arrow reports as invalid data.
    """

    def __init__(self, stream: BinaryIO, end: int | None = None) -> None:
        super().__init__()
        self._stream = stream
        self._end = stream.seek(0, io.SEEK_END) if end is None else end
        stream.seek(0)

    @property
    def end(self) -> int:
        """The position reads stop at."""
        return self._end

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            return self._stream.seek(self._end + offset)
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._end - self._stream.tell())
        n = left if size is None or size < 0 else min(size, left)
        return self._stream.read(n) if n else b""

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        # The wrapped stream belongs to the caller; only this view closes.
        super().close()


@contextmanager
def corrupt_on_arrow_error(where: str, doing: str) -> Iterator[None]:
    """Translate Arrow decoding errors into ``SegmentCorrupt`` naming ``where``.

    Our own errors (``StorageError`` from the stream, ``SegmentCorrupt``) pass through.
    """
    try:
        yield
    except (pa.ArrowException, OSError, EOFError, UnicodeDecodeError) as e:
        # UnicodeDecodeError: pyarrow decodes column names from a damaged footer.
        raise SegmentCorrupt(f"{describe(where)}: cannot {doing}: {e}") from e


def guarded_iter(it: Iterator[T], where: str, doing: str) -> Iterator[T]:
    """Iterate ``it``, translating Arrow errors raised while advancing it."""
    while True:
        with corrupt_on_arrow_error(where, doing):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item
        # Drop our reference before decoding the next item, so two never live at once.
        del item
