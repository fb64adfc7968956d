"""A topic's seals: where each later incarnation of a partition begins and where the one
before it ends there, recorded in ``_topic.json`` (``TopicMetadataPublisher.seal``) before
the partition's first segment of that incarnation is visible (docs/architecture.md,
"Topic incarnations").

``TopicSeals`` is a part of ``egress.topic_meta.TopicMetadataPublisher`` (the attributes
and the read-modify-write it names are the publisher's), kept apart so that each module
stays small.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from egress.incarnation_chain import unsealed
from replicator.core.clock import Clock
from replicator.core.errors import StorageError
from replicator.core.keys import BASE_INCARNATION, PartitionRef, SegmentKey, topic_meta_key
from replicator.core.retry import RetryPolicy, retry
from replicator.core.storage import ObjectStore
from replicator.core.wire import Incarnation, TopicMetadata

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PendingSeal:
    """One partition's seal waiting to be written (``TopicMetadataPublisher.seal``)."""

    labels: tuple[str, ...]
    """The chain up to the sealed incarnation, as read (must still hold when written)."""
    partition: int
    start: int
    ends: dict[int, int | None]
    """Chain index -> the end of its predecessor's segments of the partition."""


def _apply(incs: list[Incarnation], one: PendingSeal) -> bool:
    """Write ``one`` into ``incs`` (its chain as read, in place); whether that changed it."""
    rank = len(one.labels) - 1
    p = one.partition
    changed = False
    if p not in incs[rank].first_positions:
        incs[rank] = dataclasses.replace(
            incs[rank], first_positions={**incs[rank].first_positions, p: one.start})
        changed = True
    for n, end in one.ends.items():
        if p not in incs[n].previous_ends:
            incs[n] = dataclasses.replace(incs[n],
                                          previous_ends={**incs[n].previous_ends, p: end})
            changed = True
    return changed


