"""Pieces both built-in formats share: row-group bounds, schema checks, error translation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pyarrow as pa

from formats.base import SEGMENT_SCHEMA
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

    ``add`` returns the batches to write as one group (possibly none); the caller encodes
    them. Sizes are Arrow buffer bytes (``RecordBatch.nbytes``): what is really held.
    """

    def __init__(self, group_bytes: int) -> None:
        self.group_bytes = max(1, min(group_bytes, MAX_GROUP_BYTES))
        self._batches: list[pa.RecordBatch] = []
        self.nbytes = 0
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> Iterator[list[pa.RecordBatch]]:
        """Buffer ``batch``; yield each group that is ready to be written."""
        size = batch.nbytes
        if self._batches and (self.nbytes + size > MAX_GROUP_BYTES
                              or self.rows + batch.num_rows > MAX_GROUP_ROWS):
            # Adding the batch would break a hard cap: write what is held first.
            yield self.take()
        self._batches.append(batch)
        self.nbytes += size
        self.rows += batch.num_rows
        if self.nbytes >= self.group_bytes or self.rows >= MAX_GROUP_ROWS:
            yield self.take()

    def take(self) -> list[pa.RecordBatch]:
        """Everything buffered (the buffer is emptied)."""
        out, self._batches = self._batches, []
        self.nbytes = 0
        self.rows = 0
        return out


@contextmanager
def corrupt_on_arrow_error(where: str, doing: str) -> Iterator[None]:
    """Translate Arrow decoding errors into ``SegmentCorrupt`` naming ``where``.

    Our own errors (``StorageError`` from the stream, ``SegmentCorrupt``) pass through.
    """
    try:
        yield
    except (pa.ArrowException, OSError, EOFError) as e:
        raise SegmentCorrupt(f"{describe(where)}: cannot {doing}: {e}") from e


def guarded_iter(it: Iterator[T], where: str, doing: str,
                 wrap: Callable[[T], T] | None = None) -> Iterator[T]:
    """Iterate ``it``, translating Arrow errors raised while advancing it."""
    while True:
        with corrupt_on_arrow_error(where, doing):
            try:
                item = next(it)
            except StopIteration:
                return
        yield wrap(item) if wrap is not None else item
