"""What a replay worker knows about its partition's segments, and which it cannot use.

Segments are listed from the store at a session's start and on paced reloads, and learned
from segment events in between. A listing starts at the resume position (``start_after``
within level 0, where nearly all segments are; every higher level in full) and keeps only
what replay still needs; a gap right after the position makes the next listing complete
(a segment that starts earlier and covers the position is then found too). A segment that
was gone when read (compacted or deleted) or that could not be read (corrupt) is excluded
until an event announces it again (or, for a gone one, until a paced reload still lists
it).

Segments of every incarnation of the topic the worker may still replay are kept (the
current one's location is listed from the resume position; later ones in full, those it
can move into now, or all while nothing was replayed): the position is the current
incarnation's and says nothing about another's (``ingress.incarnations``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
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

    def __init__(self, store: ObjectStore, ref: PartitionRef, where: str,
                 horizon: Callable[[], tuple[int | None, int | None]] = lambda: (None, None),
                 locations: Callable[[int | None], tuple[str, list[str]]] = lambda p: ("", []),
                 current: Callable[[], str] = lambda: ""
                 ) -> None:
        self.store = store
        self.ref = ref
        # (the current incarnation, the later ones it can move into from the position
        # given): what a listing covers (may read _topic.json); ``current``: the
        # incarnation replayed now (reads nothing).
        self.locations = locations
        self.current = current
        self.where = where
        # (replayed through, origin) of the worker: what a listing may leave out.
        self.horizon = horizon
        self.partial = False
        """The last listing started at the resume position (not every segment seen)."""
        self.listed_fully = False
        """A complete listing happened since the last ``anchor`` was set (this session)."""
        self.anchor: int | None = None
        """Set by the worker at a session's start: the start of the level-0 segment its
        checkpoint came from (the checkpoint may lie inside it)."""
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
        current = self.current()
        return min((s.start for s in excluded if s.incarnation == current), default=None)

    def apply(self, events: Iterable[SegmentEvent]) -> None:
        """Learn from segment events: ``created`` makes a segment usable again. What replay
        no longer needs is dropped (``prune``).
        """
        for ev in events:
            if ev.kind == "created":
                self.known.add(ev.key)
                if ev.event_time is not None:
                    self.arrived.setdefault(ev.key, ev.event_time)
                self.bad.discard(ev.key)
                self.gone.discard(ev.key)
            else:
                self.known.discard(ev.key)
                self.arrived.pop(ev.key, None)
        self.prune()

    def prune(self) -> None:
        """Drop the segments replay no longer needs: those ending at or below the position
        (kept if they lie below the origin: reported as skipped), the rule of ``reload``.
        On a busy partition segment events keep waking the worker before its idle rescan
        reloads, so without this ``known`` and ``arrived`` would hold every segment
        announced for the worker's life, and every step would cost time in proportion.
        """
        position, origin = self.horizon()
        if position is None:
            return
        current = self.current()

        def needed(s: SegmentKey) -> bool:
            return s.incarnation != current or s.end > position or \
                (origin is not None and s.start < origin)

        if all(needed(s) for s in self.known) and len(self.arrived) <= len(self.known):
            return
        self.known = {s for s in self.known if needed(s)}
        self.arrived = {s: t for s, t in self.arrived.items() if s in self.known}
        self.bad &= self.known
        self.gone &= self.known

    def reload(self, *, retry_gone: bool = True, full: bool = False) -> None:
        """List the partition's segments: from the resume position (``_start_after``), or
        every one with ``full`` (or before anything was replayed); keep what replay still
        needs (ending after the position, or lying below the origin: reported as skipped).

        With ``retry_gone`` (the periodic and late reloads, which are paced), segments
        that were missing when read get one more chance if the listing still shows them.
        """
        if retry_gone:
            self.gone.clear()
        position, origin = self.horizon()
        current, later = self.locations(position)
        after = None if full or position is None else self._start_after(position)
        found: set[SegmentKey] = set()
        arrived: dict[SegmentKey, datetime] = {}
        listings = [(current, after)] + [(x, None) for x in later]
        for label, start_after in listings:
            ref = self.ref.of_incarnation(label)
            for info in self.store.list(ref.segments_prefix(), start_after=start_after):
                seg = SegmentKey.try_parse(info.key)
                if seg is None or seg.partition_ref != ref:
                    log.debug("%s: ignoring non-segment object %s", self.where, info.key)
                    continue
                if label == current and position is not None and seg.end <= position and \
                        (origin is None or seg.start >= origin):
                    continue     # replayed already: not needed
                found.add(seg)
                arrived[seg] = info.last_modified
        # Segments of an incarnation not listed (a later one the worker cannot move into
        # yet, learned from events) stay known: the listing said nothing about them.
        listed = {current, *later}
        found |= {s for s in self.known if s.incarnation not in listed}
        self.known = found
        self.arrived = {s: t for s, t in self.arrived.items() if s in found} | arrived
        self.bad &= found
        self.gone &= found
        self.partial = after is not None
        self.listed_fully |= after is None
        log.debug("%s: %d segment(s) listed%s", self.where, len(found),
                  "" if after is None else f" after {after}")

    def _start_after(self, position: int) -> str:
        """Level 0 from the start of the segment that covers ``position + 1`` (the one the
        checkpoint came from, or a known one), else from ``position + 1``; every higher
        level in full (they follow level 0 in key order).
        """
        current = self.current()
        covering = [s.start for s in self.known if s.incarnation == current
                    and s.level == 0 and s.start <= position + 1 <= s.end]
        if self.anchor is not None and self.anchor <= position + 1:
            covering.append(self.anchor)
        start = min(covering, default=position + 1)
        return self.ref.of_incarnation(self.current()).starting_from(0, start)

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
