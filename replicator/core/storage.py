"""The ``ObjectStore`` seam: everything the suite asks of S3, and an in-memory twin.

The S3 implementation lives in ``replicator.core.s3`` (the only boto3 user for S3). Both
implementations run through the same contract tests (``tests/contract/object_store.py``).

Semantics every implementation keeps:

* ``put`` with ``if_none_match=True`` is a conditional create: it raises
  ``PreconditionFailed`` when the key exists and leaves the object unchanged.
* ``open_upload`` streams an object: bytes become visible at ``complete()`` only;
  ``abort()`` leaves nothing behind. Memory held is at most one part.
* ``copy`` is server-side; objects above the multipart-copy threshold are copied in parts.
* ``copy_from`` copies an object of another bucket into this one, server-side and sent to
  this store's endpoint (the destination region's): the bytes never pass through the
  caller. One request, so up to 5 GiB (larger objects raise ``StorageFatalError``).
* ``list`` yields objects in lexical key order, paginating transparently.
* An object written without a storage class (put, upload, copy) has S3's default,
  ``"STANDARD"``; ``copy`` does not carry the source's class over (as S3).
* ``delete``/``delete_many`` succeed for missing keys.
* Missing objects raise ``ObjectNotFound`` naming bucket and key; transient failures raise
  ``StorageError`` (retriable); anything else ``StorageFatalError``.
"""

from __future__ import annotations

import bisect
import builtins
import io
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from hashlib import md5
from typing import BinaryIO

from replicator.core.errors import ObjectNotFound, PreconditionFailed, StorageFatalError

#: The storage class S3 gives an object written without one.
STANDARD = "STANDARD"


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or ``head`` tells about an object."""

    key: str
    size: int
    last_modified: datetime
    etag: str = ""
    storage_class: str | None = None
    replication_status: str | None = None
    """From ``head`` on a bucket with replication rules: ``PENDING``, ``COMPLETED``,
    ``FAILED`` (a source object) or ``REPLICA``; ``None`` when the store says nothing."""


class Upload(ABC):
    """A streaming upload to one key. Nothing is visible until ``complete``."""

    key: str

    @abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append bytes (buffered up to one part, then sent).

        Raises:
            StorageError: a part could not be sent (the upload stays open for ``abort``).
        """

    @abstractmethod
    def complete(self) -> ObjectInfo:
        """Finish the object and make it visible under ``key``.

        Raises:
            StorageError: retriable failure; the upload may be completed again.
        """

    @abstractmethod
    def abort(self) -> None:
        """Discard everything written; idempotent, never raises for a finished upload."""

    @property
    @abstractmethod
    def bytes_written(self) -> int:
        """Bytes accepted by ``write`` so far."""

    @property
    @abstractmethod
    def buffered_bytes(self) -> int:
        """Bytes held in memory, not yet sent."""


class UploadStream(io.RawIOBase):
    """A write-only binary stream over an ``Upload`` (for format writers)."""

    def __init__(self, upload: Upload) -> None:
        super().__init__()
        self.upload = upload

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        return self.upload.write(b)

    def tell(self) -> int:
        return self.upload.bytes_written

    def close(self) -> None:
        # Closing the stream does not complete the upload: the durability method does.
        super().close()


