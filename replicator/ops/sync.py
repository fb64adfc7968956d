"""Bucket-to-bucket copy of segment objects, for stores without S3 replication.

``replicator sync`` copies every segment key (and ``_topic.json`` and the exported group
offsets, ``_groups/``; not the compaction lock) under the data prefix from a source bucket
to a destination bucket, and deletes destination segments that the source no longer has
(compaction removed them). Temporary objects are never copied: only keys under the data
prefix move, and the temp prefix may not lie inside it.

Order matters for readers on the destination side: in one pass every copy happens before
any delete, so a compacted segment is visible before the level-0 segments it replaces
disappear. Copies are streamed (one part in memory) and land under the final key only when
complete, so a reader never sees a partial object. Running it twice changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from replicator.core.errors import ObjectNotFound
from replicator.core.keys import (
    CHAIN_NAME,
    TOPIC_META_NAME,
    SegmentKey,
    parse_group_export_key,
    parse_heartbeat_key,
)
from replicator.core.retry import RetryPolicy, retry
from replicator.core.storage import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

COPY_CHUNK = 8 * 1024**2


@dataclass
class SyncReport:
    """What one pass did."""

    copied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes_copied: int = 0
    skipped: int = 0
    vanished: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True if the pass copied or deleted anything."""
        return bool(self.copied or self.deleted)


def is_replicated_key(key: str, prefix: str) -> bool:
    """True for keys sync moves: final segment keys, topic metadata and exported group
    offsets under ``prefix``.
    """
    if not key.startswith(prefix + "/"):
        return False
    if _rewritten(key):
        return True
    return SegmentKey.try_parse(key) is not None


def _rewritten(key: str) -> bool:
    """Objects egress rewrites in place (``_topic.json``, ``_incarnations.json``, exported
    group offsets, heartbeats): copied when their ETag differs, never deleted by a sync.
    """
    return key.endswith(("/" + TOPIC_META_NAME, "/" + CHAIN_NAME)) \
        or parse_group_export_key(key) is not None \
        or parse_heartbeat_key(key) is not None


@dataclass(frozen=True)
class SyncPlan:
    """Which keys to copy and which to delete (pure decision, see ``plan_sync``)."""

    copy: list[ObjectInfo]
    delete: list[str]


def plan_sync(source: Iterable[ObjectInfo], destination: Iterable[ObjectInfo], prefix: str,
              *, delete: bool = True) -> SyncPlan:
    """Decide a sync pass from two listings.

    A key is copied when the destination lacks it or holds a different size; ``_topic.json``
    and exported group offsets also when their ETag differs (they are rewritten in place,
    segments never are).
    Destination segment keys missing at the source are deleted (when ``delete``).
    """
    src = {o.key: o for o in source if is_replicated_key(o.key, prefix)}
    dst = {o.key: o for o in destination if is_replicated_key(o.key, prefix)}
    to_copy = []
    for key, info in sorted(src.items()):
        have = dst.get(key)
        if have is None or have.size != info.size or (_rewritten(key)
                                                     and have.etag != info.etag):
            to_copy.append(info)
    to_delete = sorted(k for k in dst if k not in src and not _rewritten(k)) if delete else []
    return SyncPlan(to_copy, to_delete)


class BucketSync:
    """Copies replicated keys from one ``ObjectStore`` to another (any endpoints)."""

    def __init__(self, source: ObjectStore, destination: ObjectStore, prefix: str, *,
                 delete: bool = True, retry_policy: RetryPolicy | None = None,
                 on_progress: Callable[[SyncReport], None] | None = None) -> None:
        self.source = source
        self.destination = destination
        self.prefix = prefix
        self.delete = delete
        self.retry_policy = retry_policy or RetryPolicy(attempts=5)
        self.on_progress = on_progress
        # ETags of topic metadata as copied, so an unchanged source is not copied again when
        # the destination store computes ETags differently.
        self._meta_etags: dict[str, str] = {}

    def run_once(self) -> SyncReport:
        """One pass: list both sides, copy what is missing, then delete what is gone."""
        report = SyncReport()
        source = list(self.source.list(self.prefix + "/"))
        destination = list(self.destination.list(self.prefix + "/"))
        dst_view = [
            ObjectInfo(o.key, o.size, o.last_modified, self._meta_etags.get(o.key, o.etag))
            for o in destination
        ]
        plan = plan_sync(source, dst_view, self.prefix, delete=self.delete)
        report.skipped = len(source) - len(plan.copy)
        for info in plan.copy:
            try:
                retry(lambda info=info: self._copy(info),  # type: ignore[misc]
                      self.retry_policy, what=f"sync copy {info.key}")
            except ObjectNotFound:
                # Deleted at the source after the listing (compaction); the next pass
                # deletes it here too if the destination had it.
                log.info("sync: %s vanished at the source before it was copied", info.key)
                report.vanished.append(info.key)
                continue
            report.copied.append(info.key)
            report.bytes_copied += info.size
            if self.on_progress is not None:
                self.on_progress(report)
        if plan.delete:
            retry(lambda: self.destination.delete_many(plan.delete), self.retry_policy,
                  what=f"sync delete {len(plan.delete)} key(s)")
            report.deleted.extend(plan.delete)
            for k in plan.delete:
                log.info("sync deleted %s (gone at the source)", k)
        return report

    def _copy(self, info: ObjectInfo) -> None:
        upload = self.destination.open_upload(info.key)
        try:
            with self.source.open_read(info.key, buffer_size=COPY_CHUNK) as reader:
                while chunk := reader.read(COPY_CHUNK):
                    upload.write(chunk)
            done = upload.complete()
        except BaseException:
            upload.abort()
            raise
        if info.key.endswith(TOPIC_META_NAME):
            self._meta_etags[done.key] = info.etag
        log.info("sync copied %s (%d bytes)", info.key, info.size)

    def follow(self, interval: float, should_stop: Callable[[], bool],
               sleep: Callable[[float], None] = time.sleep) -> SyncReport:
        """Repeat passes every ``interval`` seconds until ``should_stop()``; totals."""
        total = SyncReport()
        while not should_stop():
            r = self.run_once()
            total.copied += r.copied
            total.deleted += r.deleted
            total.bytes_copied += r.bytes_copied
            if not r.changed:
                sleep(interval)
        return total
