"""At most one compaction run per region: a lease object in the region's own prefix.

``{prefix}/{region}/_compaction.lock`` holds JSON ``{"owner", "acquired_at", "expires_at"}``.
It is taken with a conditional create (``If-None-Match: *``), so of two runs starting at
once exactly one wins. A lock past its expiry (its owner died) is taken over: delete, then
conditional create, then re-read to confirm that this run's owner id is what is stored.
The owner renews the lease while it works (``refresh``: a conditional put over exactly the
lock it read, so a refresh racing ``release`` can never re-create a deleted lock) and deletes
it at the end. S3's 409 ``ConditionalRequestConflict`` on the create means another run is
creating the lock at that moment: this run skips, like when the lock is held. A create
whose reply was lost (the SDK's retry answers 412, or a retriable error surfaces after the
request took effect) left this run's own lock: a stored lock whose owner is this run is
acquired, never reported as held by another run (which would skip every run for
``lock_ttl``).

Residual race, by design of S3 (no conditional delete here): two runs that find the same
expired lock within the same few milliseconds may both believe they won. ``confirm()`` is
called again before every deletion; and even two concurrent runs lose nothing, because
output keys are deterministic and inputs are deleted only after their output is durable.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from replicator.core.clock import Clock
from replicator.core.errors import (
    ConditionalConflict,
    ObjectNotFound,
    PreconditionFailed,
    ReplicatorError,
    StorageError,
)
from replicator.core.keys import region_prefix
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

LOCK_NAME = "_compaction.lock"


def lock_key(prefix: str, region: str) -> str:
    """Key of a region's compaction lock."""
    return region_prefix(prefix, region) + LOCK_NAME