class TopicSeals:
    """The seals of ``egress.topic_meta.TopicMetadataPublisher`` (a part of it)."""

    store: ObjectStore
    prefix: str
    region: str
    wall: Clock
    retry_policy: RetryPolicy
    _mutex: threading.Lock
    _topic_locks: dict[str, threading.Lock]
    _sealed: set[tuple[str, str, int]]
    """(topic, label, partition) sealed by this process."""
    _pending_seals: dict[str, dict[tuple[str, str, int], PendingSeal]]

    def _restore(self, topic: str, cur: TopicMetadata | None, *, fresh: bool
                 ) -> tuple[TopicMetadata | None, bool]:
        raise NotImplementedError

    def _update(self, topic: str,
                change: Callable[[TopicMetadata | None], TopicMetadata | None], *,
                fresh_chain: bool = False) -> TopicMetadata | None:
        raise NotImplementedError

    def _check_seals(self, topic: str) -> None:
        """Seal again the partitions this process sealed whose ends the chain no longer
        holds: a seal written against the chain as it was before an incarnation was
        inserted (two recreates in a row, recorded out of order) can be dropped by the
        merge, and its partition's next segment would not seal again (ingress would wait
        there for good). One GET per check of a topic this process sealed.

        Raises:
            ReplicatorError: S3 failed.
        """
        with self._mutex:
            sealed = {(label, p) for t, label, p in self._sealed if t == topic}
        if not sealed:
            return
        key = topic_meta_key(self.prefix, self.region, topic)
        data = retry(lambda: self.store.get(key), self.retry_policy, what=f"get {key}")
        cur, _ = self._restore(topic, TopicMetadata.parse(data, where=key), fresh=False)
        assert cur is not None
        for label, p, start in unsealed(cur.incarnations, sealed):
            log.warning("%s[%d]: the chain lacks the seal of incarnation %s recorded here "
                        "(dropped by a merge with an incarnation recorded late); sealing "
                        "again", topic, p, label or "first")
            with self._mutex:
                self._sealed.discard((topic, label, p))
            self.seal(PartitionRef(self.prefix, self.region, topic, p, label), start)

    def seal(self, ref: PartitionRef, start: int) -> None:
        """Before the partition's first segment of a later incarnation is visible, record
        where the previous incarnation's segments of the partition end (the highest end in
        the bucket, all levels; ``None`` when it has none) and where this one begins. An
        incarnation between them that never had a segment of the partition (the topic was
        recreated twice) gets its end there too, so the chain has no hole, but no first
        position: only a seal of its own first segment says where it begins (were 0
        recorded, ingress would wait below that segment for records that never existed
        until it declared them lost). This incarnation's first position is written when
        the chain has none, even when its predecessor's end is there already (an entry
        inserted before a later one takes that one's ends). Entries already there win.

        Raises:
            ReplicatorError: ``_topic.json`` could not be read, listed or written.
        """
        if ref.incarnation == BASE_INCARNATION:
            return
        token = (ref.topic, ref.incarnation, ref.partition)
        with self._mutex:
            if token in self._sealed:
                return
        data = retry(lambda: self.store.get(topic_meta_key(ref.prefix, ref.region, ref.topic)),
                     self.retry_policy, what=f"get _topic.json of {ref.topic}")
        read = TopicMetadata.parse(data, where=f"_topic.json of {ref.topic}")
        cur, _ = self._restore(ref.topic, read, fresh=False)
        assert cur is not None
        labels = [i.label for i in cur.incarnations]
        if ref.incarnation not in labels or labels.index(ref.incarnation) == 0:
            raise StorageError(f"{ref}: incarnation {ref.incarnation} is not a later one in "
                               "_topic.json")
        rank = labels.index(ref.incarnation)
        p = ref.partition
        # Every incarnation up to this one that does not say where its predecessor ends
        # here: its predecessor is over (a later topic exists), so its highest end is final.
        ends = {n: self._highest_end(ref.of_incarnation(labels[n - 1]))
                for n in range(1, rank + 1) if p not in cur.incarnations[n].previous_ends}
        if ends or p not in cur.incarnations[rank].first_positions:
            self._seal_batched(ref, PendingSeal(tuple(labels[:rank + 1]), p, start, ends))
            log.info("%s: the previous incarnation's segments end at %s; this one begins at "
                     "%d", ref, ends.get(rank, "(recorded already)"), start)
        with self._mutex:
            self._sealed.add(token)

    def _seal_batched(self, ref: PartitionRef, seal: PendingSeal) -> None:
        """Write one seal, with every other seal of the topic waiting in this process, in
        one conditional put: members sealing many partitions at once after a recreate
        would otherwise refuse each other's puts (each a read-modify-write of the one
        ``_topic.json``) until some seal gives up.
        """
        topic = ref.topic
        token = (topic, ref.incarnation, ref.partition)
        with self._mutex:
            self._pending_seals.setdefault(topic, {})[token] = seal
        with self._topic_locks.setdefault(topic, threading.Lock()):
            with self._mutex:
                if token in self._sealed:
                    return
                pending = dict(self._pending_seals.get(topic, {}))

            def add(c: TopicMetadata | None) -> TopicMetadata | None:
                if c is None:
                    raise StorageError(f"{topic}: _topic.json is gone")
                have = tuple(i.label for i in c.incarnations)
                incs = list(c.incarnations)
                changed = False
                for one in pending.values():
                    if have[:len(one.labels)] != one.labels:
                        raise StorageError(f"{topic}: _topic.json changed its incarnations")
                    changed = _apply(incs, one) or changed
                if not changed:
                    return None
                return dataclasses.replace(c, incarnations=tuple(incs), updated_at=self.wall())

            self._update(topic, add)
            with self._mutex:
                for t in pending:
                    self._pending_seals.get(topic, {}).pop(t, None)
                    self._sealed.add(t)

    def _highest_end(self, ref: PartitionRef) -> int | None:
        prefix = ref.segments_prefix()
        keys = retry(lambda: [o.key for o in self.store.list(prefix)], self.retry_policy,
                     what=f"list {prefix}")
        ends = [k.end for k in map(SegmentKey.try_parse, keys)
                if k is not None and k.partition_ref == ref]
        return max(ends) if ends else None