class ObjectStore(ABC):
    """Put/get/list/copy/delete against one bucket."""

    bucket: str

    @abstractmethod
    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None, storage_class: str | None = None,
            content_type: str | None = None) -> ObjectInfo:
        """Write a whole small object.

        ``if_match`` replaces the object only if its ETag is still that one (read-modify-
        write by several writers: read with ``get_with_etag``, put with its ETag, read
        again on ``PreconditionFailed``).

        Raises:
            PreconditionFailed: ``if_none_match`` and the key exists; ``if_match`` and the
                object changed (or is gone: S3 may also answer ``ObjectNotFound`` then).
        """

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and the ETag of exactly those bytes (for ``put(if_match=)``).

        This default reads the ETag before and after the body and retries when they
        differ; stores override it with one request.

        Raises:
            ObjectNotFound: the key does not exist.
        """
        while True:
            before = self.head(key).etag
            data = self.get(key)
            if self.head(key).etag == before:
                return data, before

    @abstractmethod
    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        """Start a streaming (multipart) upload to ``key``."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Read a whole object (small objects only: metadata, locks).

        Raises:
            ObjectNotFound: the key does not exist.
        """

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Read ``length`` bytes from ``start`` (fewer at the end of the object).

        Raises:
            ObjectNotFound: the key does not exist.
        """

    @abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and date of one object.

        Raises:
            ObjectNotFound: the key does not exist.
        """

    @abstractmethod
    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """All objects under ``prefix`` in key order, after ``start_after`` if given."""

    def list_folders(self, prefix: str) -> builtins.list[str]:
        """The names directly under ``prefix`` (which ends in ``/``) that have objects below
        them: ``a`` for ``{prefix}a/...`` (a LIST with a delimiter on S3), sorted.
        """
        found: set[str] = set()
        for info in self.list(prefix):
            head, sep, _ = info.key[len(prefix):].partition("/")
            if sep:
                found.add(head)
        return sorted(found)

    @abstractmethod
    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        """Server-side copy (multipart above the copy threshold).

        Raises:
            ObjectNotFound: ``src`` does not exist.
        """

    def copy_from(self, source: ObjectStore, key: str, *,
                  storage_class: str | None = None) -> None:
        """Server-side copy of ``source``'s object ``key`` into this bucket, same key.

        Raises:
            ObjectNotFound: ``key`` does not exist in ``source``.
            StorageFatalError: the store cannot copy across buckets, or refused (access
                denied, object above 5 GiB).
            StorageError: retriable failure (the destination endpoint did not answer).
        """
        raise StorageFatalError(f"{type(self).__name__} cannot copy from another bucket")

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; a missing key is not an error."""

    @abstractmethod
    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete objects in batches of up to 1000; missing keys are not errors.

        Raises:
            StorageFatalError: naming the keys S3 refused to delete.
        """

    def open_read(self, key: str, *, buffer_size: int = 8 * 1024**2) -> BinaryIO:
        """A seekable reader of one object; memory: one ``buffer_size`` at most.

        An object no larger than ``buffer_size`` is read whole with one GET (the buffer
        would have held all of it anyway): a reader that seeks to the footer and back
        costs one request, not one per seek. A larger one is read through a buffer over
        ranged GETs.

        Raises:
            ObjectNotFound: the key does not exist.
        """
        info = self.head(key)
        if info.size <= buffer_size:
            return io.BytesIO(self.get_range(key, 0, info.size))
        raw = RangeReader(self, key, info.size)
        return io.BufferedReader(raw, buffer_size=buffer_size)


class RangeReader(io.RawIOBase):
    """A seekable raw stream reading an object through ``get_range`` calls."""

    def __init__(self, store: ObjectStore, key: str, size: int) -> None:
        super().__init__()
        self.store = store
        self.key = key
        self.size = size
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        data = self.store.get_range(self.key, self.pos, n)
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


# --- in-memory implementation ----------------------------------------------------------


@dataclass
class _Stored:
    data: bytes
    last_modified: datetime
    storage_class: str | None
    etag: str = field(init=False)

    def __post_init__(self) -> None:
        self.etag = md5(self.data, usedforsecurity=False).hexdigest()

    def info(self, key: str) -> ObjectInfo:
        return ObjectInfo(key, len(self.data), self.last_modified, self.etag, self.storage_class)


class MemoryObjectStore(ObjectStore):
    """An in-memory bucket with S3's semantics, thread-safe. For unit tests and fakes.

    ``part_size`` mirrors the S3 store: an upload holds at most one part in memory before
    it "sends" it to the (in-memory) parts list.
    """

    def __init__(self, bucket: str = "memory", *, part_size: int = 8 * 1024**2,
                 now: type[datetime] = datetime) -> None:
        self.bucket = bucket
        self.part_size = part_size
        self._objects: dict[str, _Stored] = {}
        self._sorted: builtins.list[str] = []
        """The keys of ``_objects`` in order (a listing is a slice, as on S3)."""
        self._lock = threading.Lock()
        self._now = now
        self.uploads_open: set[int] = set()

    def _stamp(self) -> datetime:
        return self._now.now(UTC)

    def _missing(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"s3://{self.bucket}/{key} does not exist")

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None, storage_class: str | None = None,
            content_type: str | None = None) -> ObjectInfo:
        with self._lock:
            if if_none_match and key in self._objects:
                raise PreconditionFailed(f"s3://{self.bucket}/{key} already exists")
            if if_match is not None and (key not in self._objects
                                         or self._objects[key].etag != if_match):
                raise PreconditionFailed(f"s3://{self.bucket}/{key} is no longer ETag "
                                         f"{if_match}")
            obj = _Stored(bytes(data), self._stamp(), storage_class or STANDARD)
            self._set(key, obj)
            return obj.info(key)

    def _set(self, key: str, obj: _Stored) -> None:
        """Store ``obj`` at ``key`` (the lock held)."""
        if key not in self._objects:
            bisect.insort(self._sorted, key)
        self._objects[key] = obj

    def _drop(self, key: str) -> None:
        """Remove ``key`` if it exists (the lock held)."""
        if self._objects.pop(key, None) is not None:
            del self._sorted[bisect.bisect_left(self._sorted, key)]

    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        return _MemoryUpload(self, key, storage_class)

    def _lookup(self, key: str) -> _Stored:
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise self._missing(key)
        return obj

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        obj = self._lookup(key)   # objects are replaced, never changed in place
        return obj.data, obj.etag

    def get(self, key: str) -> bytes:
        return self._lookup(key).data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StorageFatalError(f"invalid range {start}+{length} for s3://{self.bucket}/{key}")
        return self._lookup(key).data[start:start + length]

    def head(self, key: str) -> ObjectInfo:
        return self._lookup(key).info(key)

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        after = start_after if start_after is not None and start_after >= prefix else None
        while True:
            # Pages of 1,000 keys, each from where the last one ended (as S3's).
            with self._lock:
                keys = self._sorted
                i = (bisect.bisect_right(keys, after) if after is not None
                     else bisect.bisect_left(keys, prefix))
                page = [(k, self._objects[k]) for k in keys[i:i + 1000]
                        if k.startswith(prefix)]
            for k, v in page:
                yield v.info(k)
            if len(page) < 1000:
                return
            after = page[-1][0]

    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        obj = self._lookup(src)
        with self._lock:
            new = _Stored(obj.data, self._stamp(), storage_class or STANDARD)
            self._set(dst, new)
            return new.info(dst)

    def copy_from(self, source: ObjectStore, key: str, *,
                  storage_class: str | None = None) -> None:
        if not isinstance(source, MemoryObjectStore):
            raise StorageFatalError(f"cannot copy from {source!r} into memory bucket "
                                    f"{self.bucket} (both must be in memory)")
        obj = source._lookup(key)
        with self._lock:
            self._set(key, _Stored(obj.data, self._stamp(), storage_class or STANDARD))

    def delete(self, key: str) -> None:
        with self._lock:
            self._drop(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                self._drop(k)

    # test helpers --------------------------------------------------------------------

    def keys(self) -> builtins.list[str]:
        """All keys, sorted."""
        with self._lock:
            return sorted(self._objects)


class _MemoryUpload(Upload):
    def __init__(self, store: MemoryObjectStore, key: str, storage_class: str | None) -> None:
        self.store = store
        self.key = key
        self.storage_class = storage_class
        self._parts: list[bytes] = []
        self._buf = bytearray()
        self._written = 0
        self._state = "open"
        self._result: ObjectInfo | None = None
        store.uploads_open.add(id(self))

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._state != "open":
            raise StorageFatalError(f"upload to s3://{self.store.bucket}/{self.key} is "
                                    f"{self._state}")
        self._buf += data
        self._written += len(data)
        while len(self._buf) >= self.store.part_size:
            self._parts.append(bytes(self._buf[: self.store.part_size]))
            del self._buf[: self.store.part_size]
        return len(data)

    def complete(self) -> ObjectInfo:
        if self._result is not None:
            # As S3's store: completing again returns the first result, it writes nothing.
            return self._result
        if self._state == "aborted":
            raise StorageFatalError(f"upload to s3://{self.store.bucket}/{self.key} was aborted")
        data = b"".join(self._parts) + bytes(self._buf)
        self._result = self.store.put(self.key, data, storage_class=self.storage_class)
        self._state = "complete"
        self._parts.clear()
        self._buf.clear()
        self.store.uploads_open.discard(id(self))
        return self._result

    def abort(self) -> None:
        if self._state == "open":
            self._state = "aborted"
            self._parts.clear()
            self._buf.clear()
            self.store.uploads_open.discard(id(self))

    @property
    def bytes_written(self) -> int:
        return self._written

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)
