"""Plain-Python records and their conversion to and from segment batches.

The egress hot path builds columns directly; these helpers serve tests, tools and the
paths where clarity matters more than speed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from formats.base import SEGMENT_SCHEMA, TIMESTAMP_CREATE_TIME

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Record:
    """One Kafka record as stored in a segment."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = field(default=())
    timestamp_type: int = TIMESTAMP_CREATE_TIME

    @property
    def raw_size(self) -> int:
        """Raw bytes of key, value and headers (what size thresholds count)."""
        n = len(self.key or b"") + len(self.value or b"")
        for hk, hv in self.headers:
            n += len(hk.encode("utf-8")) + len(hv or b"")
        return n


def records_to_batch(records: Sequence[Record]) -> pa.RecordBatch:
    """Build one ``SEGMENT_SCHEMA`` batch from records.

    ``None`` keys and values stay null (distinct from ``b""``); header names are non-null
    strings, header values may be null; a record without headers has an empty list.
    """
    header_keys: list[str] = []
    header_values: list[bytes | None] = []
    list_offsets = [0]
    for r in records:
        for hk, hv in r.headers:
            header_keys.append(hk)
            header_values.append(hv)
        list_offsets.append(len(header_keys))
    header_type = SEGMENT_SCHEMA.field("headers").type
    header_struct = pa.StructArray.from_arrays(
        [pa.array(header_keys, pa.string()), pa.array(header_values, pa.binary())],
        fields=list(header_type.value_type),
    )
    headers = pa.ListArray.from_arrays(pa.array(list_offsets, pa.int32()), header_struct,
                                       type=header_type)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.offset for r in records], pa.int64()),
            pa.array([r.timestamp_ms for r in records], pa.timestamp("ms", tz="UTC")),
            pa.array([r.timestamp_type for r in records], pa.int8()),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            headers,
        ],
        schema=SEGMENT_SCHEMA,
    )


def batch_to_records(batch: pa.RecordBatch | pa.Table) -> Iterator[Record]:
    """Yield the records of a batch."""
    offsets = batch.column("offset").to_pylist()
    ts = batch.column("timestamp").cast(pa.int64()).to_pylist()
    types = batch.column("timestamp_type").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = batch.column("headers").to_pylist()
    for i in range(batch.num_rows):
        yield Record(
            offset=offsets[i],
            timestamp_ms=ts[i],
            key=keys[i],
            value=values[i],
            headers=tuple((h["key"], h["value"]) for h in headers[i]),
            timestamp_type=types[i],
        )


def read_all_records(batches: Iterable[pa.RecordBatch]) -> list[Record]:
    """All records of an iterable of batches (tests and small segments only)."""
    return [r for b in batches for r in batch_to_records(b)]
