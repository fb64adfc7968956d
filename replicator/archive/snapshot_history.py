"""A table's snapshot history: what a step keeps of it, and compaction's hooks around its
deletes (docs/architecture.md, "The archive as Iceberg tables", snapshot expiry).

Expiry selects snapshots by what they list, over every snapshot the table keeps (the
main lineage, one a rollback left behind, a branch or tag head). A step that removed
files expires the kept snapshots listing one (no snapshot kept lists a deleted object);
beyond that a table keeps the newest ``KEEP_SNAPSHOTS`` snapshots and every snapshot that
was current within ``catalog.snapshot_retention``. Compaction calls ``swap`` before it
deletes inputs (one snapshot lists the outputs instead), ``deletable`` for the inputs
whose snapshots were superseded longer than ``catalog.snapshot_retention`` ago (expiring
those first), and ``after_delete`` to expire every snapshot that still lists a deleted
segment. A held input that leaves the bucket before compaction deletes it (a lifecycle
rule, an operator) takes the snapshots listing it with it at the next step
(``expire_held_gone``). The hooks never create a table: the table is the one of the
inputs' incarnation (``hook_table``), and a topic ``[catalog]`` does not select, or whose
table does not exist, has none (deletes go ahead). ``SnapshotHistory`` is a part of
``ArchiveCommitter``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from replicator.archive.iceberg import CatalogError, CommitConflict, IcebergTable
from replicator.archive.metrics import ArchiveMetrics
from replicator.archive.naming import TableIdentity, incarnation_id, live_location
from replicator.archive.trims import collect_trims
from replicator.core.clock import Clock
from replicator.core.errors import ObjectNotFound, ReplicatorError
from replicator.core.keys import BASE_INCARNATION, SegmentKey
from replicator.core.settings import Settings
from replicator.core.settings.catalog import CatalogSettings
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

KEEP_SNAPSHOTS = 100
"""Snapshots a table keeps beyond ``catalog.snapshot_retention`` (time travel within them;
older ones are expired). Those current within the retention are kept whatever their count.
"""

ORPHAN_GRACE = timedelta(minutes=30)
"""Metadata files no snapshot refers to are deleted once this old: younger ones may belong
to a commit in flight."""


@dataclass
class SyncResult:
    """What one step did to one table."""

    table: str
    added: int = 0
    removed_covered: int = 0
    removed_gone: int = 0
    snapshot_id: int | None = None
    expired: int = 0
    conflicts: int = 0
    not_parquet: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    deleting: list[str] = field(default_factory=list)
    """Table paths of the segments about to be deleted (a compaction swap)."""
    quarantined: list[str] = field(default_factory=list)
    """Keys of Parquet objects the table's schema cannot list (ERROR, metric)."""
    kept: list[str] = field(default_factory=list)
    """Keys of ``deleting`` the table keeps (no listed file covers them): not to delete."""
    allowed: list[str] | None = None
    """Keys of ``deleting`` that ``deletable`` let go (``None``: not asked)."""
    location: str = BASE_INCARNATION
    """The incarnation (location label) of the segments of ``deleting`` (a swap): the
    hooks after it choose the same table by it."""

    @property
    def committed(self) -> bool:
        return bool(self.added or self.removed_covered or self.removed_gone)


