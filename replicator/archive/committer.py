"""Keeps each topic's Iceberg table in step with the segments in the bucket.

``sync`` is one step for one topic: load the table, list the topic's segments (after the
load), read the Parquet footers of the segments to add, and commit the difference in one
snapshot (``archive.plan``). It is idempotent (a file already in the table is never added
twice) and safe against every other writer: the commit names the snapshot it was planned
on, a concurrent commit makes the catalog refuse it, and the step starts over from the new
snapshot. Two committers at once are therefore correct, only wasteful; ``archive.follow``
elects one per region with a lease.

Compaction calls ``swap`` before it deletes inputs: the same step with the inputs treated
as gone, so the table lists the output instead of its inputs in one snapshot before any
input object is deleted. A commit that removed files is followed by the expiry of every
older snapshot (``expire``): no snapshot kept points at a deleted object
(``archive.snapshot_history``). ``sync_all`` steps ``catalog.sync_workers`` tables at once;
``archive.step_memory`` keeps what a step needs of the last one to plan only what changed.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from replicator.archive.footers import read_parquet_footer
from replicator.archive.iceberg import (
    ENFORCED_PROPERTIES,
    CatalogError,
    CommitConflict,
    IcebergTable,
    NewFile,
)
from replicator.archive.iceberg_catalog import IcebergCatalog
from replicator.archive.listing import listed_since
from replicator.archive.metrics import ArchiveMetrics
from replicator.archive.naming import (
    TableIdentity,
    live_identity,
    live_location,
    read_incarnation,
    table_identifier,
)
from replicator.archive.ownership import (
    ForeignTable,
    ForeignWrites,
    Source,
    check_owner,
    collisions,
)
from replicator.archive.plan import Piece, TablePlan, holds, plan_table, ranges_by_partition
from replicator.archive.segment_fit import misfit
from replicator.archive.snapshot_history import (
    KEEP_SNAPSHOTS,
    ORPHAN_GRACE,
    SnapshotHistory,
    SyncResult,
)
from replicator.archive.stale_tables import adopt, refuse_stale
from replicator.archive.step_memory import Remembered, StepMemory, affected
from replicator.archive.trims import CopyUnfit, copy_piece, parse_trim_path
from replicator.core.clock import Clock, utc_now
from replicator.core.errors import ConfigError, ObjectNotFound, ReplicatorError, SegmentCorrupt
from replicator.core.keys import (
    BASE_INCARNATION,
    SegmentKey,
    incarnations_prefix,
    topic_prefix,
)
from replicator.core.metrics import Metrics
from replicator.core.settings import Settings
from replicator.core.storage import ObjectInfo, ObjectStore
from replicator.core.topic_sets import region_topics

__all__ = ["KEEP_SNAPSHOTS", "MAX_ATTEMPTS", "ORPHAN_GRACE", "ArchiveCommitter", "SyncResult"]

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
"""Plans of one step before it gives up (each conflict means another writer progressed)."""



class ArchiveCommitter(SnapshotHistory):
    """Tables of one bucket's topics (``[catalog]``).

    Args:
        settings: settings with ``[catalog]`` (``enabled`` is not checked here).
        store: the bucket.
        catalog: the Iceberg catalog (default: ``IcebergCatalog(settings)``).
        metrics: metric registry (default: a new one).
        clock: the time ``archive_last_sync_timestamp_seconds`` records.
    """

    def __init__(self, settings: Settings, store: ObjectStore,
                 catalog: IcebergCatalog | None = None, metrics: Metrics | None = None,
                 clock: Clock = utc_now) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.m = ArchiveMetrics(self.metrics)
        self.clock = clock
        self.cfg = settings.catalog
        self.store = store
        self.catalog = catalog or IcebergCatalog(settings)
        self._not_parquet: set[SegmentKey] = set()
        self._landed: dict[SegmentKey, datetime] = {}
        self._quarantined: set[SegmentKey] = set()
        self._sizes: dict[SegmentKey, int] = {}
        self._steps = threading.local()   # what one step keeps while it runs: _trims
        self._bucket = getattr(store, "bucket", "bucket")
        self._in_full_only = False      # the store refused to list from a key
        self._lock = threading.Lock()
        self._memory = StepMemory()
        self._manifest_lists: dict[str, list[str]] = {}
        self._removed: dict[tuple[str, int], frozenset[str]] = {}
        self._pending: dict[tuple[str, str], datetime] = {}
        """Per table: when the oldest segment the last plan would add landed."""

    @property
    def _trims(self) -> dict[Piece, NewFile]:
        """The trimmed copies this step wrote (by the piece they hold), kept across its
        attempts and cleared at its start and end. Per step, not per committer: a step runs
        on one thread from start to end, and the ``catalog.sync_workers`` steps of other
        tables running at once must not clear a copy between its write and its use.
        """
        trims: dict[Piece, NewFile] | None = getattr(self._steps, "trims", None)
        if trims is None:
            trims = self._steps.trims = {}
        return trims

    # --- naming -------------------------------------------------------------------------

    def url(self, key: SegmentKey) -> str:
        """A segment's path in its table."""
        return f"s3://{self._bucket}/{key.to_key()}"

    def key_of(self, path: str) -> SegmentKey | None:
        """The segment a table path names (``None``: not a segment of this bucket)."""
        head = f"s3://{self._bucket}/"
        return SegmentKey.try_parse(path[len(head):]) if path.startswith(head) else None

    def piece_of(self, table: IcebergTable, path: str) -> Piece | None:
        """The positions a table path holds: a whole segment of this bucket, or a trimmed
        copy of one (``archive.trims``); ``None``: neither.
        """
        k = self.key_of(path)
        return Piece.of(k) if k is not None else parse_trim_path(table.location, path)

    def identity(self, region: str, topic: str) -> TableIdentity:
        return TableIdentity(region, topic,
                             read_incarnation(self.store, self.settings.s3.prefix, region,
                                              topic))

    def identifier(self, ident: TableIdentity) -> tuple[str, ...]:
        return table_identifier(self.cfg, ident)

    def topics(self) -> list[tuple[str, str]]:
        """(region, topic) pairs that get tables: ``[catalog]``'s, or every topic found."""
        prefix = self.settings.s3.prefix
        out: list[tuple[str, str]] = []
        for region in self.cfg.regions or [self.settings.region]:
            if self.cfg.topics:
                out.extend((region, t) for t in self.cfg.topics)
                continue
            # Every folder under the region whose name is a topic name is a topic's (one
            # may start with "_": `_audit`). The replicator's own folders (_groups,
            # _heartbeats, _incarnations: core/keys.py) are under each topic's, and the
            # region's lease (_archive.lock) is an object.
            out.extend((region, t) for t in region_topics(self.store, prefix, region))
        return sorted(out)

    def source(self, ident: TableIdentity) -> Source:
        """What the table of ``ident`` lists (its stamp, ``archive.ownership``)."""
        return Source(self._bucket, self.settings.s3.prefix, ident.region, ident.topic,
                      ident.incarnation)

    def table(self, region: str, topic: str, *, create: bool = True,
              over_metadata: bool = False, ident: TableIdentity | None = None
              ) -> IcebergTable | None:
        """The topic's table (created when missing, unless ``create`` is false), checked to
        be this source's (``ident``: of that incarnation; default the live one's).

        Raises:
            ForeignTable: the identifier holds a table stamped for another source.
        """
        ident = ident or self.identity(region, topic)
        identifier = self.identifier(ident)
        source = self.source(ident)
        table = (self.catalog.create(identifier, source.stamp(), over_metadata=over_metadata)
                 if create else self.catalog.load(identifier))
        if table is None:
            return None
        try:
            updates = check_owner(table.properties, source,
                                  per_incarnation="{incarnation}" in self.cfg.table_name)
        except ForeignTable as e:
            # Logged at ERROR by the caller (sync_all, compaction's swap, the CLI).
            self.m.refused.labels(region, topic, "foreign-table").inc()
            raise ForeignTable(f"{region}/{topic}: table {table.name}: {e}") from e
        for name, value in ENFORCED_PROPERTIES.items() if create else ():
            # Engines must never delete segments (expire_snapshots, remove_orphan_files,
            # VACUUM), nor read old segments vectorized: re-asserted at every step.
            have = table.properties.get(name)
            if have != value:
                if have is not None:
                    log.warning("%s: %s was %r; set to %r again (iceberg.py, table "
                                "properties)", table.name, name, have, value)
                updates[name] = value
        if updates and create:
            table.set_properties(updates)
        return table

    def check_authored(self, table: IcebergTable, region: str, topic: str,
                       files: Iterable[str]) -> None:
        """Refuse a table another engine committed to: a snapshot since the newest of this
        replicator's, or a file that is not a segment of the topic (a row-level DELETE,
        OPTIMIZE, an append). Re-planning would undo the write (rows deleted come back, rows
        kept are listed twice); the table is left as it is for an operator.

        Raises:
            ForeignWrites: with the snapshots and files (counted here).
        """
        snaps = table.foreign_snapshots()
        odd = sorted(p for p in files if not self._own_path(table, p, region, topic))
        if not snaps and not odd:
            return
        self.m.refused.labels(region, topic, "foreign-write").inc()
        what = ", ".join(f"{s.snapshot_id} ({s.operation})" for s in snaps[:5])
        msg = (f"{table.name}: written by another engine (snapshots {what or 'none'}; files "
               f"that are not segments of {region}/{topic}: {odd[:5] or 'none'}); left as "
               "it is: tables are read-only to other engines. Roll the table back to its "
               "last replicator snapshot (drop a branch another engine wrote), or rebuild "
               "it (replicator archive rebuild --drop)")
        raise ForeignWrites(msg)   # logged at ERROR by the caller

    def _own_path(self, table: IcebergTable, path: str, region: str, topic: str) -> bool:
        piece = self.piece_of(table, path)
        k = None if piece is None else piece.key
        return k is not None and (k.prefix, k.region, k.topic) == (
            self.settings.s3.prefix, region, topic)

    def check_mapping(self) -> None:
        """At start: every source has a table of its own (the identifier mapping is
        one-to-one, and no existing table is stamped for another source).

        Raises:
            ConfigError: naming both sources (key ``catalog.table_name``).
        """
        idents = [self.identity(region, topic) for region, topic in self.topics()]
        pairs = [(self.source(i), self.identifier(i)) for i in idents]
        clashes = collisions(pairs)
        if clashes:
            a, b, ident = clashes[0]
            raise ConfigError("catalog.table_name", (
                f"{a} and {b} both map to table {'.'.join(ident)} (names are lowercased "
                "and characters outside [a-z0-9_] become _): name {region} in the template "
                "or list one of them in catalog.topics") + (
                f"; {len(clashes) - 1} more such pair(s)" if len(clashes) > 1 else ""))
        for source, ident in pairs:
            table = self.catalog.load(ident)
            if table is None:
                continue
            try:
                check_owner(table.properties, source,
                            per_incarnation="{incarnation}" in self.cfg.table_name)
            except ForeignTable as e:
                raise ConfigError("catalog.table_name",
                                  f"table {'.'.join(ident)} for {source}: {e}") from e
        refuse_stale(self.catalog, dict(pairs),
                     per_incarnation="{incarnation}" in self.cfg.table_name,
                     namespace=tuple(self.cfg.namespace.split(".")))

    def adopt(self, region: str, topic: str, old: tuple[str, ...]) -> IcebergTable:
        """Rename the topic's table at ``old`` to the identifier the settings render
        (``archive.stale_tables.adopt``).
        """
        ident = self.identity(region, topic)
        return adopt(self.catalog, old, self.identifier(ident), self.source(ident),
                     per_incarnation="{incarnation}" in self.cfg.table_name)

    # --- one step -----------------------------------------------------------------------

    def _listing(self, region: str, topic: str, partition: int | None,
                 seen: set[SegmentKey], parsed: dict[str, SegmentKey],
                 known: dict[str, SegmentKey], objects: dict[str, ObjectInfo],
                 prior: dict[str, ObjectInfo] | None = None, location: str | None = None
                 ) -> tuple[list[SegmentKey], bool]:
        """The topic's segments in the bucket (``parsed``: their keys by object key, and
        ``objects`` their listing; ``known``: those of an earlier listing, not parsed
        again; ``location``: of that incarnation, default the live one), and whether they
        were listed in full. With ``prior`` (an earlier listing of the whole topic), only
        what lies after each folder's last key in it is listed, unless a folder's first or
        last key is gone (``archive.listing``).
        """
        prefix = topic_prefix(self.settings.s3.prefix, region, topic)
        # One incarnation per table: the live one's location (a topic deleted and created
        # again has its later incarnations under _incarnations/, docs/architecture.md).
        live = location if location is not None else live_location(
            self.store, self.settings.s3.prefix, region, topic)
        if partition is not None:
            if live != BASE_INCARNATION:
                prefix = f"{incarnations_prefix(self.settings.s3.prefix, region, topic)}{live}/"
            prefix = f"{prefix}{partition}/"
        keys = []
        new = None if prior is None else self._listed_since(prefix, prior)
        infos: Iterable[ObjectInfo] = (
            self.store.list(prefix) if prior is None or new is None
            else itertools.chain(prior.values(), new))
        for info in infos:
            k = known.get(info.key) or SegmentKey.try_parse(info.key)
            if k is not None:
                parsed[info.key] = k
                objects[info.key] = info
            if k is not None and k.prefix == self.settings.s3.prefix \
                    and k.region == region and k.topic == topic and k.incarnation == live:
                keys.append(k)
                seen.add(k)
                self._sizes[k] = info.size
                self._landed[k] = info.last_modified
        return keys, new is None

    def _listed_since(self, prefix: str, prior: dict[str, ObjectInfo]
                      ) -> list[ObjectInfo] | None:
        """``archive.listing.listed_since``, or ``None`` (list in full) on a store that
        refuses to list from a key: S3 directory buckets have no ``StartAfter``, and some
        S3-compatible stores neither. The first refusal is a WARNING and every later step
        lists in full; a failed full listing fails the step as before.
        """
        if self._in_full_only:
            return None
        try:
            return listed_since(self.store, prefix, prior)
        except ReplicatorError as e:
            self._in_full_only = True
            log.warning("listing s3://%s/%s from a key (StartAfter) failed: %s; this "
                        "committer lists topics in full at every step from now on "
                        "(docs/architecture.md, \"Listing only what follows\")",
                        self._bucket, prefix, e)
            return None

    def _new_files(self, table: IcebergTable, keys: list[SegmentKey], result: SyncResult
                   ) -> tuple[list[NewFile], set[SegmentKey]]:
        """Footers of ``keys``; the keys that cannot be data files of ``table`` are
        returned apart (quarantined one by one: the others are committed).
        """
        files, skipped = [], set()
        for k in keys:
            try:
                footer = read_parquet_footer(self.store, k.to_key(), self._sizes[k])
            except ObjectNotFound:
                skipped.add(k)   # deleted since the listing: the next step removes it
                continue
            except SegmentCorrupt as e:
                self._unreadable(k, e, result)
                skipped.add(k)
                continue
            if footer is None:
                if k not in self._not_parquet:
                    self.m.not_in_table.labels(k.region, k.topic, "not-parquet").inc()
                    log.warning("%s is not a Parquet segment: its records are not in the "
                                "table (only Parquet segments can be Iceberg data files)", k)
                self._not_parquet.add(k)
                result.not_parquet.append(k.to_key())
                skipped.add(k)
                continue
            f = NewFile(self.url(k), self._sizes[k], k.partition, footer)
            problem, reason = table.unfit(f), "schema"
            if problem is None:
                # Rows that are not the key's range would be listed as the key says
                # (archive.segment_fit): refused as ingress and compaction refuse them.
                problem, reason = misfit(footer, k), "range"
            if problem is not None:
                self._quarantine(k, problem, reason, result)
                skipped.add(k)
                continue
            files.append(f)
        return files, skipped

    def _quarantine(self, k: SegmentKey, problem: str, reason: str,
                    result: SyncResult) -> None:
        """A segment left out of the table on its own (ERROR; counted once per key)."""
        if k not in self._quarantined:
            self.m.not_in_table.labels(k.region, k.topic, reason).inc()
        log.error("%s: quarantined, not added to the table (its records are not in it; the "
                  "others are): %s", k, problem)
        self._quarantined.add(k)
        result.quarantined.append(k.to_key())

    def _unreadable(self, k: SegmentKey, e: SegmentCorrupt, result: SyncResult) -> None:
        """A segment whose records cannot be read: left out of the table (ERROR, counted)."""
        log.error("%s: not added to the table: %s", k, e)
        self.m.not_in_table.labels(k.region, k.topic, "unreadable").inc()
        result.unreadable.append(k.to_key())

    def sync(self, region: str, topic: str, *, partition: int | None = None,
             deleting: Iterable[SegmentKey] = (), expire: bool = True,
             table: IcebergTable | None = None, location: str | None = None) -> SyncResult:
        """Make the topic's table list the visible segments (``archive.plan``).

        Args:
            region: source region.
            topic: source topic.
            partition: only this partition's segments are considered (the others' files in
                the table stay as they are).
            deleting: segments about to be deleted: they leave the table in this commit.
            expire: expire the snapshots older than a commit that removed files.
            table: the table to step (compaction's hooks: never created here); default the
                live incarnation's, created when missing.
            location: list that incarnation's segments (its label); default the live one's.

        Raises:
            CatalogError: the catalog failed, or conflicts went on for ``MAX_ATTEMPTS``.
            StorageError: the bucket could not be listed or read.
        """
        seen: set[SegmentKey] = set()   # this step's entries in _sizes and _landed
        try:
            return self._sync(region, topic, partition, frozenset(deleting), expire, seen,
                              table, location)
        except ReplicatorError:
            self._lag_of_failed_step(region, topic)
            raise
        finally:
            for key in seen:
                self._sizes.pop(key, None)
                self._landed.pop(key, None)
            self._trims.clear()

    def _live_table(self, region: str, topic: str, table: IcebergTable | None,
                    location: str | None) -> tuple[IcebergTable, str | None]:
        """The table a step commits to and the location it lists: ``table`` and
        ``location`` when given (compaction's hooks); else the live incarnation's table
        (created when missing) and location (unless ``location``), from one read of
        ``_topic.json``, kept for every attempt of the step: a topic recreated in between
        is the next step's (``naming.live_identity``).
        """
        if table is not None:
            return table, location
        topic_id, live = live_identity(self.store, self.settings.s3.prefix, region, topic)
        table = self.table(region, topic, ident=TableIdentity(region, topic, topic_id))
        assert table is not None
        return table, live if location is None else location

    def _sync(self, region: str, topic: str, partition: int | None,
              deleting: frozenset[SegmentKey], expire: bool, seen: set[SegmentKey],
              table: IcebergTable | None = None, location: str | None = None) -> SyncResult:
        table, location = self._live_table(region, topic, table, location)
        result = SyncResult(table.name, deleting=sorted(self.url(k) for k in deleting))
        self._trims.clear()
        for _attempt in range(MAX_ATTEMPTS):
            mem = self._memory.get(table.name, table.snapshot_id)
            files = self._files(table, region, topic, mem)
            paths = list(files)
            if partition is not None:
                paths = [p for p in paths if files[p].partition == partition]
            parsed: dict[str, SegmentKey] = {}
            objects: dict[str, ObjectInfo] = {}
            listed, listed_in_full = self._step_listing(
                region, topic, partition, seen, parsed, objects, mem, deleting, location)
            if mem is not None and mem.listing is not None and not deleting \
                    and partition is None and not self._has_trims(table, paths):
                # Only what changed since the step the table matched (step_memory.py).
                near = affected(mem.listing.symmetric_difference(listed),
                                [*listed, *files.values()])
                plan, new, removing = self._plan(
                    table, [p for p in paths if files[p] in near],
                    [k for k in listed if k in near], deleting, result)
            else:
                plan, new, removing = self._plan(table, paths, listed, deleting, result)
            self._note_pending(region, topic, plan)
            try:
                snapshot = self._commit(table, plan, new, frozenset(removing))
            except CommitConflict as e:
                result.conflicts += 1
                self.m.conflicts.labels(region, topic).inc()
                log.info("%s: another writer committed first (%s); planning again",
                         table.name, e)
                table.refresh()
                continue
            except CatalogError:
                # Outcome unknown: the next step re-plans from what the catalog holds.
                raise
            result.added += len(plan.add) + len(plan.trim)
            result.removed_covered += len(plan.remove_covered)
            result.removed_gone += len(plan.remove_gone)
            result.snapshot_id = snapshot
            self._remember(table, files, plan, new, parsed, listed if (
                partition is None and not deleting and not result.kept
                and not result.quarantined and not result.unreadable
                and not result.not_parquet) else None, objects, listed_in_full)
            self._count(region, topic, plan, deleting, snapshot)
            if plan.remove_gone:
                log.warning("%s: %d files left the bucket without compaction (a lifecycle "
                            "rule, retention or an operator); removed from the table: %s",
                            table.name, len(plan.remove_gone),
                            ", ".join(plan.remove_gone[:5]))
            if snapshot is not None and expire:
                # Files gone from the bucket: no snapshot may list them any more. Files
                # covered here (not by a swap: an output replicated from the region that
                # compacted) are deleted there, and their deletes may reach this bucket
                # without any step of this table seeing them: expire at once too.
                # Compaction's own swaps keep history (``deletable``, the retention).
                if plan.remove_gone or plan.remove_covered:
                    result.expired = self.expire_removed(
                        table, [*plan.remove_gone, *plan.remove_covered])
                else:
                    result.expired = self._expire_beyond(table)
            if expire:   # (a swap leaves expiry to compaction's hooks and the next step)
                result.expired += self.expire_held_gone(table, region, topic, listed,
                                                        partition)
            return result
        raise CatalogError(f"{table.name}: {MAX_ATTEMPTS} commits in a row met a concurrent "
                           "commit; the next step tries again")

    def _step_listing(self, region: str, topic: str, partition: int | None,
                      seen: set[SegmentKey], parsed: dict[str, SegmentKey],
                      objects: dict[str, ObjectInfo], mem: Remembered | None,
                      deleting: frozenset[SegmentKey], location: str | None
                      ) -> tuple[list[SegmentKey], datetime]:
        """A step's listing (``_listing``: in full, or what follows the remembered one,
        ``_prior_listing``) and when the full listing it stands on started.
        """
        started = self.clock()
        prior, listed_in_full = self._prior_listing(mem, partition, deleting, started)
        listed, full = self._listing(region, topic, partition, seen, parsed,
                                     mem.parsed if mem else {}, objects, prior, location)
        return listed, started if full else listed_in_full

    def _prior_listing(self, mem: Remembered | None, partition: int | None,
                       deleting: frozenset[SegmentKey], now: datetime
                       ) -> tuple[dict[str, ObjectInfo] | None, datetime]:
        """The listing a step lists only what follows of (``None``: list in full), and
        when the full listing it comes from started. In full when the table may not match
        the last listing (``mem.listing``: the memory holds the table at this committer's
        own last commit, which listed it all), for a swap or one partition, and once
        ``catalog.full_listing_interval`` has passed: what only a full listing sees (a key
        before its folder's last one, a deletion) is seen within that.
        """
        if mem is None or mem.listing is None or mem.listed_in_full is None or deleting \
                or partition is not None \
                or not mem.listed_in_full <= now < mem.listed_in_full \
                + self.cfg.full_listing_interval:   # also when the clock stepped back
            return None, now
        return mem.objects, mem.listed_in_full

    def _files(self, table: IcebergTable, region: str, topic: str,
               mem: Remembered | None) -> dict[str, SegmentKey]:
        """The table's files, checked to be this replicator's: remembered when the table is
        still at this committer's last commit (checked when they were read), else read from
        its manifests (another writer, a restart, a compaction elsewhere).
        """
        if mem is not None:
            self.check_authored(table, region, topic, ())
            return mem.files
        paths = table.files()
        self.check_authored(table, region, topic, paths)
        return {p: piece.key for p in paths if (piece := self.piece_of(table, p)) is not None}

    def _has_trims(self, table: IcebergTable, paths: list[str]) -> bool:
        """Whether the table lists a trimmed copy: a step then plans in full (which
        positions a copy holds depends on segments beyond those overlapping a change).
        """
        # The cheap test first: a path under the table's trims (segments are not there).
        return any(parse_trim_path(table.location, p) is not None and self.key_of(p) is None
                   for p in paths)

    def _remember(self, table: IcebergTable, files: dict[str, SegmentKey], plan: TablePlan,
                  new: list[NewFile], parsed: dict[str, SegmentKey],
                  matched: list[SegmentKey] | None, objects: dict[str, ObjectInfo],
                  listed_in_full: datetime) -> None:
        """Remember the table after a step (``matched``: the listing it matches now,
        ``objects``; ``listed_in_full``: when the full listing it comes from started).
        """
        current = table.snapshot_id
        if current is None:
            self._memory.put(table.name, None)
            return
        removed = set(plan.remove)
        after = {p: k for p, k in files.items() if p not in removed}
        after.update((f.path, piece.key) for f in new
                     if (piece := self.piece_of(table, f.path)) is not None)
        self._memory.put(table.name, Remembered(
            current, after, None if matched is None else frozenset(matched), parsed,
            objects, listed_in_full))

    def _note_pending(self, region: str, topic: str, plan: TablePlan) -> None:
        landed = [self._landed[k] for k in [*plan.add, *(p.key for p in plan.trim)]
                  if k in self._landed]
        if landed:
            self._pending[(region, topic)] = min(landed)
        else:
            self._pending.pop((region, topic), None)

    def _lag_of_failed_step(self, region: str, topic: str) -> None:
        """A step that failed leaves segments out of the table: the lag is the age of the
        oldest one its last plan would have added, and grows with every failed step.
        """
        since = self._pending.get((region, topic))
        if since is not None:
            self.m.lag.labels(region, topic).set(
                max(0.0, (self.clock() - since).total_seconds()))

    def _plan(self, table: IcebergTable, paths: list[str], listed: list[SegmentKey],
              deleting: frozenset[SegmentKey], result: SyncResult
              ) -> tuple[TablePlan, list[NewFile], set[SegmentKey]]:
        """The commit, the files it adds, and the segments of ``deleting`` it removes (a
        segment no file the table lists afterwards covers is kept: ``result.kept``).
        """
        unaddable = set(self._not_parquet)
        removing = set(deleting)
        while True:
            plan = plan_table(paths, listed, url=self.url, key_of=self.key_of,
                              trim_of=lambda p: parse_trim_path(table.location, p),
                              unaddable=unaddable, deleting=removing)
            new, skipped = self._new_files(table, plan.add, result)
            trimmed, unfit = self._trimmed_files(table, plan.trim, result)
            new += trimmed
            skipped |= unfit
            unaddable |= skipped
            uncovered = self._uncovered(table, removing - unaddable, paths, plan)
            removing -= uncovered
            if not skipped and not uncovered:
                break
        kept = sorted(k.to_key() for k in deleting - removing)
        if kept:
            log.error("%s: %d segments compaction is about to delete are not covered by a "
                      "file the table lists (their output is quarantined or not Parquet): "
                      "they stay in the table and must not be deleted: %s", table.name,
                      len(kept), ", ".join(kept[:5]))
        result.kept = kept
        return plan, new, removing

    def _uncovered(self, table: IcebergTable, removing: set[SegmentKey], paths: list[str],
                   plan: TablePlan) -> set[SegmentKey]:
        """The segments of ``removing`` whose positions the files the table lists after
        ``plan`` do not all hold (segments that cannot be data files are left out by the
        caller: no table lists them either way).
        """
        if not removing:
            return set()
        gone = set(plan.remove)
        after = {piece for p in paths
                 if p not in gone and (piece := self.piece_of(table, p)) is not None}
        after |= {Piece.of(k) for k in plan.add} | set(plan.trim)
        by_part = ranges_by_partition(after)
        # A segment's own pieces never count: it is about to be deleted.
        return {d for d in removing
                if not holds([r for r in by_part.get(d.partition_ref, ()) if r[2] != d],
                              d.start, d.end)}

    def _trimmed_files(self, table: IcebergTable, pieces: list[Piece], result: SyncResult
                       ) -> tuple[list[NewFile], set[SegmentKey]]:
        """Trimmed copies of ``pieces`` written under the table's location
        (``archive.trims``); the segments that cannot be copied are returned apart (as
        ``_new_files``: they neither enter the table nor hide what they cover).
        """
        files, skipped = [], set()
        for piece in pieces:
            k = piece.key
            # A copy an attempt of this step wrote before a conflict is listed, not rewritten.
            if piece not in self._trims:
                try:
                    self._trims[piece] = copy_piece(self.store, table, piece)
                except ObjectNotFound:
                    skipped.add(k)   # deleted since the listing: the next step removes it
                    continue
                except SegmentCorrupt as e:
                    self._unreadable(k, e, result)
                    skipped.add(k)
                    continue
                except CopyUnfit as e:
                    self._quarantine(k, str(e), e.reason, result)
                    skipped.add(k)
                    continue
            files.append(self._trims[piece])
        return files, skipped

    def _count(self, region: str, topic: str, plan: TablePlan,
               deleting: frozenset[SegmentKey], snapshot: int | None) -> None:
        if snapshot is not None:
            reason = "compaction" if deleting else "sync"
            self.m.commits.labels(region, topic, reason).inc()
            self.m.files_added.labels(region, topic).inc(len(plan.add) + len(plan.trim))
            self.m.files_removed.labels(region, topic, "covered").inc(len(plan.remove_covered))
            self.m.files_removed.labels(region, topic, "gone").inc(len(plan.remove_gone))
        now = self.clock()
        self.m.last_sync.labels(region, topic).set(now.timestamp())
        # How late the table was: the oldest segment this step brought in had waited so
        # long since it landed in the bucket (0: the table was up to date).
        landed = [self._landed[k] for k in [*plan.add, *(p.key for p in plan.trim)]
                  if k in self._landed]
        lag = max(0.0, (now - min(landed)).total_seconds()) if landed and snapshot else 0.0
        self.m.lag.labels(region, topic).set(lag)
        self._pending.pop((region, topic), None)

    def _commit(self, table: IcebergTable, plan: TablePlan, new: list[NewFile],
                deleting: frozenset[SegmentKey]) -> int | None:
        if plan.empty:
            return None
        summary = {"replicator.added": str(len(new)),
                   "replicator.removed-covered": str(len(plan.remove_covered)),
                   "replicator.removed-gone": str(len(plan.remove_gone)),
                   "replicator.reason": "compaction" if deleting else "sync"}
        # A new file holding only positions the covered files held (a compaction output,
        # a trimmed copy) is their replacement: they go in one `replace`; the other new
        # files, holding only positions no file held (the plan splits a file that would
        # hold both), are an `append`; files that left the bucket a `delete` (streaming
        # readers read appends and skip the rest).
        removed = ranges_by_partition(r for p in plan.remove_covered
                                      if (r := self.piece_of(table, p)) is not None)
        swap_in = [f for f in new if (k := self.piece_of(table, f.path)) is not None
                   and holds(removed.get(k.key.partition_ref, []), k.lo, k.hi)]
        swapped = {f.path for f in swap_in}
        append = [f for f in new if f.path not in swapped]
        snapshot = table.commit(append, plan.remove_gone, summary,
                                replace=(swap_in, plan.remove_covered))
        log.info("%s: snapshot %s: +%d files, -%d covered, -%d gone", table.name, snapshot,
                 len(new), len(plan.remove_covered), len(plan.remove_gone))
        return snapshot

    def sync_all(self) -> list[SyncResult]:
        """One step for every topic, ``catalog.sync_workers`` tables at once (in topic
        order); a topic that fails is logged and counted, and the others go on.
        """
        # Topics whose names map to one table (refused at start: check_mapping) are
        # stepped one after the other, in topic order: the first one's table it stays.
        groups: dict[object, list[tuple[str, str]]] = {}
        for region, topic in self.topics():
            shared = ("{incarnation}" not in self.cfg.table_name
                      and self.identifier(TableIdentity(region, topic)))
            groups.setdefault(shared or (region, topic), []).append((region, topic))
        if not groups:
            return []
        workers = min(self.cfg.sync_workers, len(groups))
        with ThreadPoolExecutor(workers, thread_name_prefix="archive-sync") as pool:
            done = list(pool.map(lambda g: [self._sync_or_log(*rt) for rt in g],
                                 groups.values()))
        return [r for results in done for r in results if r is not None]

    def _sync_or_log(self, region: str, topic: str) -> SyncResult | None:
        try:
            return self.sync(region, topic)
        except ReplicatorError as e:
            self.m.failures.labels(region, topic).inc()
            log.error("%s/%s: table not updated this time: %s", region, topic, e)
        except Exception:   # one table's bug must not stop the other tables' steps
            self.m.failures.labels(region, topic).inc()
            log.exception("%s/%s: table not updated this time", region, topic)
        return None

    def rebuild(self, region: str, topic: str, *, drop: bool = False,
                register: str | None = None,
                adopt: tuple[str, ...] | None = None) -> SyncResult:
        """The table from the bucket's segments (idempotent: ``sync``); with ``drop``, the
        catalog entry is dropped first (never a data file) and created again over the old
        metadata; with ``register``, the table is first registered from that
        ``metadata.json`` (a catalog lost: its history comes back); with ``adopt``, the
        table stamped for the topic at that identifier is renamed first (``adopt``); then
        brought up to date.
        """
        if adopt is not None:
            self.adopt(region, topic, adopt)
        identifier = self.identifier(self.identity(region, topic))
        if drop:
            self.catalog.drop(identifier)
            self.table(region, topic, over_metadata=True)
        if register is not None:
            self.catalog.register(identifier, register)
        return self.sync(region, topic)
