"""Bucket sync: what it copies, what it deletes, in which order, and idempotence."""

from __future__ import annotations

from collections.abc import Iterable

from replicator.core.keys import SegmentKey, group_export_key, topic_meta_key
from replicator.core.storage import MemoryObjectStore
from replicator.ops.sync import BucketSync, is_replicated_key, plan_sync


def seg(start: int, end: int, level: int = 0, partition: int = 0) -> str:
    return SegmentKey("data", "us-east-1", "t", partition, level, start, end).to_key()


class RecordingStore(MemoryObjectStore):
    """Remembers the order of writes and deletes."""

    def __init__(self) -> None:
        super().__init__(part_size=1024)
        self.events: list[tuple[str, str]] = []

    def put(self, key: str, data: bytes, **kw: object) -> object:  # type: ignore[override]
        self.events.append(("put", key))
        return super().put(key, data, **kw)  # type: ignore[arg-type]

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self.events += [("delete", k) for k in keys]
        super().delete_many(keys)


def test_only_segments_and_topic_metadata_are_replicated() -> None:
    assert is_replicated_key(seg(0, 9), "data")
    assert is_replicated_key(topic_meta_key("data", "us-east-1", "t"), "data")
    assert not is_replicated_key("temp/5f0c", "data")
    assert not is_replicated_key("data/us-east-1/t/0/0/garbage", "data")
    assert not is_replicated_key("other/us-east-1/t/0/0/" + "0" * 20 + "-" + "0" * 20, "data")


def test_copies_missing_and_deletes_gone_copies_first() -> None:
    src, dst = MemoryObjectStore(), RecordingStore()
    src.put(seg(0, 99, level=1), b"compacted" * 100)
    src.put("temp/abc", b"partial")
    src.put(topic_meta_key("data", "us-east-1", "t"), b'{"partitions": 1}')
    dst.put(seg(0, 49), b"a")
    dst.put(seg(50, 99), b"b")
    dst.events.clear()

    report = BucketSync(src, dst, "data").run_once()

    assert sorted(report.copied) == sorted([seg(0, 99, level=1),
                                            topic_meta_key("data", "us-east-1", "t")])
    assert report.deleted == [seg(0, 49), seg(50, 99)]
    assert "temp/abc" not in set(dst.keys())
    kinds = [k for k, _ in dst.events]
    assert kinds.index("delete") > max(i for i, k in enumerate(kinds) if k == "put")
    assert dst.get(seg(0, 99, level=1)) == b"compacted" * 100


def test_second_pass_changes_nothing() -> None:
    src, dst = MemoryObjectStore(), MemoryObjectStore()
    for i in range(5):
        src.put(seg(i * 10, i * 10 + 9), bytes([i]) * 3000)
    src.put(topic_meta_key("data", "us-east-1", "t"), b"{}")
    syncer = BucketSync(src, dst, "data")
    assert len(syncer.run_once().copied) == 6
    again = syncer.run_once()
    assert not again.changed
    assert dst.keys() == src.keys()


def test_rewritten_topic_metadata_is_copied_again() -> None:
    src, dst = MemoryObjectStore(), MemoryObjectStore()
    meta = topic_meta_key("data", "us-east-1", "t")
    src.put(meta, b'{"partitions": 1}')
    syncer = BucketSync(src, dst, "data")
    syncer.run_once()
    src.put(meta, b'{"partitions": 2}')
    assert syncer.run_once().copied == [meta]
    assert dst.get(meta) == b'{"partitions": 2}'


def test_exported_group_offsets_are_copied_when_rewritten_and_never_deleted() -> None:
    src, dst = MemoryObjectStore(), MemoryObjectStore()
    key = group_export_key("data", "us-east-1", "t", "app/1")
    src.put(key, b'{"offsets": {"0": 1}}')
    syncer = BucketSync(src, dst, "data")
    assert syncer.run_once().copied == [key]
    src.put(key, b'{"offsets": {"0": 2}}')     # same size, new content
    assert syncer.run_once().copied == [key]
    assert dst.get(key) == b'{"offsets": {"0": 2}}'
    src.delete_many([key])
    assert not syncer.run_once().changed        # what a group had read stays
    assert dst.get(key) == b'{"offsets": {"0": 2}}'


def test_no_delete_keeps_destination_objects() -> None:
    src, dst = MemoryObjectStore(), MemoryObjectStore()
    dst.put(seg(0, 9), b"x")
    assert not BucketSync(src, dst, "data", delete=False).run_once().changed
    assert dst.keys() == [seg(0, 9)]


def test_plan_copies_on_size_difference() -> None:
    src, dst = MemoryObjectStore(), MemoryObjectStore()
    src.put(seg(0, 9), b"full object")
    dst.put(seg(0, 9), b"short")
    plan = plan_sync(src.list(""), dst.list(""), "data")
    assert [o.key for o in plan.copy] == [seg(0, 9)]
    assert plan.delete == []


def test_object_deleted_at_source_during_pass_is_reported_not_fatal() -> None:
    class Vanishing(MemoryObjectStore):
        def open_read(self, key: str, *, buffer_size: int = 8 * 1024**2):  # type: ignore[no-untyped-def]
            self.delete(key)
            return super().open_read(key, buffer_size=buffer_size)

    src, dst = Vanishing(), MemoryObjectStore()
    src.put(seg(0, 9), b"x")
    report = BucketSync(src, dst, "data").run_once()
    assert report.vanished == [seg(0, 9)]
    assert dst.keys() == []