@dataclass(frozen=True)
class LockState:
    """What the lock object says."""

    owner: str
    acquired_at: datetime
    expires_at: datetime

    def to_json(self) -> bytes:
        return json.dumps({"owner": self.owner, "acquired_at": self.acquired_at.isoformat(),
                           "expires_at": self.expires_at.isoformat()}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LockState:
        """Parse a lock body.

        Raises:
            ValueError: the body is not a lock written by this module.
        """
        try:
            d = json.loads(data)
            return cls(str(d["owner"]), datetime.fromisoformat(d["acquired_at"]),
                       datetime.fromisoformat(d["expires_at"]))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a compaction lock: {e}") from e


class RegionLock:
    """The compaction lease of one region.

    Args:
        store: the region's bucket.
        key: the lock key (``lock_key(prefix, region)``).
        ttl: how long the lease lasts without a refresh.
        clock: returns the current timezone-aware time.
        owner: this run's identity (default: host, pid and a random suffix).
    """

    def __init__(self, store: ObjectStore, key: str, ttl: timedelta,
                 clock: Clock, owner: str | None = None) -> None:
        self.store = store
        self.key = key
        self.ttl = ttl
        self.clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.held = False
        self.holder: LockState | None = None
        """After a failed ``acquire``: who holds the lock (if readable)."""
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        self._mutex = threading.Lock()
        """Serialises ``refresh`` and ``release``."""
        self._etag: str | None = None
        """ETag of the lock as last read by ``read``."""
        self._maybe_created = False
        """A create raised a retriable error: it may have taken effect unseen, so ``release``
        deletes a lock of this run even if ``acquire`` did not return."""

    def _state(self) -> LockState:
        now = self.clock()
        return LockState(self.owner, now, now + self.ttl)

    def read(self) -> LockState | None:
        """The stored lock, ``None`` if there is none.

        An unreadable body is treated as a lock that expires ``ttl`` after it was written.
        """
        try:
            data, self._etag = self.store.get_with_etag(self.key)
        except ObjectNotFound:
            self._etag = None
            return None
        try:
            return LockState.from_json(data)
        except ValueError as e:
            try:
                info = self.store.head(self.key)
            except ObjectNotFound:
                return None
            log.warning("lock %s is unreadable (%s); treating it as written at %s",
                        self.key, e, info.last_modified)
            return LockState("<unreadable>", info.last_modified, info.last_modified + self.ttl)

    def acquire(self) -> bool:
        """Take the lock; ``False`` if another live run holds it.

        Raises:
            StorageError: a create failed and no lock of this run is stored.
        """
        if self._create():
            self.held = True
            log.info("compaction lock %s taken by %s", self.key, self.owner)
            return True
        # Someone holds it: see whether it expired.
        current = self.read()
        now = self.clock()
        if current is not None and current.expires_at > now:
            self.holder = current
            log.info("compaction lock %s is held by %s until %s; skipping this run",
                     self.key, current.owner, current.expires_at.isoformat())
            return False
        if current is not None:
            log.warning("compaction lock %s of %s expired at %s; taking it over", self.key,
                        current.owner, current.expires_at.isoformat())
            self.store.delete(self.key)
        if not self._create():
            self.holder = self.read()
            log.info("compaction lock %s was taken over by another run first", self.key)
            return False
        self.held = self.confirm()
        return self.held

    def _create(self) -> bool:
        """Conditional create; ``True`` if the stored lock is this run's.

        A create can take effect while its reply is lost: the SDK's retry of it then answers
        412 (the key exists: this very create), or the retries run out and a retriable error
        surfaces. Either way the lock is re-read, and one whose owner is this run is this
        run's lock: reported as held by another run, it would be neither used nor released,
        and every run would skip until it expired (``lock_ttl``).

        Raises:
            StorageError: the create failed and no lock of this run is stored.
        """
        try:
            self.store.put(self.key, self._state().to_json(), if_none_match=True,
                           content_type="application/json")
        except PreconditionFailed:
            return self._ours_anyway(self.read(), "412 Precondition Failed")
        except ConditionalConflict as e:
            log.info("compaction lock %s is being created by another run: %s", self.key, e)
            return False
        except StorageError as e:
            # If even the re-read fails, release() still looks for a lock of this run.
            self._maybe_created = True
            current = self.read()
            if current is None:
                raise          # the create did not take effect: the run fails, nothing held
            return self._ours_anyway(current, f"{e}")
        return True

    def _ours_anyway(self, current: LockState | None, answer: str) -> bool:
        """After a create that did not answer success: ``True`` if the lock is this run's."""
        if current is not None and current.owner == self.owner:
            log.info("compaction lock %s: the create answered %s, but the stored lock is "
                     "this run's (%s): the create took effect and its reply was lost",
                     self.key, answer, self.owner)
            return True
        return False

    def confirm(self) -> bool:
        """Re-read the lock: ``True`` if this run still owns it."""
        current = self.read()
        mine = current is not None and current.owner == self.owner
        if not mine:
            self.holder = current
            log.error("compaction lock %s is no longer ours (held by %s)", self.key,
                      current.owner if current else "nobody")
        return mine

    def refresh(self) -> bool:
        """Extend the lease if this run still owns it; ``False`` if it lost it."""
        with self._mutex:
            if not self.held or not self.confirm():
                self.held = False
                return False
            try:
                # Only over the lock just read: if it was deleted or replaced meanwhile,
                # this run lost it, and the put must not create it again.
                self.store.put(self.key, self._state().to_json(), if_match=self._etag,
                               content_type="application/json")
            except (PreconditionFailed, ObjectNotFound):
                log.error("compaction lock %s changed while it was refreshed; no longer ours",
                          self.key)
                self.held = False
                return False
            return True

    def keep_alive(self, interval: float) -> None:
        """Refresh the lease every ``interval`` seconds from a daemon thread until release."""
        if self._keeper is not None:
            return
        self._keeper_stop.clear()

        def loop() -> None:
            while not self._keeper_stop.wait(interval):
                try:
                    if not self.refresh():
                        return
                except ReplicatorError as e:
                    # Try again next interval; the lease lasts ttl, refreshed every ttl/3.
                    log.warning("could not refresh compaction lock %s: %s", self.key, e)

        self._keeper = threading.Thread(target=loop, name="compaction-lock", daemon=True)
        self._keeper.start()

    def release(self) -> None:
        """Stop refreshing and delete the lock if it is still ours; idempotent."""
        self._keeper_stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
            self._keeper = None
        with self._mutex:
            if not self.held and not self._maybe_created:
                return
            was_held = self.held
            self.held = self._maybe_created = False
            current = self.read()
            if current is not None and current.owner == self.owner:
                self.store.delete(self.key)
                log.info("compaction lock %s released", self.key)
            elif was_held:
                log.warning("compaction lock %s was taken by %s before release", self.key,
                            current.owner if current else "nobody")
