"""Parquet footers of segments, read from the bucket with two ranged reads."""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.parquet as pq

from formats.parquet import PARQUET_MAGIC
from replicator.core.errors import SegmentCorrupt
from replicator.core.storage import ObjectStore

_TAIL = 8   # footer length (4 bytes, little endian) and the magic


def read_parquet_footer(store: ObjectStore, key: str, size: int) -> pq.FileMetaData | None:
    """The Parquet footer of the object ``key`` of ``size`` bytes; ``None`` if the object
    is not Parquet (a segment of another format).

    Raises:
        SegmentCorrupt: a Parquet tail whose footer cannot be parsed.
        ObjectNotFound: the object is gone.
    """
    if size < 2 * len(PARQUET_MAGIC) + _TAIL - len(PARQUET_MAGIC):
        return None
    tail = store.get_range(key, size - _TAIL, _TAIL)
    if len(tail) != _TAIL or tail[4:] != PARQUET_MAGIC:
        return None
    (length,) = struct.unpack("<I", tail[:4])
    if length + _TAIL > size:
        raise SegmentCorrupt(f"{key}: Parquet footer length {length} exceeds the object "
                             f"({size} bytes)")
    footer = store.get_range(key, size - _TAIL - length, length + _TAIL)
    try:
        return pq.read_metadata(pa.BufferReader(footer))
    except (pa.ArrowException, OSError) as e:
        raise SegmentCorrupt(f"{key}: unreadable Parquet footer: {e}") from e
