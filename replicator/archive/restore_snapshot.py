"""The segments a snapshot of a topic's Iceberg table lists: ``replicator restore
--snapshot`` (docs/archive.md). Needs ``[catalog]`` and the ``archive`` extra.
"""

from __future__ import annotations

import builtins
import dataclasses
import heapq
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from formats.base import SEGMENT_SCHEMA, SegmentMetadata, WriterOptions
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.core.errors import ConfigError, FatalError, ObjectNotFound, SegmentCorrupt
from replicator.core.keys import SegmentKey
from replicator.core.settings import Settings
from replicator.core.storage import MemoryObjectStore, ObjectInfo, ObjectStore, Upload

if TYPE_CHECKING:
    from replicator.archive.committer import ArchiveCommitter
    from replicator.archive.iceberg import IcebergTable

log = logging.getLogger(__name__)


class SnapshotUnknown(FatalError):
    """The topic has no table, or its table keeps no such snapshot (the CLI exits 2)."""


def snapshot_segments(settings: Settings, store: ObjectStore, region: str, topic: str,
                      snapshot_id: int, *, topic_id: str | None = None,
                      live: bool = True) -> frozenset[SegmentKey]:
    """The segments the data files of snapshot ``snapshot_id`` of the topic's table are (a
    trimmed copy stands for its segment, present or not: ``snapshot_read`` reads copies).

    Args:
        settings: settings with ``[catalog]``.
        store: the bucket.
        region: the source region.
        topic: the source topic.
        snapshot_id: the table snapshot (``replicator archive snapshots`` lists them).
        topic_id: the incarnation's topic id, when not the live one: its own table
            (docs/architecture.md, "Topic incarnations").
        live: read the live incarnation's table (``topic_id`` is then not used).

    Raises:
        ConfigError: ``catalog.enabled`` is false, or the ``archive`` extra is missing.
        SnapshotUnknown: no table for the topic, or no such snapshot kept.
        CatalogError: the catalog or the table's metadata could not be read.
    """
    return snapshot_read(settings, store, region, topic, snapshot_id, topic_id=topic_id,
                         live=live, copies=False).keys


@dataclass(frozen=True)
class SnapshotRead:
    """What a restore of a snapshot reads: ``keys`` from ``store``."""

    keys: frozenset[SegmentKey]
    store: ObjectStore
    """The bucket; with the segments made of trimmed copies (``from_copies``) over it."""
    from_copies: tuple[SegmentKey, ...] = ()
    """Keys made of the trimmed copies the snapshot lists whose segment is gone."""


def snapshot_read(settings: Settings, store: ObjectStore, region: str, topic: str,
                  snapshot_id: int, *, topic_id: str | None = None, live: bool = True,
                  copies: bool = True) -> SnapshotRead:
    """The segments snapshot ``snapshot_id`` of the topic's table lists, and the store to
    read them from (arguments and errors as ``snapshot_segments``).

    A trimmed copy (``archive.trims``) stands for its segment while the segment is in the
    bucket (ingress takes each position once from the overlapping segments). A copy whose
    segment compaction has since deleted is read itself (with ``copies``): its rows are
    made a segment of exactly the copy's offsets (same partition and level), kept in
    memory over the bucket (never written to it), so the restore reads every position the
    snapshot lists.
    """
    table, committer = _snapshot_table(settings, store, region, topic, snapshot_id,
                                       topic_id=topic_id, live=live)
    keys: set[SegmentKey] = set()
    made: dict[SegmentKey, tuple[str, SegmentKey]] = {}
    for path in table.files(snapshot_id):
        piece = committer.piece_of(table, path)
        if piece is None:
            raise SnapshotUnknown(f"snapshot {snapshot_id} of {table.name} lists {path}, "
                                  "not a segment of this bucket")
        if piece.whole or not copies or _exists(store, piece.key):
            keys.add(piece.key)
            continue
        key = dataclasses.replace(piece.key, start=piece.lo, end=piece.hi)
        if _exists(store, key):   # a segment of exactly those offsets: the same records
            keys.add(key)
            continue
        keys.add(key)
        made[key] = (path, piece.key)
    if not made:
        return SnapshotRead(frozenset(keys), store)
    from replicator.archive.iceberg import CatalogError  # (the archive extra: loaded)

    overlay = MemoryObjectStore(store.bucket)
    read: list[SegmentKey] = []
    for key, (path, gone) in sorted(made.items()):
        try:
            data = table.read_file(path)
        except CatalogError as e:
            if not isinstance(e.__cause__, FileNotFoundError):
                raise
            # Gone too (a lifecycle rule on the warehouse): the plan names the key missing.
            log.error("snapshot %d of %s: %s and its trimmed copy %s are both gone",
                      snapshot_id, table.name, gone, path)
            continue
        _segment_of_copy(overlay, key, data)
        read.append(key)
        log.info("snapshot %d of %s: %s is no longer in the bucket; its trimmed copy %s is "
                 "read as %s", snapshot_id, table.name, gone, path, key)
    return SnapshotRead(frozenset(keys), OverlayStore(store, overlay), tuple(read))


