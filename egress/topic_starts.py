"""Where a topic's partitions start, as ``_topic.json`` records it: each partition's first
position (``record_first_position``, before its first segment is visible), the partition
count when ``start`` was first applied (``added_later``) and where a partition without a
committed offset continues from what the bucket archived (``archived_start``;
docs/architecture.md, "Topic metadata").

``TopicStarts`` is a part of ``egress.topic_meta.TopicMetadataPublisher`` (the attributes
and the read-modify-write it names are the publisher's), kept apart so that each module
stays small.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Literal

from replicator.core.clock import Clock
from replicator.core.errors import StorageError, TopicError
from replicator.core.keys import BASE_INCARNATION, PartitionRef, SegmentKey, topic_meta_key
from replicator.core.retry import RetryPolicy, retry
from replicator.core.storage import ObjectStore
from replicator.core.wire import TopicMetadata

if TYPE_CHECKING:
    from collections.abc import Callable

# The publisher's logger: these lines keep the logger name they had before this part moved
# out of egress/topic_meta.py (operators filter on it; docs/runbooks.md shows it).
log = logging.getLogger("egress.topic_meta")


def at_start(cur: TopicMetadata | None, partitions: int) -> int:
    """``partitions_at_start`` of a rewritten ``_topic.json`` (pure): kept once written;
    the count now for a new file; for a file an egress wrote without it, the count that
    file recorded (its partitions existed when that egress applied ``start``).
    """
    if cur is None:
        return partitions
    return cur.partitions_at_start if cur.partitions_at_start is not None else cur.partitions


class TopicStarts:
    """The partition starts of ``egress.topic_meta.TopicMetadataPublisher`` (a part of it)."""

    store: ObjectStore
    prefix: str
    region: str
    wall: Clock
    retry_policy: RetryPolicy
    _mutex: threading.Lock
    _topic_locks: dict[str, threading.Lock]
    _first: dict[str, dict[int, int]]
    _at_start: dict[str, int]
    _pending: dict[str, dict[int, int]]

    if TYPE_CHECKING:
        # The publisher's (and its seals'): declared for the type checker only, so that
        # no stub here can shadow them in the publisher's method order.
        def _read_meta(self, key: str) -> TopicMetadata | None: ...

        def _remember(self, topic: str, meta: TopicMetadata | None) -> None: ...

        def _restore(self, topic: str, cur: TopicMetadata | None, *, fresh: bool
                     ) -> tuple[TopicMetadata | None, bool]: ...

        def _update(self, topic: str,
                    change: Callable[[TopicMetadata | None], TopicMetadata | None], *,
                    fresh_chain: bool = False) -> TopicMetadata | None: ...

        def _highest_end(self, ref: PartitionRef) -> int | None: ...

    def added_later(self, topic: str, partition: int) -> bool:
        """Whether ``partition`` was added to ``topic`` after egress first applied the
        topic's ``start`` (``TopicMetadata.partitions_at_start``): such a partition is
        copied from its oldest record, so the records produced to it before egress noticed
        it (a metadata refresh, a rebalance) are not passed over as if it were being seeded.
        A topic without ``_topic.json`` yet is new to egress: nothing was added to it.

        Raises:
            ReplicatorError: ``_topic.json`` could not be read (after retries).
        """
        with self._mutex:
            known = self._at_start.get(topic)
        if known is None:
            key = topic_meta_key(self.prefix, self.region, topic)
            try:
                meta = self._read_meta(key)
            except TopicError as e:
                log.warning("%s: %s is unreadable; partition %d is taken as one the topic "
                            "had from the start: %s", topic, key, partition, e)
                return False
            if meta is None:
                return False
            self._remember(topic, meta)
            known = at_start(meta, meta.partitions)
        return partition >= known

    # --- first positions -------------------------------------------------------------------

    def record_first_position(self, ref: PartitionRef, start: int, *, resumed: bool) -> None:
        """Make sure ``_topic.json`` has the partition's first position before its segment
        from ``start`` becomes visible (a worker thread, before the copy to the final key).

        A partition that did not resume from a commit (no commit, or the start egress
        chose for ``start = "latest"`` or a time) records ``start``. One that resumed
        without an entry (its segments were written by an egress that did not record first
        positions) records the lowest start of its segments in the bucket (all levels);
        when it has none, its history in the bucket begins at ``start`` (the commit was
        set by an offset reset or another tool, or the segments before it were deleted):
        that is recorded, with an INFO line saying so. Entries already there win.
        Concurrent callers of one topic are written in one put.

        Raises:
            ReplicatorError: the entry could not be written (the segment must not be
                published: its partition rewinds and tries again).
        """
        topic, partition = ref.topic, ref.partition
        with self._mutex:
            if partition in self._first.get(topic, {}):
                return
        position = start
        if resumed:
            lowest = self._lowest_start(ref)
            if lowest is None:
                log.info("%s: resumed from offset %d without segments in the bucket or a "
                         "first position in _topic.json: its history in the bucket begins "
                         "there", ref, start)
            else:
                position = lowest
        with self._mutex:
            self._pending.setdefault(topic, {}).setdefault(partition, position)
        with self._topic_locks[topic]:
            with self._mutex:
                if partition in self._first.get(topic, {}):
                    return
                pending = dict(self._pending.get(topic, {}))

            def add(cur: TopicMetadata | None) -> TopicMetadata | None:
                if cur is None:
                    raise StorageError(f"{topic}: _topic.json is not written yet; the first "
                                       "position waits for it")
                have = dict(cur.first_positions or {})
                new = {p: pos for p, pos in pending.items() if p not in have}
                if not new and cur.first_positions is not None:
                    return None
                return dataclasses.replace(cur, first_positions={**have, **new},
                                           updated_at=self.wall())

            meta = self._update(topic, add)
            with self._mutex:
                for p in pending:
                    self._pending.get(topic, {}).pop(p, None)
        recorded = (meta.first_positions or {}).get(partition) if meta is not None else None
        log.info("%s: first position %s in _topic.json", ref, recorded)

    def archived_start(self, ref: PartitionRef, topic_id: str | None
                       ) -> int | Literal["earliest"] | None:
        """Where a partition without a committed offset continues, from the bucket: its
        group offsets are gone (expired after egress was down longer than
        ``offsets.retention.minutes``, a group deleted, a start commit that never landed)
        while its history is archived (poll thread, at assignment).

        * the offset after the highest end of its segments (all levels), or its recorded
          first position when no segment is there yet, for the topic's live incarnation;
        * ``"earliest"`` when the live topic is an incarnation the bucket has not archived
          yet, or a later one listed in ``_topic.json`` (recorded by a check) without
          anything of the partition archived (the topic was deleted and created again:
          Kafka deletes its group offsets with it): a new topic starts at its oldest
          record, never at a ``start`` meant for seeding;
        * ``None`` when nothing of the partition is archived (the topic's ``start``
          applies). Partitions of a new deployment cost no listing: ``_topic.json`` has
          no entry for them.

        Raises:
            ReplicatorError: ``_topic.json`` or the listing could not be read.
        """
        key = topic_meta_key(ref.prefix, ref.region, ref.topic)
        try:
            meta = self._read_meta(key)
        except TopicError as e:
            log.warning("%s: %s is unreadable; the topic's start applies: %s", ref, key, e)
            return None
        if meta is None:
            return None
        # An egress of an earlier release may have rewritten it without the chain (and
        # this process's check not restored it yet, e.g. S3 failing at start): without
        # ``_incarnations.json`` merged in, a recreated topic would resume at the earlier
        # one's end at the documented shape, its records below it never read.
        restored, _ = self._restore(ref.topic, meta, fresh=False)
        meta = restored or meta
        self._remember(ref.topic, meta)
        firsts = meta.first_positions
        location = ref
        if topic_id is not None and meta.incarnations:
            inc = meta.incarnation(topic_id)
            if inc is None:
                return "earliest"
            if inc.label != BASE_INCARNATION:
                firsts, location = inc.first_positions, ref.of_incarnation(inc.label)
                if ref.partition not in firsts:
                    # A later incarnation (recorded at a check before any segment of it):
                    # a topic created after egress started it, copied from its oldest
                    # record; the partition starts its history there.
                    end = self._highest_end(location)
                    return "earliest" if end is None else end + 1
        first = None if firsts is None else firsts.get(ref.partition)
        if first is None and firsts is not None:
            return None
        end = self._highest_end(location)
        if end is None:
            return first
        return max(end + 1, first or 0)

    def _lowest_start(self, ref: PartitionRef) -> int | None:
        prefix = ref.segments_prefix()
        keys = retry(lambda: [o.key for o in self.store.list(prefix)], self.retry_policy,
                     what=f"list {prefix}")
        starts = [k.start for k in map(SegmentKey.try_parse, keys) if k is not None]
        return min(starts) if starts else None
