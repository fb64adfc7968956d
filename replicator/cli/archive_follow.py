"""``replicator archive follow``: the committer of a region's tables, on an interval.

One committer per region is elected with a lease like compaction's
(``{prefix}/{region}/_archive.lock``, ``compaction.lock``): the one holding it commits
every ``catalog.commit_interval``, one commit per table that changed; the others wait and
take over when the lease expires (``catalog.lock_ttl``). Correctness does not depend on
the lease: commits are optimistic (``archive.committer``), so two committers at once (a
lease taken over by mistake, compaction's swap) only cost a re-planned commit.
"""

from __future__ import annotations

import logging
import threading
import time

from compaction.lock import RegionLock
from replicator.archive.committer import ArchiveCommitter, SyncResult
from replicator.core.clock import Clock, utc_now
from replicator.core.errors import ReplicatorError
from replicator.core.keys import region_prefix
from replicator.core.metrics import MetricsServer
from replicator.core.settings import Settings
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

LOCK_NAME = "_archive.lock"


def archive_lock_key(prefix: str, region: str) -> str:
    """Key of a region's committer lease."""
    return region_prefix(prefix, region) + LOCK_NAME


class ArchiveFollower:
    """Commits new and removed segments of the region's topics every interval.

    Args:
        settings: settings with ``[catalog]``.
        store: the bucket (default: ``S3ObjectStore.from_settings`` at ``start``).
        committer: default: ``ArchiveCommitter(settings, store)`` at ``start``.
        clock: lease expiry.
    """

    def __init__(self, settings: Settings, *, store: ObjectStore | None = None,
                 committer: ArchiveCommitter | None = None, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.cfg = settings.catalog
        self.store = store
        self.committer = committer
        self.clock = clock
        self._stop = threading.Event()
        self._lock: RegionLock | None = None
        self.steps = 0
        self.last: list[SyncResult] = []
        self._server: MetricsServer | None = None

    def start(self) -> None:
        """Connect to the bucket and the catalog. Fails fast.

        Raises:
            CatalogError: the catalog cannot be loaded.
            ConfigError: two sources map to one table (``ArchiveCommitter.check_mapping``).
        """
        if self.store is None:
            from replicator.core.s3 import S3ObjectStore

            self.store = S3ObjectStore.from_settings(self.settings)
        if self.committer is None:
            self.committer = ArchiveCommitter(self.settings, self.store)
        self.committer.check_mapping()
        if self.settings.metrics.port and self._server is None:
            self._server = MetricsServer(self.committer.metrics, self.settings.metrics.host,
                                         self.settings.metrics.port, healthy=lambda: True,
                                         ready=lambda: self.steps > 0)
            self._server.start()
        self._lock = RegionLock(self.store, archive_lock_key(self.settings.s3.prefix,
                                                             self.settings.region),
                                self.cfg.lock_ttl, self.clock)
        log.info("archive committer of region %s started: catalog %s %s, every %s",
                 self.settings.region, self.cfg.type, self.cfg.masked_properties(),
                 self.cfg.commit_interval)

    def step(self) -> list[SyncResult]:
        """One commit per table, if this process holds the lease (else nothing)."""
        if self.committer is None or self._lock is None:
            self.start()
        assert self.committer is not None and self._lock is not None
        lock = self._lock
        if not lock.held:
            if not lock.acquire():
                log.debug("archive lease held by %s", lock.holder)
                return []
            log.info("archive lease %s taken: this process commits", lock.key)
            lock.keep_alive(max(1.0, self.cfg.lock_ttl.total_seconds() / 3))
        elif not lock.confirm():
            log.warning("archive lease %s lost; waiting to take it again", lock.key)
            lock.held = False
            return []
        self.last = self.committer.sync_all()
        self.steps += 1
        return self.last

    def run(self) -> None:
        """Steps every ``commit_interval`` until ``stop()``."""
        interval = self.cfg.commit_interval.total_seconds()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.step()
            except ReplicatorError as e:
                log.error("archive step failed (the next one tries again): %s", e)
            self._stop.wait(max(0.0, interval - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        lock, self._lock = self._lock, None
        if lock is not None and lock.held:
            try:
                lock.release()
            except ReplicatorError as e:
                log.warning("could not release the archive lease (%s); it expires", e)