class SnapshotHistory:
    """Snapshot expiry and compaction's hooks, over ``ArchiveCommitter``'s tables."""

    settings: Settings
    cfg: CatalogSettings
    clock: Clock
    store: ObjectStore
    m: ArchiveMetrics
    _bucket: str
    _lock: threading.Lock
    _manifest_lists: dict[str, list[str]]
    """Manifests of each manifest list read (immutable files), for ``clean_metadata``."""
    _removed: dict[tuple[str, int], frozenset[str]]
    """Per table and snapshot, the files it took out of its parent (``held_snapshots``)."""

    def url(self, key: SegmentKey) -> str:   # ArchiveCommitter's
        raise NotImplementedError

    def key_of(self, path: str) -> SegmentKey | None:   # ArchiveCommitter's
        raise NotImplementedError

    def table(self, region: str, topic: str, *, create: bool = True,
              over_metadata: bool = False, ident: TableIdentity | None = None
              ) -> IcebergTable | None:   # ArchiveCommitter's
        raise NotImplementedError

    def sync(self, region: str, topic: str, *, partition: int | None = None,
             deleting: Iterable[SegmentKey] = (), expire: bool = True,
             table: IcebergTable | None = None, location: str | None = None
             ) -> SyncResult:   # ArchiveCommitter's
        raise NotImplementedError

    def topics(self) -> list[tuple[str, str]]:   # ArchiveCommitter's
        raise NotImplementedError

    def _per_incarnation(self) -> bool:
        return "{incarnation}" in self.cfg.table_name

    def hook_table(self, region: str, topic: str, location: str) -> IcebergTable | None:
        """The table compaction's hooks keep in step with the deletes of a topic's segments
        at ``location`` (an incarnation's label), never created: with ``{incarnation}`` in
        ``catalog.table_name`` that incarnation's table, else the topic's one table (which
        follows the live incarnation). ``None``: no table lists them (a topic that
        ``[catalog]`` does not select, ``topics``, or whose table does not exist yet).
        """
        if (region, topic) not in self.topics():
            return None
        ident = None
        if self._per_incarnation():
            ident = TableIdentity(region, topic, incarnation_id(
                self.store, self.settings.s3.prefix, region, topic, location))
        return self.table(region, topic, create=False, ident=ident)

    def expire_removed(self, table: IcebergTable, removed: Iterable[str]) -> int:
        """After a step removed files (gone from the bucket, or covered by an output whose
        inputs' deletes may arrive unseen): expire every kept snapshot (of any lineage,
        the current one excepted) that lists one, then those the count cap lets go
        (``_expire_beyond``); a snapshot held for ``catalog.snapshot_retention`` that lists
        none of them stays. Then delete the metadata files no kept snapshot refers to.
        """
        current = table.snapshot_id
        n = self._expire_ids(table, [s for s in table.listing(removed) if s != current])
        return n + self._expire_beyond(table)

    def _expire_ids(self, table: IcebergTable, ids: list[int]) -> int:
        try:
            n = table.expire(ids)
        except CommitConflict as e:
            # A newer commit exists; the snapshots listing deleted files are expired by the
            # next expiry, which selects them by lineage.
            log.info("%s: snapshot expiry met a concurrent commit (%s); later", table.name, e)
            return 0
        if n:
            try:
                self.clean_metadata(table)
            except ReplicatorError as e:
                log.warning("%s: metadata files of expired snapshots not deleted (%s); the "
                            "next expiry tries again", table.name, e)
            self._clean_trims_logged(table)
        return n

    def _clean_trims_logged(self, table: IcebergTable) -> None:
        try:
            self.clean_trims(table)
        except ReplicatorError as e:
            log.warning("%s: trimmed copies no snapshot lists not deleted (%s); the next "
                        "expiry tries again", table.name, e)

    def clean_trims(self, table: IcebergTable) -> int:
        """Delete the trimmed copies no snapshot the table keeps lists, older than
        ``ORPHAN_GRACE`` (``archive.trims.collect_trims``); their count. Called after each
        expiry: only then can a copy the table listed become unlisted by every snapshot.
        """
        return collect_trims(table, self.clock() - ORPHAN_GRACE)

    def clean_metadata(self, table: IcebergTable) -> int:
        """Delete the files under the table's ``metadata/`` that its state does not refer
        to and that are older than ``ORPHAN_GRACE`` (manifests of expired snapshots, files
        of commits that failed); only when the table lives in this bucket. Their count.
        """
        head = f"s3://{self._bucket}/"
        location = table.location + "/metadata/"
        if not location.startswith(head):
            return 0
        table.refresh()
        with self._lock:
            lists = dict(self._manifest_lists)
        used = table.metadata_in_use(lists)
        with self._lock:
            # Only the lists the table still keeps (expired ones are never read again).
            self._manifest_lists.update(lists)
            for gone in [m for m in self._manifest_lists if m.startswith(location)
                         and m not in used]:
                del self._manifest_lists[gone]
        cutoff = self.clock() - ORPHAN_GRACE
        stale = [o.key for o in self.store.list(location[len(head):])
                 if head + o.key not in used and o.last_modified < cutoff]
        if stale:
            self.store.delete_many(stale)
            log.info("%s: deleted %d metadata files no snapshot refers to", table.name,
                     len(stale))
        return len(stale)

    def _expire_beyond(self, table: IcebergTable) -> int:
        """Expire the snapshots beyond the newest ``KEEP_SNAPSHOTS`` (commits that only add
        files would otherwise pile up, one per interval), but none that was current within
        ``catalog.snapshot_retention`` (measured as ``deletable`` does: by the commit time
        of the next newer snapshot): the snapshot before a compaction swap stays readable
        for the retention. Every kept snapshot counts (those a rollback left, branch and
        tag heads), newest first by commit time; never the current one.
        """
        snaps = table.by_time()
        if len(snaps) <= KEEP_SNAPSHOTS:
            return 0
        cutoff = self.clock() - self.cfg.snapshot_retention
        for i in range(KEEP_SNAPSHOTS, len(snaps)):
            if snaps[i - 1].committed_at <= cutoff:   # superseded before the retention
                return self._expire_ids(table, [s.snapshot_id for s in snaps[i:]
                                                if not s.current])
        return 0

    def swap(self, region: str, topic: str, deleting: Iterable[SegmentKey]
             ) -> SyncResult | None:
        """Compaction's hook, called before ``deleting`` (segments of one incarnation) is
        deleted: one snapshot of their table (``hook_table``) lists the outputs (present in
        the bucket) instead of the inputs. When it returns, no snapshot the table keeps
        lists a key of ``deleting`` except those older than the swap, which
        ``after_delete`` expires. ``None``: no table (nothing to keep consistent).

        Raises:
            CatalogError / StorageError: the swap did not commit; delete nothing.
        """
        keys = list(deleting)
        locations = {k.incarnation for k in keys} or {BASE_INCARNATION}
        if len(locations) > 1:
            raise CatalogError(f"{region}/{topic}: one swap of segments of several "
                               f"incarnations ({sorted(locations)}); swap each on its own")
        location = locations.pop()
        table = self.hook_table(region, topic, location)
        if table is None:
            return None
        if self._per_incarnation():
            result = self.sync(region, topic, deleting=keys, expire=False, table=table,
                               location=location)
        elif location == live_location(self.store, self.settings.s3.prefix, region, topic):
            result = self.sync(region, topic, deleting=keys, expire=False, table=table)
        else:
            # An earlier incarnation's segments, and the one table follows the live one: it
            # lists none of them once a step ran since the topic was created again, and
            # this step is one (they leave it as gone). Older snapshots may list them:
            # ``deletable`` holds them for catalog.snapshot_retention as any swapped out.
            result = self.sync(region, topic, expire=False, table=table)
            result.deleting = sorted(self.url(k) for k in keys)
        result.location = location
        return result

    def deletable(self, region: str, topic: str, swap: SyncResult) -> set[str]:
        """The keys of the swap's ``deleting`` compaction may delete now: no snapshot of
        the table lists them, or the snapshot that took them out of the table is older than
        ``catalog.snapshot_retention``. The snapshots listing those are expired first
        (Iceberg's order: a snapshot never outlives a file it lists).
        """
        head = f"s3://{self._bucket}/"
        kept = set(swap.kept)
        keys = {p[len(head):]: p for p in swap.deleting if p[len(head):] not in kept}
        if not keys:
            return set()
        table = self.hook_table(region, topic, swap.location)
        if table is None:   # dropped or no longer selected since the swap: a later run
            swap.allowed = []
            return set()
        removals = table.removals(keys.values())
        cutoff = self.clock() - self.cfg.snapshot_retention
        ok = set()
        listing: set[int] = set()
        waiting = 0
        for key, path in keys.items():
            if path not in removals:
                ok.add(key)
                continue
            sid, left = removals[path]
            if left is None or left > cutoff:
                waiting += 1
                continue
            ok.add(key)
            listing.add(sid)
        # Every kept snapshot listing a key to delete goes (any lineage, branch or tag).
        doomed = table.listing(keys[k] for k in ok if keys[k] in removals) if listing else []
        if waiting:
            log.info("%s: %d segments swapped out of the table stay until their snapshots "
                     "are older than catalog.snapshot_retention (%s)", table.name, waiting,
                     self.cfg.snapshot_retention)
        if doomed:
            try:
                table.expire(doomed)
            except CatalogError as e:
                log.warning("%s: snapshots listing segments to delete not expired (%s); they "
                            "are deleted by a later run", table.name, e)
                ok = {k for k in ok if keys[k] not in removals}
            else:
                self._clean_trims_logged(table)
        swap.allowed = sorted(ok)
        return ok

    def after_delete(self, region: str, topic: str, swap: SyncResult) -> int:
        """Expire every kept snapshot that lists a segment of the swap's ``deleting`` (of
        any lineage, branch or tag). Selected by what the snapshots list, so the snapshots
        of a swap an earlier run committed before it died (its deletes done by this run)
        are expired too.
        """
        paths = swap.deleting if swap.allowed is None else [self.url(SegmentKey.parse(key))
                                                            for key in swap.allowed]
        if not paths:   # (segments held for catalog.snapshot_retention keep their history)
            return 0
        table = self.hook_table(region, topic, swap.location)
        if table is None:
            return 0
        doomed = table.listing(paths)
        if not doomed:
            return 0
        if table.snapshot_id in doomed:
            log.error("%s: the current snapshot lists segments deleted by compaction; the "
                      "next step removes them", table.name)
        return self._expire_ids(table, [s for s in doomed if s != table.snapshot_id])

    def held_snapshots(self, table: IcebergTable) -> dict[str, tuple[int, str]]:
        """The files a kept snapshot (of any lineage) lists and the current one does not
        (compaction's inputs held for ``catalog.snapshot_retention``: a ``replace``;
        segments a swap removed as gone: a ``delete``), each with the newest
        snapshot listing it and the operation that removed it (``replace`` when the
        snapshot that removed it is not kept). What each snapshot lists is read once per
        process (``archive.iceberg_listing``).
        """
        current = table.snapshot_id
        if current is None:
            return {}
        snaps = table.by_time()
        kept = {s.snapshot_id for s in snaps}
        ops: dict[str, str] = {}
        for snap in snaps:   # what each snapshot took out of its (kept) parent
            if snap.parent_id not in kept or snap.operation == "append":
                continue
            assert snap.parent_id is not None
            for path in self._removed_by(table, snap.parent_id, snap.snapshot_id):
                ops.setdefault(path, snap.operation)
        out = {path: (sid, ops.get(path, "replace"))
               for path, (sid, _) in table.removals(table.held()).items()}
        with self._lock:
            for key in [k for k in self._removed if k[0] == table.name and k[1] not in kept]:
                del self._removed[key]
        return out

    def _removed_by(self, table: IcebergTable, parent: int, sid: int) -> frozenset[str]:
        with self._lock:
            known = self._removed.get((table.name, sid))
        if known is None:
            known = table.paths(parent) - table.paths(sid)
            with self._lock:
                self._removed[(table.name, sid)] = known
        return known

    def expire_held_gone(self, table: IcebergTable, region: str, topic: str,
                         listed: Iterable[SegmentKey], partition: int | None) -> int:
        """After a step: expire at once the snapshots listing a held segment (swapped out,
        kept for ``catalog.snapshot_retention``) that has left the bucket before compaction
        deleted it (a lifecycle rule, an operator), so no kept snapshot lists a missing
        object (ERROR naming the segments and the snapshots, counted). ``listed``: the
        step's listing of the topic (of ``partition`` only, when given); a held segment
        not in it is confirmed missing by a HEAD. The number of snapshots expired; errors
        are logged and left to the next step.
        """
        try:
            return self._expire_held_gone(table, region, topic, listed, partition)
        except ReplicatorError as e:
            log.warning("%s: segments held for catalog.snapshot_retention not checked (%s); "
                        "the next step checks them", table.name, e)
            return 0

    def _expire_held_gone(self, table: IcebergTable, region: str, topic: str,
                          listed: Iterable[SegmentKey], partition: int | None) -> int:
        held = self.held_snapshots(table)
        if not held:
            return 0
        present = set(listed)
        missing: list[str] = []
        for path in held:
            k = self.key_of(path)
            if k is None or k in present or (partition is not None
                                             and k.partition != partition):
                continue   # a trimmed copy (the table's own file), or in the listing
            try:
                self.store.head(k.to_key())
            except ObjectNotFound:
                missing.append(path)
        if not missing:
            return 0
        # Compaction deletes a held segment only after expiring the snapshots listing it:
        # what the table keeps now tells a lifecycle delete from compaction's own.
        table.refresh()
        held = self.held_snapshots(table)
        gone = sorted(p for p in missing if p in held)
        if not gone:
            return 0
        current = table.snapshot_id
        doomed = [s for s in table.listing(gone) if s != current]
        if not doomed:
            return 0
        newest = doomed[0]
        # Segments a compaction swap removed as gone (logged then) only wait for this
        # expiry, which the swap leaves to the next step; held ones should never be gone.
        lost = [p for p in gone if held[p][1] != "delete"]
        snapshots = ", ".join(str(s) for s in doomed[:10])
        if lost:
            self.m.held_gone.labels(region, topic).inc(len(lost))
            log.error("%s: %d segments swapped out of the table and held for "
                      "catalog.snapshot_retention left the bucket before it (a lifecycle rule "
                      "or an operator): %s; the %d snapshots up to %d that list them are "
                      "expired now (no kept snapshot may list a missing object): %s",
                      table.name, len(lost), ", ".join(lost[:5]), len(doomed), newest,
                      snapshots)
        else:
            log.info("%s: the %d snapshots up to %d list segments a compaction swap removed "
                     "as gone: expired now: %s", table.name, len(doomed), newest, snapshots)
        return self._expire_ids(table, doomed)
