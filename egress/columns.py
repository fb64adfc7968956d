"""The egress hot path: consumed messages into ``SEGMENT_SCHEMA`` record batches.

Per message only the unavoidable accessors run (one comprehension pass); everything else is
column-wise: lists are transposed with ``zip``, sizes summed with ``map(len, ...)`` and
arrays built once per batch of thousands of messages. Headers, usually absent, cost nothing
unless present.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import chain
from typing import cast

import numpy as np
import pyarrow as pa

from formats.base import HEADER_TYPE, SEGMENT_SCHEMA
from replicator.core.kafka import Headers, Message

_TIMESTAMP = SEGMENT_SCHEMA.field("timestamp").type
_HEADERS = SEGMENT_SCHEMA.field("headers").type
_EMPTY_HEADER_ITEMS = pa.array([], HEADER_TYPE)

ROW_OVERHEAD = 232
"""Bytes a buffered row holds beyond its key, value and header bytes: five list slots, an
offset int, a timestamp tuple and its ints, and the two bytes objects' headers (measured
with tracemalloc: about 200 B with shared offset ints, 232 B with the fresh ones a
consumer returns). With 30-byte records this is most of the memory, so the budget
(``egress.max_buffered_bytes``) counts it (``held_bytes``)."""


def header_bytes(headers: Sequence[Headers | None]) -> int:
    """Raw bytes of all header names and values (names counted in characters)."""
    n = 0
    for h in headers:
        if h:
            for k, v in h:
                n += len(k) + (len(v) if v is not None else 0)
    return n


class ColumnBuffer:
    """Accessor results of messages not yet turned into a record batch.

    ``add`` is called with runs of one partition's messages in offset order; ``take``
    builds one batch and empties the buffer.
    """

    __slots__ = ("has_headers", "headers", "keys", "offsets", "raw_bytes", "timestamps",
                 "values")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[tuple[int, int]] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[Headers | None] = []
        self.has_headers = False
        self.raw_bytes = 0

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def held_bytes(self) -> int:
        """Memory the buffered rows hold: their raw bytes plus ``ROW_OVERHEAD`` each."""
        return self.raw_bytes + len(self.offsets) * ROW_OVERHEAD

    def add(self, msgs: Sequence[Message], byte_budget: int | None = None) -> tuple[int, int]:
        """Append messages in order; stop after the one that reaches ``byte_budget``.

        Returns:
            (messages taken, their raw bytes: key + value + headers). Messages after the
            one that reaches the budget are not taken (they start the next segment).
        """
        # One pass per accessor: no per-message tuple (each would be one more GC-tracked
        # allocation), and each pass is a tight comprehension.
        # A consumed record always has an offset (only error events lack one).
        offs = cast("list[int]", [m.offset() for m in msgs])
        stamps = [m.timestamp() for m in msgs]
        keys = [m.key() for m in msgs]
        vals = [m.value() for m in msgs]
        hdrs = [m.headers() for m in msgs]
        raw = sum(map(len, filter(None, keys))) + sum(map(len, filter(None, vals)))
        with_headers = any(hdrs)
        if with_headers:
            raw += header_bytes(hdrs)
        if byte_budget is not None and raw >= byte_budget and len(offs) > 1:
            # The size limit falls inside this run: find the message that reaches it
            # (per-message work, but once per segment).
            total, cut = 0, len(offs)
            for i, (k, v, h) in enumerate(zip(keys, vals, hdrs, strict=True)):
                total += len(k or b"") + len(v or b"") + (header_bytes((h,)) if h else 0)
                if total >= byte_budget:
                    cut = i + 1
                    break
            if cut < len(offs):
                return self.add(msgs[:cut])
        self.has_headers = self.has_headers or with_headers
        self.offsets += offs
        self.timestamps += stamps
        self.keys += keys
        self.values += vals
        self.headers += hdrs
        self.raw_bytes += raw
        return len(offs), raw

    def take(self) -> pa.RecordBatch:
        """Build one ``SEGMENT_SCHEMA`` batch of everything held, and empty the buffer."""
        n = len(self.offsets)
        # (type, time) pairs read straight into one int64 array: no tuple per column.
        pairs = np.fromiter(chain.from_iterable(self.timestamps), np.int64,
                            2 * n).reshape(n, 2)
        batch = pa.RecordBatch.from_arrays(
            [
                _fixed(pa.int64(), array("q", self.offsets)),
                _fixed(_TIMESTAMP, pairs[:, 1].copy()),
                _fixed(pa.int8(), _types(pairs[:, 0])),
                _binary(self.keys),
                _binary(self.values),
                _headers_array(self.headers, n) if self.has_headers else _no_headers(n),
            ],
            schema=SEGMENT_SCHEMA,
        )
        self.__init__()  # type: ignore[misc]
        return batch


def _fixed(type_: pa.DataType, values: array[int] | bytes | np.ndarray) -> pa.Array:
    # ``array`` converts Python ints in one C loop, and Arrow wraps its buffer as it is
    # (``pa.array`` over a list checks each item's type first).
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def _types(types: np.ndarray) -> bytes | np.ndarray:
    """The ``timestamp_type`` column's int8 buffer. A topic's records almost always share
    one type: then that buffer is one byte repeated.
    """
    if len(types) and 0 <= types[0] < 128 and bool((types == types[0]).all()):
        return bytes((int(types[0]),)) * len(types)
    return types.astype(np.int8)


def _binary(items: list[bytes | None]) -> pa.Array:
    """A binary array of ``items`` built from one joined buffer and its offsets.

    ``pa.array`` appends item by item into a buffer that it grows by reallocation: with
    1 KiB values that reallocation (a fresh allocation, a copy, page faults) was the
    largest cost of the poll thread. Here the lengths go straight into a NumPy array and
    are summed there (no Python int per running total: a third of the time of
    ``accumulate`` into an ``array``), the bytes are joined into one exactly-sized buffer,
    and Arrow wraps both without a copy. ``None`` (a null key, a tombstone) makes ``len``
    fail: such lists go through ``pa.array``, as do those whose 32-bit offsets would
    overflow.
    """
    n = len(items)
    ends = np.zeros(n + 1, np.int64)
    try:
        np.cumsum(np.fromiter(map(len, items), np.int64, n),  # type: ignore[arg-type]
                  out=ends[1:])
    except TypeError:
        return pa.array(items, pa.binary())
    if ends[n] > _MAX_INT32:
        return pa.array(items, pa.binary())
    data = b"".join(items)  # type: ignore[arg-type]
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends.astype(np.int32)),
                                                  pa.py_buffer(data)])


_MAX_INT32 = 2**31 - 1


def _no_headers(n: int) -> pa.Array:
    # n + 1 zero offsets straight from a zeroed buffer: no per-row work at all.
    offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))])
    return pa.ListArray.from_arrays(offsets, _EMPTY_HEADER_ITEMS, type=_HEADERS)


def _headers_array(headers: Sequence[Headers | None], n: int) -> pa.Array:
    offsets = array("i", bytes(4 * (n + 1)))
    names: list[str] = []
    values: list[bytes | None] = []
    for i, h in enumerate(headers):
        if h:
            for k, v in h:
                names.append(k)
                values.append(v)
        offsets[i + 1] = len(names)
    items = pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(values, pa.binary())],
        fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items, type=_HEADERS)