def _exists(store: ObjectStore, key: SegmentKey) -> bool:
    try:
        store.head(key.to_key())
    except ObjectNotFound:
        return False
    return True


def _segment_of_copy(overlay: ObjectStore, key: SegmentKey, data: bytes) -> None:
    """Write the rows of a trimmed copy as the segment ``key`` into ``overlay``."""
    # The copy keeps the table's types (microsecond times, Parquet's list naming): the
    # segment's are cast back (times were milliseconds, nothing is truncated).
    try:
        rows = pq.read_table(pa.BufferReader(data)).cast(SEGMENT_SCHEMA)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise SegmentCorrupt(f"the trimmed copy read as {key} is not a segment's rows: "
                             f"{e}") from e
    up = SegmentUpload(overlay, get_format("parquet"), "_restore-copies", WriterOptions())
    for batch in rows.to_batches():
        up.write_batch(batch)
    meta = SegmentMetadata.for_key(key, rows.num_rows, created_by="restore --snapshot")
    publish_segment(overlay, up.finish(meta).key, key)


def _snapshot_table(settings: Settings, store: ObjectStore, region: str, topic: str,
                    snapshot_id: int, *, topic_id: str | None, live: bool
                    ) -> tuple[IcebergTable, ArchiveCommitter]:
    if not settings.catalog.enabled:
        raise ConfigError("catalog.enabled", "--snapshot reads a snapshot of the topic's "
                          "archive table: set [catalog] enabled = true (docs/configuration.md)")
    try:
        from replicator.archive.committer import ArchiveCommitter
        from replicator.archive.naming import TableIdentity
    except ImportError as e:
        raise ConfigError("catalog.enabled", f"needs the 'archive' extra (pip install "
                          f"'kafka-s3-replicator[archive]'): {e}") from e
    committer = ArchiveCommitter(settings, store)
    if live:
        table = committer.table(region, topic, create=False)
    else:
        table = committer.catalog.load(
            committer.identifier(TableIdentity(region, topic, topic_id)))
    if table is None:
        raise SnapshotUnknown(f"{region}/{topic} has no archive table (replicator archive "
                              "sync creates it)")
    if not table.has_snapshot(snapshot_id):
        kept = [s.snapshot_id for s in table.snapshots()]
        raise SnapshotUnknown(
            f"table {table.name} keeps no snapshot {snapshot_id} (expired, or never its "
            f"own; replicator archive snapshots lists the {len(kept)} kept)")
    return table, committer


class OverlayStore(ObjectStore):
    """The bucket with a few objects of ``over`` (read-only) in front: reads and listings
    see both, every write goes to the bucket.
    """

    def __init__(self, base: ObjectStore, over: ObjectStore) -> None:
        self.base, self.over = base, over
        self.bucket = base.bucket

    def _src(self, key: str) -> ObjectStore:
        try:
            self.over.head(key)
        except ObjectNotFound:
            return self.base
        return self.over

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None, storage_class: str | None = None,
            content_type: str | None = None) -> ObjectInfo:
        return self.base.put(key, data, if_none_match=if_none_match, if_match=if_match,
                             storage_class=storage_class, content_type=content_type)

    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        return self.base.open_upload(key, storage_class=storage_class)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self._src(key).get_with_etag(key)

    def get(self, key: str) -> bytes:
        return self._src(key).get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._src(key).get_range(key, start, length)

    def head(self, key: str) -> ObjectInfo:
        return self._src(key).head(key)

    def open_read(self, key: str, *, buffer_size: int = 8 * 1024**2) -> BinaryIO:
        return self._src(key).open_read(key, buffer_size=buffer_size)

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        over = {o.key for o in self.over.list(prefix, start_after=start_after)}
        yield from heapq.merge(
            (o for o in self.base.list(prefix, start_after=start_after) if o.key not in over),
            self.over.list(prefix, start_after=start_after), key=lambda o: o.key)

    def list_folders(self, prefix: str) -> builtins.list[str]:
        return sorted(set(self.base.list_folders(prefix)) | set(self.over.list_folders(prefix)))

    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        return self.base.copy(src, dst, storage_class=storage_class)

    def delete(self, key: str) -> None:
        self.base.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.base.delete_many(keys)
