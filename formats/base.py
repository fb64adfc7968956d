"""The ``SegmentFormat`` seam (docs/architecture.md, "Segment format"): schema, footer
metadata, writer and reader.

A format writes Arrow record batches of ``SEGMENT_SCHEMA`` onto any binary stream and reads
them back in batches. The footer metadata is written at ``finish`` (its end offset and
count are only known then) and checked against the key a reader was opened by.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import BinaryIO

import pyarrow as pa

from replicator.core.errors import SegmentCorrupt
from replicator.core.keys import SegmentKey, incarnation_label
from replicator.core.settings import FormatSettings
from replicator.core.wire import parse_rfc3339, rfc3339

FORMAT_VERSION = 2
"""The newest footer ``format_version`` readers know: 2 for Parquet segments with
microsecond timestamps and field ids (``formats.parquet.PARQUET_SCHEMA``); what else a
segment holds is the same in 1 and 2."""

HEADER_TYPE = pa.struct([
    pa.field("key", pa.string(), nullable=False),
    pa.field("value", pa.binary(), nullable=True),
])

SEGMENT_SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("timestamp_type", pa.int8(), nullable=False),
    pa.field("key", pa.binary(), nullable=True),
    pa.field("value", pa.binary(), nullable=True),
    pa.field("headers", pa.list_(pa.field("item", HEADER_TYPE, nullable=False)), nullable=False),
])
"""The one explicit Arrow schema of a segment; never inferred per batch."""

BATCH_OVERHEAD = 5 * 1024
"""Memory a held record batch costs beyond its buffers (``RecordBatch.nbytes``): the C++
batch, its arrays and buffer wrappers, and the Python objects whose memory the buffers
are (egress builds batches over Python buffers, ``egress.columns``). Measured with glibc's
``mallinfo2`` and pymalloc's statistics: 4.9 KB per batch of 485 rows, 7.6 KB per batch of
4,000. Nothing for batches of megabytes; with 30-byte records flushed in 32 KB batches, 15 %
of what a segment holds, which the memory budget did not see (bench/RESULTS.md, "Small
records: what the budget does not see")."""

# Kafka timestamp types (as librdkafka reports them).
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

_FOOTER_KEYS = ("region", "topic", "partition", "level", "start_offset", "end_offset",
                "message_count", "created_at", "format_version")


@dataclass(frozen=True)
class SegmentMetadata:
    """The footer of a segment (docs/architecture.md, "Segment format")."""

    region: str
    topic: str
    partition: int
    level: int
    start_offset: int
    end_offset: int
    message_count: int
    created_at: datetime
    format_version: int = 1
    created_by: str = ""
    min_timestamp: int | None = None
    """Smallest record timestamp (ms since the epoch) in the segment; ``None`` in segments
    written before the footer had it (optional key ``min_timestamp``)."""
    max_timestamp: int | None = None
    """Largest record timestamp (ms), like ``min_timestamp``. Record times are not ordered
    by offset, so both bound the segment's records, not its first and last."""
    topic_id: str | None = None
    """The Kafka id of the source topic incarnation the records came from (optional key
    ``topic_id``: absent in segments written before it, or when the broker gives none)."""

    @classmethod
    def for_key(cls, key: SegmentKey, message_count: int, *, created_by: str = "",
                created_at: datetime | None = None, topic_id: str | None = None
                ) -> SegmentMetadata:
        """The footer a segment stored under ``key`` must carry."""
        return cls(key.region, key.topic, key.partition, key.level, key.start, key.end,
                   message_count, created_at or datetime.now(UTC), 1, created_by,
                   topic_id=topic_id)   # the Parquet writer records its own version

    def to_footer(self) -> dict[str, str]:
        """Footer key/value pairs (all strings; the time range only when known)."""
        return {
            "region": self.region,
            "topic": self.topic,
            "partition": str(self.partition),
            "level": str(self.level),
            "start_offset": str(self.start_offset),
            "end_offset": str(self.end_offset),
            "message_count": str(self.message_count),
            "created_at": rfc3339(self.created_at),
            "format_version": str(self.format_version),
            "created_by": self.created_by,
        } | ({} if self.min_timestamp is None or self.max_timestamp is None else {
            "min_timestamp": str(self.min_timestamp),
            "max_timestamp": str(self.max_timestamp),
        }) | ({} if self.topic_id is None else {"topic_id": self.topic_id})

    @classmethod
    def from_footer(cls, footer: Mapping[str, str], *, where: str) -> SegmentMetadata:
        """Parse footer pairs.

        Raises:
            SegmentCorrupt: naming ``where`` and the missing or bad field.
        """
        missing = [k for k in _FOOTER_KEYS if k not in footer]
        if missing:
            raise SegmentCorrupt(f"{where}: footer lacks {', '.join(missing)}")
        try:
            created = parse_rfc3339(footer["created_at"])
            # Optional (segments written before they existed lack them): both or neither.
            lo, hi = footer.get("min_timestamp"), footer.get("max_timestamp")
            times = (None, None) if lo is None or hi is None else (int(lo), int(hi))
            return cls(footer["region"], footer["topic"], int(footer["partition"]),
                       int(footer["level"]), int(footer["start_offset"]),
                       int(footer["end_offset"]), int(footer["message_count"]), created,
                       int(footer["format_version"]), footer.get("created_by", ""), times[0],
                       times[1], footer.get("topic_id") or None)
        except ValueError as e:
            raise SegmentCorrupt(f"{where}: bad footer value: {e}") from e

    def check_key(self, key: SegmentKey) -> None:
        """Refuse a footer that disagrees with the key the segment was opened by.

        Raises:
            SegmentCorrupt: naming the key and each field that differs.
        """
        expected = SegmentMetadata.for_key(key, self.message_count, created_at=self.created_at)
        diffs = [f"{f}={getattr(self, f)!r} (key says {getattr(expected, f)!r})"
                 for f in ("region", "topic", "partition", "level", "start_offset",
                           "end_offset")
                 if getattr(self, f) != getattr(expected, f)]
        if self.topic_id is not None and key.incarnation and \
                incarnation_label(self.topic_id) != key.incarnation:
            diffs.append(f"topic_id={self.topic_id!r} (key's incarnation is "
                         f"{key.incarnation!r})")
        if self.format_version > FORMAT_VERSION:
            diffs.append(f"format_version={self.format_version} (newest known "
                         f"{FORMAT_VERSION})")
        if self.message_count > key.span:
            diffs.append(f"message_count={self.message_count} exceeds the key's range "
                         f"({key.span} positions)")
        if diffs:
            raise SegmentCorrupt(f"{key}: footer disagrees with key: {'; '.join(diffs)}")


@dataclass(frozen=True)
class WriterOptions:
    """How a writer encodes (from ``[format]``)."""

    compression: str = "zstd"
    compression_level: int | None = None
    created_by: str = "kafka-s3-replicator"
    row_group_size: int = 32 * 1024**2
    """Raw bytes buffered before a row group / IPC batch is written to the stream."""

    @classmethod
    def from_settings(cls, f: FormatSettings) -> WriterOptions:
        """The writer options of ``[format]``."""
        return cls(compression=f.compression, compression_level=f.compression_level,
                   created_by=f.created_by, row_group_size=f.row_group_size)


class SegmentWriter(ABC):
    """Writes one segment onto a binary stream."""

    @abstractmethod
    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Append records (schema ``SEGMENT_SCHEMA``, offsets ascending)."""

    @abstractmethod
    def finish(self, metadata: SegmentMetadata) -> None:
        """Flush what is buffered and write the footer. The stream is not closed."""

    @property
    @abstractmethod
    def buffered_bytes(self) -> int:
        """Bytes held by the writer and not yet written to the stream (the group being
        encoded included).
        """

    def encoded_by(self, batch: pa.RecordBatch) -> int:
        """Bytes that ``write_batch(batch)`` would encode now (0: it would only buffer).
        This default says everything held and the batch, which is never less.
        """
        size: int = batch.nbytes
        return self.buffered_bytes + size


class SegmentReader(ABC):
    """Reads one segment from a seekable binary stream, batch by batch."""

    @property
    @abstractmethod
    def metadata(self) -> SegmentMetadata:
        """The footer (already checked against the expected key, if one was given)."""

    @abstractmethod
    def iter_batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        """Record batches of at most ``batch_size`` rows, in offset order.

        Raises:
            SegmentCorrupt: the data cannot be decoded.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (the stream is owned by the caller)."""


class SegmentFormat(ABC):
    """A named segment encoding.

    Segments are self-describing: a reader picks the format from an object's last bytes
    (``formats.registry.detect_format``), never from settings, so every format must end its
    segments with a ``magic`` no other format ends with. ``format.name`` only decides what a
    writer produces.
    """

    name: str
    magic: bytes = b""
    """The bytes every segment of this format ends with (the end of its footer). A format
    without one cannot be recognised, so segments written in it could not be read back."""

    @abstractmethod
    def open_writer(self, stream: BinaryIO, options: WriterOptions) -> SegmentWriter:
        """Start writing a segment onto ``stream``."""

    @abstractmethod
    def open_reader(self, stream: BinaryIO, expected: SegmentKey | None = None,
                    *, where: str = "") -> SegmentReader:
        """Open a segment; check its footer against ``expected`` when given.

        Raises:
            SegmentCorrupt: unreadable bytes, or a footer that disagrees with ``expected``.
        """
