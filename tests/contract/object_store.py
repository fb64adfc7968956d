"""The ``ObjectStore`` contract: one body of tests, run against every implementation.

``tests/unit/test_object_store_memory.py`` runs it on ``MemoryObjectStore`` and
``tests/integration/test_object_store_s3.py`` on ``S3ObjectStore`` against the session's
moto server. A subclass provides, through an autouse fixture, ``self.store`` (an empty
bucket), ``self.other`` (a second empty bucket of the same kind, for ``copy_from``),
``self.part_size`` (the store's upload part size), ``self.copy_threshold`` (the
multipart-copy threshold) and implements ``open_uploads()`` (multipart uploads left open).
"""

from __future__ import annotations

import io
import os
import random
from typing import Any, cast

import pytest

from replicator.core.errors import ObjectNotFound, PreconditionFailed, StorageFatalError
from replicator.core.storage import ObjectStore, UploadStream


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, incompressible-looking bytes (catches misplaced parts)."""
    return random.Random(seed).randbytes(size)


class ObjectStoreContract:
    store: ObjectStore
    other: ObjectStore
    part_size: int
    copy_threshold: int

    def open_uploads(self) -> int:
        raise NotImplementedError

    # --- put / get / head / get_range ------------------------------------------------

    def test_put_get_head(self) -> None:
        info = self.store.put("a/b/c.bin", b"hello world")
        assert info.key == "a/b/c.bin"
        assert info.size == 11
        assert self.store.get("a/b/c.bin") == b"hello world"
        head = self.store.head("a/b/c.bin")
        assert head.size == 11
        assert head.key == "a/b/c.bin"
        assert head.storage_class == "STANDARD"
        assert head.last_modified.tzinfo is not None
        assert head.etag
        assert head.etag == info.etag

    def test_put_overwrites_and_empty_object(self) -> None:
        self.store.put("k", b"one")
        self.store.put("k", b"")
        assert self.store.get("k") == b""
        assert self.store.head("k").size == 0

    def test_put_storage_class(self) -> None:
        self.store.put("ia", b"x", storage_class="STANDARD_IA")
        assert self.store.head("ia").storage_class == "STANDARD_IA"

    def test_get_range(self) -> None:
        data = payload(1000)
        self.store.put("r", data)
        assert self.store.get_range("r", 0, 10) == data[:10]
        assert self.store.get_range("r", 500, 100) == data[500:600]
        assert self.store.get_range("r", 990, 100) == data[990:]  # short at the end
        assert self.store.get_range("r", 999, 1) == data[999:]
        assert self.store.get_range("r", 1000, 10) == b""  # at the end
        assert self.store.get_range("r", 5000, 10) == b""  # past the end
        assert self.store.get_range("r", 10, 0) == b""

    def test_get_range_invalid(self) -> None:
        self.store.put("r", b"abc")
        with pytest.raises(StorageFatalError):
            self.store.get_range("r", -1, 2)

    def test_missing_object_names_bucket_and_key(self) -> None:
        key = "no/such/key-17"
        for call in (lambda: self.store.get(key), lambda: self.store.head(key),
                     lambda: self.store.get_range(key, 0, 10),
                     lambda: self.store.get_range(key, 0, 0),
                     lambda: self.store.open_read(key),
                     lambda: self.store.copy(key, "dst")):
            with pytest.raises(ObjectNotFound) as exc:
                call()
            assert key in str(exc.value)
            assert self.store.bucket in str(exc.value)
        assert list(self.store.list("dst")) == []

    # --- conditional create -----------------------------------------------------------

    def test_conditional_create(self) -> None:
        self.store.put("lock", b"first", if_none_match=True)
        with pytest.raises(PreconditionFailed) as exc:
            self.store.put("lock", b"second", if_none_match=True)
        assert "lock" in str(exc.value)
        assert self.store.get("lock") == b"first"
        # An unconditional put still overwrites.
        self.store.put("lock", b"third")
        assert self.store.get("lock") == b"third"

    def test_conditional_replace(self) -> None:
        # Read-modify-write by several writers: the put succeeds only over what was read.
        self.store.put("meta", b"v1")
        data, etag = self.store.get_with_etag("meta")
        assert data == b"v1" and etag == self.store.head("meta").etag
        self.store.put("meta", b"v2", if_match=etag)
        assert self.store.get("meta") == b"v2"
        with pytest.raises(PreconditionFailed) as exc:
            self.store.put("meta", b"v3", if_match=etag)       # stale: v2 is there now
        assert "meta" in str(exc.value)
        assert self.store.get("meta") == b"v2"
        with pytest.raises((PreconditionFailed, ObjectNotFound)):
            self.store.put("absent", b"x", if_match=etag)     # nothing to replace
        assert list(self.store.list("absent")) == []

    # --- streaming uploads ------------------------------------------------------------

    def test_upload_below_part_size(self) -> None:
        data = payload(self.part_size // 3, seed=1)
        up = self.store.open_upload("temp/small")
        up.write(data[:100])
        up.write(memoryview(data)[100:])
        assert up.bytes_written == len(data)
        assert up.buffered_bytes == len(data)
        with pytest.raises(ObjectNotFound):
            self.store.head("temp/small")
        info = up.complete()
        assert info.size == len(data)
        assert self.store.get("temp/small") == data
        assert self.open_uploads() == 0

    def test_upload_empty(self) -> None:
        up = self.store.open_upload("temp/empty")
        info = up.complete()
        assert info.size == 0
        assert self.store.get("temp/empty") == b""

    def test_upload_multipart_streams_and_is_invisible_until_complete(self) -> None:
        size = 3 * self.part_size + self.part_size // 2  # 4 parts, the last one short
        data = payload(size, seed=2)
        up = self.store.open_upload("temp/big", storage_class="STANDARD_IA")
        chunk = self.part_size // 4 + 7  # writes that straddle part boundaries
        for i in range(0, size, chunk):
            up.write(data[i:i + chunk])
            # Memory bound: never more than one part held after a write returns.
            assert up.buffered_bytes < self.part_size
        assert up.bytes_written == size
        with pytest.raises(ObjectNotFound):
            self.store.head("temp/big")
        assert [o.key for o in self.store.list("temp/")] == []
        info = up.complete()
        assert info.size == size
        assert info.key == "temp/big"
        assert self.store.get("temp/big") == data
        head = self.store.head("temp/big")
        assert head.size == size
        assert head.etag == info.etag
        assert head.storage_class == "STANDARD_IA"
        assert self.open_uploads() == 0
        # Completing again (a retry after a lost answer) changes nothing.
        assert up.complete().size == size
        assert self.store.get("temp/big") == data

    def test_upload_one_huge_write(self) -> None:
        data = payload(3 * self.part_size + 1, seed=3)
        up = self.store.open_upload("temp/huge")
        up.write(data)
        assert up.buffered_bytes <= self.part_size
        up.complete()
        assert self.store.get("temp/huge") == data

    def test_upload_through_stream(self) -> None:
        data = payload(2 * self.part_size + 5, seed=4)
        up = self.store.open_upload("temp/stream")
        with io.BufferedWriter(cast(Any, UploadStream(up)), buffer_size=4096) as stream:
            stream.write(data)
            stream.flush()
            assert stream.tell() == len(data)
        up.complete()
        assert self.store.get("temp/stream") == data

    def test_upload_abort_leaves_nothing(self) -> None:
        up = self.store.open_upload("temp/aborted")
        up.write(payload(2 * self.part_size + 10, seed=5))  # parts were sent
        assert self.open_uploads() == 1
        up.abort()
        up.abort()  # idempotent
        with pytest.raises(ObjectNotFound):
            self.store.head("temp/aborted")
        assert list(self.store.list("temp/")) == []
        assert self.open_uploads() == 0
        with pytest.raises(StorageFatalError):
            up.write(b"more")
        with pytest.raises(StorageFatalError):
            up.complete()

    def test_upload_abort_after_complete_keeps_object(self) -> None:
        up = self.store.open_upload("temp/done")
        up.write(b"abc")
        up.complete()
        up.abort()
        assert self.store.get("temp/done") == b"abc"

    # --- copy ---------------------------------------------------------------------

    def test_copy_small(self) -> None:
        self.store.put("src", b"payload", storage_class="STANDARD_IA")
        info = self.store.copy("src", "dst/1")
        assert info.size == 7
        assert self.store.get("dst/1") == b"payload"
        # As S3: a copy without a class gets the default, not the source's.
        assert self.store.head("dst/1").storage_class == "STANDARD"
        self.store.copy("src", "dst/2", storage_class="GLACIER_IR")
        assert self.store.head("dst/2").storage_class == "GLACIER_IR"
        assert self.store.get("src") == b"payload"

    def test_copy_above_multipart_threshold(self) -> None:
        size = self.copy_threshold * 2 + 12345
        data = payload(size, seed=6)
        up = self.store.open_upload("temp/seg")
        up.write(data)
        up.complete()
        info = self.store.copy("temp/seg", "data/seg", storage_class="STANDARD_IA")
        assert info.size == size
        assert self.store.head("data/seg").storage_class == "STANDARD_IA"
        assert self.store.head("data/seg").size == size
        assert self.store.get("data/seg") == data
        assert self.open_uploads() == 0

    def test_copy_overwrites_destination(self) -> None:
        self.store.put("src", b"new")
        self.store.put("dst", b"old")
        self.store.copy("src", "dst")
        assert self.store.get("dst") == b"new"

    def test_copy_from_another_bucket_keeps_key_and_bytes(self) -> None:
        data = payload(70_000, seed=8)
        self.other.put("data/r/t/0/seg", data, storage_class="STANDARD_IA")
        self.store.copy_from(self.other, "data/r/t/0/seg")
        assert self.store.get("data/r/t/0/seg") == data
        assert self.store.head("data/r/t/0/seg").storage_class == "STANDARD"
        self.store.copy_from(self.other, "data/r/t/0/seg", storage_class="STANDARD_IA")
        assert self.store.head("data/r/t/0/seg").storage_class == "STANDARD_IA"
        assert self.other.get("data/r/t/0/seg") == data        # the source is untouched
        with pytest.raises(ObjectNotFound):
            self.store.copy_from(self.other, "data/missing")

    # --- list -----------------------------------------------------------------------

    def test_list_order_prefix_start_after(self) -> None:
        keys = [f"p/{n:05d}" for n in range(25)] + ["p2/x", "o/y", "p/sub/z"]
        for k in random.Random(7).sample(keys, len(keys)):
            self.store.put(k, k.encode())
        listed = [o.key for o in self.store.list("p/")]
        assert listed == sorted(k for k in keys if k.startswith("p/"))
        assert [o.key for o in self.store.list("p/", start_after="p/00019")] == [
            "p/00020", "p/00021", "p/00022", "p/00023", "p/00024", "p/sub/z"]
        # start_after need not exist, and may sort before the prefix.
        assert len(list(self.store.list("p/", start_after="p/000195"))) == 6
        assert len(list(self.store.list("p/", start_after="a"))) == 26
        assert list(self.store.list("p/", start_after="q")) == []
        assert list(self.store.list("nothing/")) == []
        info = next(iter(self.store.list("p2/")))
        assert (info.key, info.size, info.storage_class) == ("p2/x", 4, "STANDARD")

    def test_list_lexical_order_of_unicode_and_digits(self) -> None:
        keys = ["u/a", "u/B", "u/ä", "u/z", "u/10", "u/9", "u/a-b", "u/a.b", "u/a_b"]
        for k in keys:
            self.store.put(k, b"")
        # S3 orders by UTF-8 bytes, which is code point order.
        assert [o.key for o in self.store.list("u/")] == sorted(keys)

    def test_list_folders_names_what_is_directly_under_a_prefix(self) -> None:
        for k in ["d/r/a.b/_topic.json", "d/r/a.b/0/0/1-2", "d/r/c/0/0/1-2", "d/r/x",
                  "d/r2/e/_topic.json", "d/s/f/1"]:
            self.store.put(k, b"")
        assert self.store.list_folders("d/r/") == ["a.b", "c"]
        assert self.store.list_folders("d/") == ["r", "r2", "s"]
        assert self.store.list_folders("nothing/") == []

    # --- delete ---------------------------------------------------------------------

    def test_delete(self) -> None:
        self.store.put("d", b"x")
        self.store.delete("d")
        with pytest.raises(ObjectNotFound):
            self.store.get("d")
        self.store.delete("d")  # missing: not an error
        self.store.delete("never/existed")

    def test_delete_many_across_batches_with_missing_keys(self) -> None:
        keys = [f"many/{n:05d}" for n in range(1500)]
        present = keys[::50] + keys[999:1002]  # in both batches of 1000, and at the border
        for k in present:
            self.store.put(k, b"x")
        self.store.put("keep/me", b"x")
        self.store.delete_many(iter(keys))  # any iterable, mostly missing keys
        assert list(self.store.list("many/")) == []
        assert self.store.get("keep/me") == b"x"
        self.store.delete_many([])

    # --- open_read ------------------------------------------------------------------

    @pytest.mark.parametrize("buffer_size", [1024**2, 4 * 1024**2],
                             ids=["ranged-reads", "read-whole"])
    def test_open_read_seek_and_read(self, buffer_size: int) -> None:
        # 1 MiB buffer: ranged GETs; 4 MiB: the object fits and is read with one GET.
        size = 3 * 1024**2 + 17
        data = payload(size, seed=8)
        up = self.store.open_upload("r/big")
        up.write(data)
        up.complete()
        with self.store.open_read("r/big", buffer_size=buffer_size) as f:
            assert f.seekable()
            assert f.read(10) == data[:10]
            f.seek(2 * 1024**2 + 3)
            assert f.read(100) == data[2 * 1024**2 + 3: 2 * 1024**2 + 103]
            f.seek(-5, os.SEEK_END)
            assert f.read() == data[-5:]
            assert f.read(10) == b""
            f.seek(1000)
            assert f.tell() == 1000
            assert f.read() == data[1000:]

    def test_open_read_of_an_empty_object(self) -> None:
        self.store.put("r/empty", b"")
        with self.store.open_read("r/empty") as f:
            assert f.read() == b""
        with pytest.raises(ObjectNotFound):
            self.store.open_read("r/missing")
