"""Which incarnation of its source topic a replay worker replays, and when it moves on.

A source topic deleted and created again is a new *incarnation* (a new Kafka topic id,
offsets from 0 again). Egress stores each incarnation's segments in a location of its own
and lists the incarnations in ``_topic.json``, oldest first, with, per partition, where the
previous incarnation's segments end (docs/architecture.md, "Topic incarnations").

A worker replays one incarnation at a time, into the same destination partition, in that
order: its checkpoint names the incarnation its offset belongs to, and segments of other
incarnations are never judged by that offset. It moves on to the next incarnation only
once ``_topic.json`` says where the current one ends for the partition and the position
reached that end (a missing range before it is waited for and reported like any gap).
Moving on is logged at WARNING with both topic ids and counted in
``ingress_topic_incarnations_total``; the position restarts before the next incarnation's
first position. ``advance`` is the pure decision; ``Lineage`` reads ``_topic.json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ingress.topic_meta_cache import TopicMetaCache
from replicator.core.keys import BASE_INCARNATION, PartitionRef, SegmentKey
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import read_topic_meta
from replicator.core.wire import TopicMetadata

log = logging.getLogger(__name__)

RECHECK = 2.0
"""Seconds between reads of ``_topic.json`` while segments of an incarnation it does not
say enough about (not listed, or the earlier one's end not recorded) are known."""


@dataclass(frozen=True)
class Chain:
    """One partition's incarnations as ``_topic.json`` lists them (pure data)."""

    labels: tuple[str, ...] = ()
    """Oldest first (``""``: the first one, at the documented key shape)."""
    ids: tuple[str, ...] = ()
    """The topic id of each label."""
    previous_ends: tuple[tuple[bool, int | None], ...] = ()
    """Per label: (recorded for this partition, the previous incarnation's end there)."""
    firsts: tuple[int | None, ...] = ()
    """Per label: its first position in this partition, when recorded."""

    @classmethod
    def of(cls, meta: TopicMetadata | None, partition: int) -> Chain:
        """The chain of ``partition`` in ``meta`` (empty without incarnations)."""
        if meta is None or not meta.incarnations:
            return cls()
        incs = meta.incarnations
        base = (meta.first_positions or {}).get(partition)
        return cls(tuple(i.label for i in incs), tuple(i.topic_id for i in incs),
                   tuple((partition in i.previous_ends, i.previous_ends.get(partition))
                         for i in incs),
                   tuple(i.first_positions.get(partition,
                                               base if i.label == BASE_INCARNATION else None)
                         for i in incs))

    def rank(self, label: str) -> int | None:
        """The position of ``label`` in the chain (``None``: not listed)."""
        return self.labels.index(label) if label in self.labels else None

    def topic_id(self, label: str) -> str:
        """The topic id of ``label`` (``"unknown"`` when not listed)."""
        r = self.rank(label)
        return "unknown" if r is None else self.ids[r]


@dataclass(frozen=True)
class Move:
    """The worker leaves incarnation ``left`` (replayed through ``end``) for ``entered``,
    whose positions start after ``position``.
    """

    left: str
    entered: str
    end: int | None
    position: int


def advance(label: str, position: int | None, chain: Chain, *,
            has_segments: bool = True, known_ends: Mapping[str, int] | None = None
            ) -> list[Move]:
    """The moves from ``label`` at ``position`` (the last position replayed, ``None``:
    nothing yet) that ``chain`` allows (pure): while the next incarnation records the end
    of the current one for the partition and the position reached it, or the current one
    has no segments there (``end`` null), or nothing of it was replayed and none of its
    segments is known (``has_segments`` False) while its first position there is not
    recorded either (no position to wait from). With its first position recorded, a
    worker without a checkpoint that sees a later incarnation first waits for the earlier
    one's segments (S3 replication keeps no order) like for any gap.

    An incarnation whose end is recorded as ``None`` is left (the worker in it, or
    entering it in the same step) only once no segment of it known reaches past the
    position (``known_ends``: the highest end of the known segments of each label in the
    partition; ``None``: not known, the chain decides alone): its known segments are
    replayed first (the planner then waits for what is missing like for any gap),
    whatever the chain says (an end recorded before a topic created earlier was listed
    said "none" of it), on every planning step, not only the one that entered it.
    """
    known = known_ends or {}
    moves: list[Move] = []
    r = chain.rank(label)
    while r is not None and r + 1 < len(chain.labels):
        recorded, end = chain.previous_ends[r + 1]
        if not recorded:
            break
        here = known.get(chain.labels[r])
        if end is None and here is not None and (position is None or here > position):
            break
        begins = chain.firsts[r]
        if end is not None and ((position is None and (
                has_segments or (begins is not None and begins <= end)))
                or (position is not None and position < end)):
            break
        first = chain.firsts[r + 1]
        nxt = chain.labels[r + 1]
        position = (0 if first is None else first) - 1
        moves.append(Move(chain.labels[r], nxt, end, position))
        r += 1
    return moves


def same_incarnation(beat_id: str | None, replayed_id: str | None, live_id: str | None
                     ) -> bool:
    """Whether an egress heartbeat's position (of topic id ``beat_id``) can vouch for a
    replay of incarnation ``replayed_id`` (pure): a worker still in an earlier
    incarnation is not fresh because the live topic is caught up. A heartbeat that names
    no id (an earlier release) is taken as the live topic's (``live_id``); without
    incarnations (``replayed_id`` unknown) any heartbeat counts, as before.
    """
    if replayed_id is None:
        return True
    return replayed_id == (live_id if beat_id is None else beat_id)


def end_of(label: str, chain: Chain) -> int | None:
    """Where ``label``'s segments of the partition end, once the next incarnation recorded
    it (the planner waits for every position up to it).
    """
    r = chain.rank(label)
    if r is None or r + 1 >= len(chain.labels):
        return None
    recorded, end = chain.previous_ends[r + 1]
    return end if recorded else None


class Lineage:
    """The incarnation chain of one source partition, read from ``_topic.json`` when
    segments show it may have changed (at most every ``RECHECK`` seconds).
    """

    def __init__(self, store: ObjectStore, ref: PartitionRef,
                 monotonic: Callable[[], float] = time.monotonic,
                 cache: TopicMetaCache | None = None) -> None:
        self.store = store
        self.ref = ref.base
        self._monotonic = monotonic
        self._cache = cache
        """The process's workers share one read per ``RECHECK`` (``None``: read alone)."""
        self.chain = Chain()
        self._read_at = float("-inf")

    def refresh(self, label: str, labels: Iterable[str]) -> Chain:
        """The chain, read again when one of ``labels`` (incarnations of known segments)
        is not in it, or a later one is while the end of ``label`` is not recorded yet.

        Raises:
            ReplicatorError: ``_topic.json`` cannot be read or parsed (the session retries).
        """
        chain = self.chain
        r = chain.rank(label)
        later = [x for x in labels if x != label]
        if not later:
            return chain
        stale = any(chain.rank(x) is None for x in later) or r is None or (
            r + 1 < len(chain.labels) and not chain.previous_ends[r + 1][0]
            and any((chain.rank(x) or 0) > r for x in later))
        if stale:
            self.read()
        return self.chain

    def read(self) -> Chain:
        """Read ``_topic.json`` again unless it was read less than ``RECHECK`` ago.

        Raises:
            ReplicatorError: ``_topic.json`` cannot be read or parsed.
        """
        now = self._monotonic()
        if now - self._read_at >= RECHECK:
            self._read_at = now
            ref = self.ref
            meta = read_topic_meta(self.store, ref.prefix, ref.region, ref.topic) \
                if self._cache is None else self._cache.read(ref.prefix, ref.region, ref.topic)
            self.chain = Chain.of(meta, ref.partition)
        return self.chain


class IncarnationTracker:
    """A worker's current incarnation and its moves (logged, counted).

    Args:
        store: the source bucket.
        ref: the worker's partition.
        where: the worker's name for log lines.
        moved: the worker's child of ``ingress_topic_incarnations_total``.
    """

    def __init__(self, store: ObjectStore, ref: PartitionRef, where: str, moved: object,
                 monotonic: Callable[[], float] = time.monotonic,
                 lost: Callable[[int], None] = lambda n: None,
                 cache: TopicMetaCache | None = None) -> None:
        self.lineage = Lineage(store, ref, monotonic, cache)
        self.where = where
        self._moved = moved
        self._lost = lost
        self.label = BASE_INCARNATION

    def topic_id(self) -> str | None:
        """The topic id of the incarnation replayed now (``None``: not known)."""
        chain = self.lineage.chain
        return None if chain.rank(self.label) is None else chain.topic_id(self.label)

    def id_of(self, label: str) -> str | None:
        """The topic id of ``label`` as last read (``None``: not listed)."""
        chain = self.lineage.chain
        return None if chain.rank(label) is None else chain.topic_id(label)

    def live_id(self) -> str | None:
        """The topic id of the live incarnation as last read (``None``: none listed)."""
        ids = self.lineage.chain.ids
        return ids[-1] if ids else None

    def left_behind(self, usable: set[SegmentKey]) -> list[SegmentKey]:
        """Segments of incarnations the worker has left (returned: replay no longer needs
        them). One reaching past the end recorded for its incarnation arrived after egress
        sealed it (a copy that finished late, a zombie member): its positions past that
        end are never replayed, an ERROR names them and they are counted as lost.
        """
        chain = self.lineage.chain
        here = chain.rank(self.label)
        if not here:
            return []
        out = []
        for s in sorted(usable, key=lambda k: (k.incarnation, k.start, k.end)):
            r = chain.rank(s.incarnation)
            if r is None or r >= here:
                continue
            out.append(s)
            recorded, end = chain.previous_ends[r + 1]
            last = end if recorded and end is not None else -1
            if s.end <= last:
                continue
            lo = max(s.start, last + 1)
            log.error("%s: segment %s of incarnation %s (topic id %s) arrived after the "
                      "worker left it (replayed through %s, the end egress recorded): "
                      "positions %d-%d (%d) of it are NOT replayed", self.where, s.to_key(),
                      s.incarnation or "first", chain.topic_id(s.incarnation),
                      "nothing" if last < 0 else last, lo, s.end, s.end - lo + 1)
            self._lost(s.end - lo + 1)
        return out

    def current(self, usable: set[SegmentKey], position: int | None
                ) -> tuple[set[SegmentKey], int | None, int | None]:
        """Move on as far as allowed; returns the segments of the current incarnation, the
        position to plan from (changed only by a move) and where the current incarnation
        ends (``None``: not known, or it is the live one).
        """
        labels = {s.incarnation for s in usable}
        if labels <= {self.label} and not self.lineage.chain.labels:
            return usable, position, None
        chain = self.lineage.refresh(self.label, labels)
        known: dict[str, int] = {}
        for s in usable:
            known[s.incarnation] = max(s.end, known.get(s.incarnation, s.end))
        for move in advance(self.label, position, chain,
                            has_segments=self.label in labels, known_ends=known):
            log.warning("%s: the source topic was deleted and created again: incarnation %s "
                        "(topic id %s) replayed through %s; replaying incarnation %s (topic "
                        "id %s) after it, from position %d", self.where,
                        move.left or "first", chain.topic_id(move.left),
                        "nothing" if move.end is None else move.end, move.entered,
                        chain.topic_id(move.entered), move.position + 1)
            self._moved.inc()  # type: ignore[attr-defined]
            self.label, position = move.entered, move.position
        mine = {s for s in usable if s.incarnation == self.label}
        return mine, position, end_of(self.label, chain)

    def skip_to_newest(self, usable: set[SegmentKey]) -> int:
        """``start = "latest"`` without a checkpoint, at the worker's first plan: move to
        the newest incarnation listed that has segments in the bucket, skipping the earlier
        ones' history (logged, counted as a move); returns the positions skipped (from
        their segments here), 0 when there is nothing to skip.

        Raises:
            ReplicatorError: ``_topic.json`` cannot be read or parsed.
        """
        labels = {s.incarnation for s in usable}
        if labels <= {self.label}:
            return 0
        chain = self.lineage.refresh(self.label, labels)
        ranked = [x for x in labels if chain.rank(x) is not None]
        here = chain.rank(self.label)
        if not ranked:
            return 0
        target = max(ranked, key=lambda x: chain.rank(x) or 0)
        top = chain.rank(target) or 0
        if here is not None and top <= here:
            return 0
        skipped = 0
        for x in ranked:
            if (chain.rank(x) or 0) < top:
                segs = [s for s in usable if s.incarnation == x]
                skipped += max(s.end for s in segs) - min(s.start for s in segs) + 1
        log.warning("%s: start = latest: incarnations before %s (topic id %s) are skipped "
                    "(%d positions already in the bucket); its own history is skipped next",
                    self.where, target or "first", chain.topic_id(target), skipped)
        self._moved.inc()  # type: ignore[attr-defined]
        self.label = target
        return skipped

    def locations(self, position: int | None = None) -> tuple[str, list[str]]:
        """The current incarnation and the later ones a listing covers (the chain read
        from ``_topic.json`` again, at most every ``RECHECK`` seconds, so a later
        incarnation is found without segment events too): every later one while nothing
        was replayed (``position`` ``None``: the start options weigh them all), else only
        those the worker can move into from ``position`` now (``advance``): a worker
        still in an earlier incarnation does not list the later ones in full each time.
        A move the listing did not foresee (the chain read again since) is followed by a
        listing of the incarnation entered (``ReplayWorker._incarnation``).
        """
        chain = self.lineage.read()
        r = chain.rank(self.label)
        if r is None:
            return self.label, []
        if position is None:
            return self.label, list(chain.labels[r + 1:])
        return self.label, [m.entered for m in advance(self.label, position, chain)]
