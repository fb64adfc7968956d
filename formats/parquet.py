"""The default segment format: Parquet with ``SEGMENT_SCHEMA`` and footer key/value metadata.

Writing streams row groups onto any binary stream: incoming batches are held until they make
``row_group_size`` bytes, then written as one row group, so memory is bounded by one group.
Reading streams record batches row group by row group.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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

PARQUET_MAGIC = b"PAR1"
"""A Parquet file begins and ends with these bytes (an encrypted footer would end ``PARE``;
segments are never written so)."""

PARQUET_CODECS = frozenset({"snappy", "gzip", "brotli", "lz4", "zstd"})


def _id(f: pa.Field, field_id: int) -> pa.Field:
    return f.with_metadata({b"PARQUET:field_id": str(field_id).encode()})


PARQUET_SCHEMA = pa.schema([
    _id(pa.field("offset", pa.int64(), nullable=False), 2),
    _id(pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False), 3),
    _id(pa.field("timestamp_type", pa.int8(), nullable=False), 4),
    _id(pa.field("key", pa.binary(), nullable=True), 5),
    _id(pa.field("value", pa.binary(), nullable=True), 6),
    _id(pa.field("headers", pa.list_(_id(pa.field("item", pa.struct([
        _id(pa.field("key", pa.string(), nullable=False), 9),
        _id(pa.field("value", pa.binary(), nullable=True), 10),
    ]), nullable=False), 8)), nullable=False), 7),
])
"""``SEGMENT_SCHEMA`` as Parquet segments store it since footer ``format_version`` 2:
timestamps in microseconds (``TIMESTAMP(MICROS, UTC)``, what the Iceberg spec wants for
``timestamptz``) and Parquet field ids equal to the archive table's
(``replicator/archive/iceberg.py``, ``SEGMENT_TABLE_SCHEMA``), so engines without name
mapping read them. Readers get ``SEGMENT_SCHEMA`` (milliseconds) from either layout."""

PARQUET_FIELD_IDS_VERSION = 2
"""The footer ``format_version`` of Parquet segments written with ``PARQUET_SCHEMA``
(earlier ones: milliseconds, no field ids; both are read)."""

# Min/max statistics only where they help a reader skip data (offset and time ranges);
# statistics of binary keys/values would copy up to 5 MiB values into the footer.
_STATISTICS_COLUMNS = ["offset", "timestamp", "timestamp_type"]

# Dictionary encoding pays off for keys and header names (few distinct values); values are
# mostly distinct, and trying a dictionary first costs hashing every value.
_DICTIONARY_COLUMNS = ["timestamp_type", "key", "headers.list.element.key"]

ENCODE_UNIT = 4 * 1024**2
"""Row groups of rows too large for Arrow's page bound are cut at this many bytes (one row
alone when it is larger). Arrow cuts a data page only every 1,024 rows (its
``write_batch_size``), so a group of two 8 MiB records was one 16 MiB page, and encoding
it held three copies of it (48 MiB of Arrow's memory for 16 MiB of records). Cut, the
encoder's working memory follows the largest record, not the group
(``egress.flow.encode_reservation``)."""
_PAGE_ROWS = 1024


def row_group_slices(row_bytes: list[int], unit: int = ENCODE_UNIT) -> list[tuple[int, int]]:
    """``(start, length)`` of the row groups of rows of ``row_bytes``: consecutive rows up to
    ``unit`` bytes, a larger row alone.
    """
    slices: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, n in enumerate(row_bytes):
        if i > start and size + n > unit:
            slices.append((start, i - start))
            start, size = i, 0
        size += n
    if start < len(row_bytes):
        slices.append((start, len(row_bytes) - start))
    return slices


def _row_bytes(table: pa.Table) -> list[int]:
    # Keys and values are nearly all of a large row's bytes.
    lengths = [pc.fill_null(pc.binary_length(table.column(c)), 0) for c in ("key", "value")]
    return [k + v for k, v in zip(lengths[0].to_pylist(), lengths[1].to_pylist(),
                                  strict=True)]


def parquet_codec(options: WriterOptions) -> tuple[str, int | None]:
    """The Parquet codec and level for ``options`` (``none``/``uncompressed`` → none).

    Raises:
        ValueError: an unknown codec name, or a level the codec does not take.
    """
    name = options.compression.lower()
    if name in NO_COMPRESSION:
        return "none", None
    if name not in PARQUET_CODECS:
        raise ValueError(f"unknown Parquet compression {options.compression!r} (known: none, "
                         f"{', '.join(sorted(PARQUET_CODECS))})")
    return name, check_level(name, options.compression_level)


class ParquetSegmentWriter(SegmentWriter):
    """Writes bounded row groups onto a binary stream; the footer at ``finish``."""

    def __init__(self, stream: BinaryIO, options: WriterOptions) -> None:
        codec, level = parquet_codec(options)
        self._buffer = GroupBuffer(options.row_group_size)
        # The stream is wrapped, not owned: closing the Parquet writer leaves it open.
        self._writer = pq.ParquetWriter(
            pa.PythonFile(stream, mode="w"), PARQUET_SCHEMA,
            compression=codec, compression_level=level,
            use_dictionary=_DICTIONARY_COLUMNS,
            write_statistics=_STATISTICS_COLUMNS,
            # CRC32 per page: damaged bytes are refused as SegmentCorrupt instead of being
            # replicated as data. Costs well under 1 % of the write time.
            write_page_checksum=True,
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
        # Milliseconds to microseconds is exact; the field ids come with the schema.
        table = pa.Table.from_batches(batches, schema=SEGMENT_SCHEMA).cast(PARQUET_SCHEMA)
        # While the group is encoded it is still held (GroupBuffer has let go of it): an
        # uncounted 32 MiB group per encoding thread was much of egress's RSS beyond its
        # budget (bench/RESULTS.md, "Memory").
        self._encoding = table.nbytes + BATCH_OVERHEAD * len(batches)
        try:
            if table.nbytes * _PAGE_ROWS <= ENCODE_UNIT * table.num_rows:
                # One row group for the whole table: the group bound was decided by
                # GroupBuffer, and Arrow's pages stay small.
                self._writer.write_table(table, row_group_size=table.num_rows)
            else:
                for start, length in row_group_slices(_row_bytes(table)):
                    self._writer.write_table(table.slice(start, length),
                                             row_group_size=length)
        finally:
            self._encoding = 0

    def finish(self, metadata: SegmentMetadata) -> None:
        if self._finished:
            return
        self._write_group(self._buffer.take())
        metadata = replace(metadata, format_version=max(metadata.format_version,
                                                        PARQUET_FIELD_IDS_VERSION))
        self._writer.add_key_value_metadata(metadata.to_footer())
        self._writer.close()
        self._finished = True

    @property
    def buffered_bytes(self) -> int:
        return self._buffer.held_bytes + self._encoding

    def encoded_by(self, batch: pa.RecordBatch) -> int:
        if not self._buffer.would_emit(batch):
            return 0
        size: int = batch.nbytes
        return self._buffer.held_bytes + size


class ParquetSegmentReader(SegmentReader):
    """Reads a Parquet segment row group by row group."""

    def __init__(self, stream: BinaryIO, expected: SegmentKey | None, where: str) -> None:
        self._where = where
        with corrupt_on_arrow_error(where, "read the Parquet footer"):
            self._file = pq.ParquetFile(pa.PythonFile(ClampedReader(stream), mode="r"),
                                        page_checksum_verification=True)
            footer = self._file.metadata.metadata or {}
            schema = self._file.schema_arrow
        if not schema.equals(PARQUET_SCHEMA, check_metadata=False):
            check_read_schema(schema, where)   # else: milliseconds, no field ids
        pairs = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                 for k, v in footer.items() if k != b"ARROW:schema"}
        self._metadata = SegmentMetadata.from_footer(pairs, where=describe(where))
        if expected is not None:
            self._metadata.check_key(expected)
        rows = self._file.metadata.num_rows
        if rows != self._metadata.message_count:
            raise SegmentCorrupt(f"{describe(where)}: footer says message_count="
                                 f"{self._metadata.message_count}, file holds {rows} rows")

    @property
    def metadata(self) -> SegmentMetadata:
        return self._metadata

    def iter_batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        # One row group at a time: asked for all groups at once, Arrow pre-buffers every
        # column chunk of the file up front, and memory grows with the segment.
        for group in range(self._file.metadata.num_row_groups):
            with corrupt_on_arrow_error(self._where, "read Parquet row groups"):
                it = self._file.iter_batches(batch_size=batch_size, row_groups=[group])
            for batch in guarded_iter(it, self._where, f"read Parquet row group {group}"):
                # Exactly SEGMENT_SCHEMA: without the file's footer pairs in the schema
                # metadata and with the list item named as ours ("element" in Parquet), so
                # batches of different segments and formats mix freely. Buffers are shared.
                yield batch.cast(SEGMENT_SCHEMA)
                del batch

    def close(self) -> None:
        self._file.close()


class ParquetFormat(SegmentFormat):
    """``parquet``: ``SEGMENT_SCHEMA``'s columns, zstd by default, footer key/value metadata."""

    name = "parquet"
    magic = PARQUET_MAGIC

    def open_writer(self, stream: BinaryIO, options: WriterOptions) -> SegmentWriter:
        return ParquetSegmentWriter(stream, options)

    def open_reader(self, stream: BinaryIO, expected: SegmentKey | None = None,
                    *, where: str = "") -> SegmentReader:
        return ParquetSegmentReader(stream, expected, where)
