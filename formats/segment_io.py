"""Segments on an ``ObjectStore``: write one to a temp key, publish it, open it for reading.

These are the building blocks of the durability methods (egress rotation, compaction), which
call them as separate numbered steps::

    upload = SegmentUpload(store, fmt, temp_prefix, options)   # streams to a temp key
    upload.write_batch(batch) ...
    temp = upload.finish(metadata)                             # temp object complete
    publish_segment(store, temp.key, key, storage_class)       # copy to final key, drop temp
    with open_segment(store, key) as reader: ...               # any format, from its bytes

Egress and compaction both publish through ``publish_segment``.

A temp object is invisible to readers (nothing lists the temp prefix for segments); only a
published key is a segment.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.base import SegmentFormat, SegmentMetadata, SegmentReader, WriterOptions
from formats.registry import sniff_format
from replicator.core.errors import (
    ObjectNotFound,
    ReplicatorError,
    SegmentCorrupt,
    SegmentNotFound,
)
from replicator.core.keys import SegmentKey, new_temp_key
from replicator.core.storage import ObjectInfo, ObjectStore, Upload, UploadStream

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_READ_BUFFER = 8 * 1024**2
"""Bytes per ranged GET when reading a segment: few requests, bounded memory. A segment no
larger than this is read whole with one GET (``ObjectStore.open_read``): one HEAD and one
GET per segment instead of one GET per seek (footer, tail, row groups)."""


_INT32_OFFSETS = (pa.binary(), pa.string())


def _offsets(arr: pa.Array) -> np.ndarray | None:
    """The ``len(arr) + 1`` offsets of a non-empty binary, string or list array without
    nulls (slice-aware, no copy); ``None`` when a null slot might hold bytes of its own.
    """
    if arr.null_count:
        return None
    ends = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + len(arr) + 1)
    return ends[arr.offset:]


def _span(arr: pa.Array) -> int | None:
    """``offsets[end] - offsets[start]`` of a binary, string or list array without nulls
    (its data bytes, or its list items), read from the offsets buffer; ``None`` when a null
    slot might hold bytes of its own.

    Two integers read instead of two compute kernels over every value: with the small
    batches of many partitions the kernels cost more per batch than the rows did.
    """
    if not len(arr):
        return 0
    ends = _offsets(arr)
    return None if ends is None else int(ends[-1] - ends[0])


def _longest(arr: pa.Array) -> int:
    """Bytes of the longest value of a binary array (0 when empty or all null)."""
    if not len(arr):
        return 0
    ends = _offsets(arr) if arr.type in _INT32_OFFSETS else None
    if ends is not None:
        return int((ends[1:] - ends[:-1]).max())
    return int(pc.max(pc.binary_length(arr)).as_py() or 0)


def largest_row_bytes(batch: pa.RecordBatch) -> int:
    """Bytes of the largest key plus those of the largest value of a ``SEGMENT_SCHEMA``
    batch (what sizes an encode's working memory), read from the offsets buffers when the
    columns have no nulls.
    """
    return _longest(batch.column("key")) + _longest(batch.column("value"))


def _binary_bytes(arr: pa.Array) -> int:
    span = _span(arr) if arr.type in _INT32_OFFSETS else None
    if span is not None:
        return span
    # binary_length is null for null slots; min_count=0 makes an all-null sum 0, not null.
    return int(pc.sum(pc.binary_length(arr), min_count=0).as_py())


def raw_size_of_batch(batch: pa.RecordBatch) -> int:
    """Raw bytes of a ``SEGMENT_SCHEMA`` batch: key + value + header names and values.

    The same measure as ``Record.raw_size``, computed column-wise (no per-record Python).
    """
    raw = _binary_bytes(batch.column("key")) + _binary_bytes(batch.column("value"))
    column = batch.column("headers")
    if _span(column) == 0:
        return raw  # no header at all (the usual case): nothing to flatten
    headers = column.flatten()  # respects slicing of the list array
    return raw + _binary_bytes(headers.field("key")) + _binary_bytes(headers.field("value"))


def timestamp_range(batch: pa.RecordBatch) -> tuple[int, int]:
    """The smallest and largest ``timestamp`` (ms) of a non-empty ``SEGMENT_SCHEMA`` batch."""
    return _min_max(batch.column("timestamp"))


def _min_max(stamps: pa.Array | pa.ChunkedArray) -> tuple[int, int]:
    mm = pc.min_max(stamps.cast(pa.int64()))
    return int(mm["min"].as_py()), int(mm["max"].as_py())


TIMESTAMP_RANGE_ROWS = 65536
"""``SegmentUpload`` keeps the timestamp columns of the batches written (8 bytes a row) and
takes their range in one call per this many rows, not one per batch."""


class _DiscardableStream(io.RawIOBase):
    """Forwards writes to an ``UploadStream`` until ``discard()``, then drops them.

    A format writer left unfinished may still flush when it is garbage-collected (Parquet's
    writer closes itself in ``__del__``); after an abort those bytes must go nowhere.
    """

    def __init__(self, inner: UploadStream) -> None:
        super().__init__()
        self._inner = inner
        self._discarding = False

    def discard(self) -> None:
        self._discarding = True

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        if self._discarding:
            return len(b)
        return self._inner.write(b)

    def tell(self) -> int:
        return self._inner.tell()


class SegmentUpload:
    """One segment being streamed to a fresh temp key.

    Memory held is the format writer's group buffer plus one upload part
    (``buffered_bytes``). Nothing is visible until ``finish``; ``abort`` discards it all.
    """

    def __init__(self, store: ObjectStore, fmt: SegmentFormat, temp_prefix: str,
                 options: WriterOptions) -> None:
        self.store = store
        self.format = fmt
        self._upload: Upload = store.open_upload(new_temp_key(temp_prefix))
        self._stream = _DiscardableStream(UploadStream(self._upload))
        try:
            self._writer = fmt.open_writer(self._stream, options)  # type: ignore[arg-type]
        except BaseException:
            self._upload.abort()
            raise
        self._count = 0
        self._raw = 0
        self._first: int | None = None
        self._last: int | None = None
        self._min_ts: int | None = None
        self._max_ts: int | None = None
        self._stamps: list[pa.Array] = []
        """Timestamp columns whose range is not taken yet (``TIMESTAMP_RANGE_ROWS``)."""
        self._stamp_rows = 0
        self._state = "open"  # open → finished (writer done) → complete | aborted

    @property
    def temp_key(self) -> str:
        """The temp object's key."""
        return self._upload.key

    @property
    def message_count(self) -> int:
        """Records written so far."""
        return self._count

    @property
    def raw_bytes(self) -> int:
        """Raw bytes (key + value + headers) written so far; what size limits count."""
        return self._raw

    @property
    def buffered_bytes(self) -> int:
        """Bytes held in memory: the writer's group buffer plus the upload's part buffer."""
        return self._writer.buffered_bytes + self._upload.buffered_bytes

    def encoded_by(self, batch: pa.RecordBatch) -> int:
        """Bytes that ``write_batch(batch)`` would encode and send now (0: it would only
        buffer the batch).
        """
        return self._writer.encoded_by(batch)

    @property
    def encoding_bytes(self) -> int:
        """Bytes ``finish`` encodes: what the writer holds."""
        return self._writer.buffered_bytes

    @property
    def bytes_uploaded(self) -> int:
        """Encoded bytes handed to the upload so far."""
        return self._upload.bytes_written

    @property
    def first_offset(self) -> int | None:
        """Offset of the first record, or None before any."""
        return self._first

    @property
    def last_offset(self) -> int | None:
        """Offset of the last record, or None before any."""
        return self._last

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Append a ``SEGMENT_SCHEMA`` batch (offsets ascending, after the last one).

        Raises:
            ValueError: the upload is not open, or offsets go backwards.
            StorageError: a part could not be sent (call ``abort``).
        """
        if self._state != "open":
            raise ValueError(f"segment upload {self.temp_key} is {self._state}")
        n = batch.num_rows
        if n == 0:
            return
        offsets = batch.column("offset")
        first = offsets[0].as_py()
        if self._last is not None and first <= self._last:
            raise ValueError(f"segment upload {self.temp_key}: offset {first} after "
                             f"{self._last}")
        self._writer.write_batch(batch)
        self._count += n
        self._raw += raw_size_of_batch(batch)
        if self._first is None:
            self._first = first
        self._last = offsets[n - 1].as_py()
        self._stamps.append(batch.column("timestamp"))
        self._stamp_rows += n
        if self._stamp_rows >= TIMESTAMP_RANGE_ROWS:
            self._take_timestamp_range()

    def _take_timestamp_range(self) -> None:
        if not self._stamps:
            return
        lo, hi = _min_max(pa.chunked_array(self._stamps))
        self._stamps, self._stamp_rows = [], 0
        self._min_ts = lo if self._min_ts is None else min(self._min_ts, lo)
        self._max_ts = hi if self._max_ts is None else max(self._max_ts, hi)

    def finish(self, metadata: SegmentMetadata) -> ObjectInfo:
        """Write the footer and complete the upload; returns the temp object's info.

        The footer gets the record-time range of the records written (``min_timestamp``,
        ``max_timestamp``) unless ``metadata`` already carries one, so callers need not
        track it. May be called again after a ``StorageError`` from ``complete`` (the footer is
        written once).

        Raises:
            ValueError: ``metadata.message_count`` differs from the records written.
            StorageError: completing failed (retry ``finish`` or ``abort``).
        """
        if self._state == "aborted":
            raise ValueError(f"segment upload {self.temp_key} was aborted")
        if metadata.message_count != self._count:
            raise ValueError(f"segment upload {self.temp_key}: footer message_count="
                             f"{metadata.message_count} but {self._count} records written")
        self._take_timestamp_range()
        if metadata.min_timestamp is None and self._min_ts is not None:
            metadata = replace(metadata, min_timestamp=self._min_ts, max_timestamp=self._max_ts)
        if self._state == "open":
            self._writer.finish(metadata)
            self._state = "finished"
        info = self._upload.complete()
        self._state = "complete"
        return info

    def abort(self) -> None:
        """Discard the upload; idempotent. A completed temp object is deleted."""
        if self._state == "aborted":
            return
        completed = self._state == "complete"
        self._stream.discard()
        self._state = "aborted"
        self._stamps = []
        self._upload.abort()
        if completed:
            self.store.delete(self.temp_key)


@dataclass(frozen=True)
class Published:
    """A published segment: its final object, and whether the temp object stayed behind.

    ``temp_error`` is why the temp object could not be deleted (``None`` when it was): the
    segment is complete and visible either way; the bucket's lifecycle rule for the temp
    prefix removes a leftover.
    """

    info: ObjectInfo
    temp_error: ReplicatorError | None = None


def _once(fn: Callable[[], T], what: str) -> T:
    return fn()


def publish_segment(store: ObjectStore, temp: str, key: SegmentKey,
                    storage_class: str | None = None, *,
                    attempt: Callable[[Callable[[], Any], str], Any] = _once) -> Published:
    """Make a finished temp object the segment ``key``: the one way segments appear.

    a. Copy the temp object to the final key with ``storage_class`` (server-side;
       multipart above the store's copy threshold). From here on the segment is visible
       and complete.
    b. Delete the temp object. A failure here is returned, not raised.

    Safe to repeat: if the temp object is gone but the final key exists (an earlier attempt
    copied it and died before or after deleting), the final object's info is returned.

    Args:
        store: the bucket.
        temp: the finished temp object's key.
        key: the segment's final key.
        storage_class: the storage class of the final object (the bucket's default if
            ``None``).
        attempt: runs each request (``attempt(fn, what)``), e.g. with retries; once by
            default.

    Raises:
        ObjectNotFound: neither the temp object nor the final key exists.
        StorageError: the copy failed (retriable).
    """
    final = key.to_key()

    def copy() -> ObjectInfo:
        try:
            return store.copy(temp, final, storage_class=storage_class)
        except ObjectNotFound:
            info = store.head(final)  # raises ObjectNotFound if the copy never happened
            log.info("segment %s already published (temp %s gone)", final, temp)
            return info

    info: ObjectInfo = attempt(copy, f"copy {temp} to {final}")   # a
    try:
        attempt(lambda: store.delete(temp), f"delete {temp}")      # b
    except ReplicatorError as e:
        return Published(info, e)
    return Published(info)


class SegmentStreamReader(SegmentReader):
    """A ``SegmentReader`` that owns the object stream it reads (closed with the reader).

    ``format`` is the format the segment's own bytes named (``formats.registry``). With
    ``key``, the records' offsets are checked against it as they are read: each batch must
    go on above the one before, strictly increasing, within the key's range
    (``SegmentCorrupt`` otherwise; ``check_offsets``).
    """

    def __init__(self, inner: SegmentReader, stream: BinaryIO,
                 fmt: SegmentFormat | None = None, key: SegmentKey | None = None) -> None:
        self._inner = inner
        self._stream = stream
        self.format = fmt
        self._key = key

    @property
    def metadata(self) -> SegmentMetadata:
        return self._inner.metadata

    def iter_batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        batches = self._inner.iter_batches(batch_size)
        return batches if self._key is None else check_offsets(batches, self._key)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._stream.close()

    def __enter__(self) -> SegmentStreamReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_segment(store: ObjectStore, key: SegmentKey, *,
                 buffer_size: int = DEFAULT_READ_BUFFER) -> SegmentStreamReader:
    """Open a published segment, its footer checked against ``key``: the one way services
    and tools read segments.

    The format is the one the object's own bytes name (``formats.registry.sniff_format``),
    whatever ``format.name`` says: segments written by another region, or before a format
    change, read the same. Use as a context manager (or call ``close``) to release the
    object stream.

    Raises:
        SegmentNotFound: no object under the key.
        SegmentCorrupt: no known format, unreadable, or the footer disagrees with the key.
        StorageError: retriable failure.
    """
    where = f"s3://{store.bucket}/{key.to_key()}"
    try:
        stream = store.open_read(key.to_key(), buffer_size=buffer_size)
    except SegmentNotFound:
        raise
    except ObjectNotFound as e:
        raise SegmentNotFound(f"{where} does not exist") from e
    try:
        fmt = sniff_format(stream, where=where)
        reader = fmt.open_reader(stream, expected=key, where=where)
    except BaseException:
        stream.close()
        raise
    return SegmentStreamReader(reader, stream, fmt, key)


def check_offsets(batches: Iterator[pa.RecordBatch], key: SegmentKey
                  ) -> Iterator[pa.RecordBatch]:
    """``batches`` as they come, each checked: its offsets strictly increasing, above the
    batch before, within ``[key.start, key.end]``. A footer that matches its key can still
    sit on other records (an object copied over a key, a foreign writer): replayed as they
    are, an offset above the key would move a checkpoint past records of later segments,
    which would then be passed over as already replayed.

    Raises:
        SegmentCorrupt: naming the key and the first offset out of place.
    """
    last = key.start - 1
    for batch in batches:
        n = batch.num_rows
        if n:
            column = batch.column("offset")
            if column.null_count or not pa.types.is_integer(column.type):
                raise SegmentCorrupt(f"{key}: the offset column holds nulls or is not "
                                     f"integer ({column.type})")
            offsets = column.to_numpy(zero_copy_only=False)
            bad = None
            if int(offsets[0]) <= last:
                bad = int(offsets[0])
            elif n > 1 and not bool(np.all(np.diff(offsets) > 0)):
                bad = int(offsets[1:][np.diff(offsets) <= 0][0])
            elif int(offsets[-1]) > key.end:
                bad = int(offsets[-1])
            if bad is not None:
                raise SegmentCorrupt(f"{key}: record offset {bad} out of place (offsets must "
                                     f"increase within {key.start}-{key.end}, after "
                                     f"{last})")
            last = int(offsets[-1])
        yield batch


FOOTER_READ_BUFFER = 64 * 1024
"""Read buffer of ``read_footer``: a Parquet reader asks for the last 64 KiB first (footer
and schema), an Arrow segment for its trailer and then its schema at the start; either is
one or two ranged reads of this size, whatever the object's size."""


def read_footer(store: ObjectStore, key: SegmentKey) -> SegmentMetadata:
    """The footer of a published segment, checked against ``key``, reading only what the
    footer needs: a HEAD and ranged reads of ``FOOTER_READ_BUFFER`` (an object no larger
    than that is read whole), never the records.

    Raises:
        SegmentNotFound: no object under the key.
        SegmentCorrupt: no known format, unreadable, or the footer disagrees with the key.
        StorageError: retriable failure.
    """
    with open_segment(store, key, buffer_size=FOOTER_READ_BUFFER) as reader:
        return reader.metadata
