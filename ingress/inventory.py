"""What a replay worker knows about its partition's segments, and which it cannot use.

Segments are listed from the store (all levels) at a session's start and on paced reloads,
and learned from segment events in between. A segment that was gone when read (compacted
or deleted) or that could not be read (corrupt) is excluded until an event announces it
again (or, for a gone one, until a paced reload still lists it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from ingress.events import SegmentEvent
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)


class SegmentInventory:
    """The segments of one source partition, as far as its worker knows.

    Attributes:
        known: every segment listed or announced (and not removed since).
        bad: segments that could not be read (corrupt): never tried again unless an event
            announces them again.
        gone: segments missing when read: not tried again before a new event or a paced
            reload.
    """

    def __init__(self, store: ObjectStore, ref: PartitionRef, where: str) -> None:
        self.store = store
        self.ref = ref
        self.where = where
        self.known: set[SegmentKey] = set()
        self.bad: set[SegmentKey] = set()
        self.gone: set[SegmentKey] = set()
        # When a segment arrived in the bucket (listing time or event time), if known.
        self.arrived: dict[SegmentKey, datetime] = {}

    def usable(self) -> set[SegmentKey]:
        """Known segments that are neither bad nor gone."""
        return self.known - self.bad - self.gone

    def floor(self) -> int | None:
        """The lowest start of a known segment that is excluded (bad or gone), if any."""
        excluded = (self.bad | self.gone) & self.known
        return min((s.start for s in excluded), default=None)

    def apply(self, events: Iterable[SegmentEvent]) -> None:
        """Learn from segment events: ``created`` makes a segment usable again."""
        for ev in events:
            if ev.kind == "created":
                self.known.add(ev.key)
                if ev.event_time is not None:
                    self.arrived.setdefault(ev.key, ev.event_time)
                self.bad.discard(ev.key)
                self.gone.discard(ev.key)
            else:
                self.known.discard(ev.key)

    def reload(self, *, retry_gone: bool = True) -> None:
        """List the partition's segments (all levels).

        With ``retry_gone`` (the periodic and late reloads, which are paced), segments
        that were missing when read get one more chance if the listing still shows them.
        """
        if retry_gone:
            self.gone.clear()
        found: set[SegmentKey] = set()
        for info in self.store.list(self.ref.segments_prefix()):
            seg = SegmentKey.try_parse(info.key)
            if seg is not None and seg.partition_ref == self.ref:
                found.add(seg)
                self.arrived[seg] = info.last_modified
            else:
                log.debug("%s: ignoring non-segment object %s", self.where, info.key)
        self.known = found
        log.debug("%s: %d segment(s) listed", self.where, len(found))

    def mark_gone(self, seg: SegmentKey) -> None:
        """``seg`` was missing when read: reload, and do not try it again before a new
        "created" event or a paced reload, even if a stale listing still shows it (a
        missing object is not retried in a loop).
        """
        self.reload(retry_gone=False)
        self.gone = {s for s in self.gone if s in self.known}
        self.gone.add(seg)

    def mark_bad(self, seg: SegmentKey) -> None:
        """``seg`` cannot be read: exclude it."""
        self.bad.add(seg)
