"""Record batches of a replay: segment batches into columns ready to produce (``Rows``).

No per-record objects on the hot path: a decoded Arrow batch becomes a handful of Python
lists, column by column, and the producer walks them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.base import TIMESTAMP_NOT_AVAILABLE
from replicator.core.batch_limits import HEADER_OVERHEAD, RECORD_OVERHEAD

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Rows:
    """Records to produce, column by column (no per-record objects on the hot path).

    ``timestamps`` are milliseconds (``0`` lets the producer stamp the current time, for
    sources without timestamps); ``headers`` entries are ``None`` for records without.
    """

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[Header] | None]
    start: int | None = None
    """The source position the batch's replay begins at (the previous checkpoint + 1, or
    the partition's origin for its first batch), for the offset map; ``None``: unknown."""

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def last_offset(self) -> int:
        """Source offset of the last record."""
        return self.offsets[-1]

    def records(self) -> list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]]:
        """``(offset, timestamp, key, value, headers)`` tuples (tests, fakes)."""
        return list(zip(self.offsets, self.timestamps, self.keys, self.values, self.headers,
                        strict=True))


def record_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Bytes of each record of ``batch``: key + value + header keys and values."""
    n = batch.num_rows
    sizes = np.zeros(n, dtype=np.int64)
    for name in ("key", "value"):
        sizes += pc.fill_null(pc.binary_length(batch.column(name)), 0) \
            .to_numpy(zero_copy_only=False).astype(np.int64)
    hcol = batch.column("headers")
    flat = hcol.flatten()
    if len(flat):
        per = np.zeros(len(flat), dtype=np.int64)
        for name in ("key", "value"):
            per += pc.fill_null(pc.binary_length(flat.field(name)), 0) \
                .to_numpy(zero_copy_only=False).astype(np.int64)
        parents = pc.list_parent_indices(hcol).to_numpy(zero_copy_only=False)
        sizes += np.bincount(parents, weights=per, minlength=n).astype(np.int64)
    return sizes


def wire_sizes(batch: pa.RecordBatch, origin: Header | None = None) -> np.ndarray:
    """Each record of ``batch`` as a produce request counts it (``record_size``, an upper
    bound): key, value, headers with their overheads, and the origin marker if one is
    appended (``batch_rows``).
    """
    sizes = record_bytes(batch) + RECORD_OVERHEAD
    sizes += HEADER_OVERHEAD * pc.list_value_length(batch.column("headers")) \
        .fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if origin is not None:
        sizes += HEADER_OVERHEAD + len(origin[0].encode()) + len(origin[1] or b"")
    return sizes


def split_by_bytes(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """Zero-copy slices of ``batch`` of at most ``max_bytes`` record bytes each (a record
    larger than that alone), so a produced batch and its transaction stay bounded by bytes
    as well as by records.
    """
    n = batch.num_rows
    if n == 0:
        return
    cum = np.cumsum(record_bytes(batch))
    if cum[-1] <= max_bytes:
        yield batch
        return
    start = 0
    while start < n:
        base = int(cum[start - 1]) if start else 0
        end = max(int(np.searchsorted(cum, base + max_bytes, side="right")), start + 1)
        yield batch.slice(start, end - start)
        start = end


def batch_rows(batch: pa.RecordBatch, after: int | None,
               origin: Header | None = None) -> Rows | None:
    """The records of ``batch`` with offsets above ``after``, column by column.

    ``origin``: the origin marker (``[ingress] mark_origin``), appended to every record's
    headers after its own (docs/architecture.md, "Origin marker"); ``None`` leaves the
    headers exactly as they were, at no cost.
    """
    n = batch.num_rows
    if n == 0:
        return None
    offsets = batch.column("offset")
    if after is not None:
        if offsets[n - 1].as_py() <= after:
            return None
        if offsets[0].as_py() <= after:
            batch = batch.filter(pc.greater(offsets, pa.scalar(after, pa.int64())))
            offsets = batch.column("offset")
    ts = batch.column("timestamp").cast(pa.int64()).to_pylist()
    types = batch.column("timestamp_type")
    if pc.any(pc.equal(types, TIMESTAMP_NOT_AVAILABLE)).as_py():
        ts = [0 if t == TIMESTAMP_NOT_AVAILABLE else x
              for x, t in zip(ts, types.to_pylist(), strict=True)]
    hcol = batch.column("headers")
    flat = hcol.flatten()  # respects slicing, unlike .values
    headers: list[list[Header] | None]
    if len(flat) == 0:
        # One shared list for every record: the producer only reads it.
        headers = [None] * batch.num_rows if origin is None else [[origin]] * batch.num_rows
    else:
        # Column-wise: no dict per header (to_pylist of a list<struct> builds one).
        hkeys = flat.field("key").to_pylist()
        hvals = flat.field("value").to_pylist()
        headers = []
        i = 0
        for n in pc.list_value_length(hcol).to_pylist():
            if n:
                headers.append(list(zip(hkeys[i:i + n], hvals[i:i + n], strict=True)))
                i += n
            else:
                headers.append(None)
        if origin is not None:
            marker = [origin]
            headers = [marker if h is None else [*h, origin] for h in headers]
    return Rows(offsets.to_pylist(), ts, batch.column("key").to_pylist(),
                batch.column("value").to_pylist(), headers)
