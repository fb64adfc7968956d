"""A topic's incarnations in ``_topic.json``: the source topic's id (``topic_id``), the
label of the incarnation it belongs to, recorded in creation order before a segment of it
is named (``incarnation``), and the pure list changes behind them (``with_incarnation``,
``with_count``; docs/architecture.md, "Topic incarnations").

``TopicIncarnations`` is a part of ``egress.topic_meta.TopicMetadataPublisher`` (the
attributes and the read-modify-write it names are the publisher's), kept apart so that each
module stays small.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING

from egress.incarnation_chain import ChainStore, insert
from egress.metrics import EgressMetrics
from replicator.core.clock import Clock
from replicator.core.errors import StorageError
from replicator.core.keys import BASE_INCARNATION, incarnation_label, topic_meta_key
from replicator.core.wire import Incarnation, TopicMetadata

if TYPE_CHECKING:
    from collections.abc import Callable

    from egress.topic_meta import TopicSource

# The publisher's logger: these lines keep the logger name they had before this part moved
# out of egress/topic_meta.py (operators filter on it; docs/runbooks.md shows it).
log = logging.getLogger("egress.topic_meta")

NULL_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
"""Kafka's zero id (a broker without topic ids answers with it): no id."""


def with_incarnation(incarnations: tuple[Incarnation, ...], topic_id: str, now: datetime,
                     *, later: Collection[str] = ()) -> tuple[Incarnation, ...] | None:
    """The incarnation list once ``topic_id`` is known (pure): unchanged (``None``) when it
    is listed already; the first id ever recorded is the one stored at the documented key
    shape (label ``""``: the segments already there are taken as its own); a new id, its
    label derived from the id, goes in creation order (``incarnation_chain.insert``: when
    first seen, ``now``, and the ids ``later`` its writer knows came after it), which is
    the end unless it was recorded after a later topic's.
    """
    if any(i.topic_id == topic_id for i in incarnations):
        return None
    label = BASE_INCARNATION if not incarnations else incarnation_label(topic_id)
    return insert(incarnations, Incarnation(topic_id, label, created_at=now),
                  later=later)[0]


def with_count(incarnations: tuple[Incarnation, ...], topic_id: str, partitions: int
               ) -> tuple[Incarnation, ...]:
    """``incarnations`` with ``topic_id``'s partition count raised to ``partitions`` (pure;
    a count only grows within an incarnation, so a count read with a stale id never
    lowers the earlier topic's).
    """
    return tuple(dataclasses.replace(i, partitions=max(i.partitions or 0, partitions))
                 if i.topic_id == topic_id and (i.partitions or 0) < partitions else i
                 for i in incarnations)



class TopicIncarnations:
    """The incarnations of ``egress.topic_meta.TopicMetadataPublisher`` (a part of it)."""

    admin: TopicSource
    prefix: str
    region: str
    m: EgressMetrics
    wall: Clock
    _mutex: threading.Lock
    _topic_locks: dict[str, threading.Lock]
    _labels: dict[tuple[str, str], str]
    _pinned: dict[str, tuple[Incarnation, ...]]
    _seen: dict[tuple[str, str], tuple[datetime, int]]
    _chains: ChainStore

    if TYPE_CHECKING:
        # The publisher's: declared for the type checker only, so that no stub here can
        # shadow them in the publisher's method order.
        def _read_meta(self, key: str) -> TopicMetadata | None: ...

        def _restore(self, topic: str, cur: TopicMetadata | None, *, fresh: bool
                     ) -> tuple[TopicMetadata | None, bool]: ...

        def _update(self, topic: str,
                    change: Callable[[TopicMetadata | None], TopicMetadata | None], *,
                    fresh_chain: bool = False) -> TopicMetadata | None: ...

    def topic_id(self, topic: str) -> str | None:
        """The source topic's id now (``None``: it does not exist, or the broker has no
        topic ids).

        Raises:
            ReplicatorError: the describe failed.
        """
        tid = self.admin.topic_id(topic)
        # A client that got no id from the broker may print it as "None".
        if not tid or tid in (NULL_TOPIC_ID, "None"):
            return None
        now = self.wall()
        with self._mutex:
            self._seen.setdefault((topic, tid), (now, len(self._seen)))
        return tid

    def incarnation(self, topic: str, topic_id: str, *, later: Collection[str] = (),
                    seen_at: datetime | None = None) -> str:
        """The label of the incarnation with ``topic_id``, recorded in ``_topic.json`` first
        when it is new (a worker thread, before a segment of it is named), in creation
        order: before the topics ``later`` names (ids the writer read after this one) and
        those first seen after it (``seen_at``, when the writer read it, or when this
        process did if earlier), not after every topic recorded so far: two recreates in a
        row can name the later topic's segments first.

        Raises:
            ReplicatorError: ``_topic.json`` could not be read or written (the segment
                must not be published: its partition rewinds and tries again).
        """
        with self._mutex:
            known = self._labels.get((topic, topic_id))
        if known is not None:
            return known
        later, seen = self._order_hints(topic, topic_id, later, seen_at)
        lock = self._topic_locks.setdefault(topic, threading.Lock())
        with lock:
            def add(cur: TopicMetadata | None) -> TopicMetadata | None:
                if cur is None:
                    raise StorageError(f"{topic}: _topic.json is not written yet; the "
                                       "incarnation waits for it")
                incs = self._with_id(topic, cur.incarnations, topic_id,
                                     seen if seen is not None else self.wall(), later=later)
                if incs is None:
                    return None
                at = [i.topic_id for i in incs].index(topic_id)
                if len(incs) > 1 and at == len(incs) - 1:
                    # The file's count is the earlier topic's until a check sees the new one.
                    incs = with_count(incs, incs[-2].topic_id, cur.partitions)
                if at < len(incs) - 1:
                    log.warning("%s: topic id %s is recorded before %s, recorded earlier: "
                                "it was created first (read before it); the partitions %s "
                                "of %s now follow it", topic, topic_id,
                                incs[at + 1].topic_id,
                                sorted(incs[at + 1].previous_ends) or "(none yet)",
                                incs[at + 1].topic_id)
                if cur.incarnations:
                    log.warning("%s: the source topic was deleted and created again (topic "
                                "id %s, was %s): its segments go to their own location "
                                "(%s/_incarnations/%s/); the earlier ones stay as they are",
                                topic, topic_id, incs[at - 1].topic_id if at else "none",
                                topic, incs[at].label)
                    self.m.incarnations.labels(self.region, topic).inc()
                return dataclasses.replace(cur, incarnations=incs, updated_at=self.wall())

            meta = self._update(topic, add, fresh_chain=True)
        inc = meta.incarnation(topic_id) if meta is not None else None
        if inc is None:
            raise StorageError(f"{topic}: incarnation {topic_id} not in _topic.json")
        with self._mutex:
            self._labels[(topic, topic_id)] = inc.label
        return inc.label

    def _order_hints(self, topic: str, topic_id: str, later: Collection[str],
                     seen_at: datetime | None) -> tuple[Collection[str], datetime | None]:
        """What places ``topic_id`` in the chain: the ids known to be later (the writer's,
        and those this process read after it, whatever the clocks say) and when it was
        first seen (by the writer or this process, the earlier).
        """
        with self._mutex:
            first = self._seen.get((topic, topic_id))
            if first is not None:
                later = {*later, *(t for (tp, t), (_, n) in self._seen.items()
                                   if tp == topic and n > first[1])}
        seen = None if first is None else first[0]
        if seen_at is not None and (seen is None or seen_at < seen):
            seen = seen_at
        return later, seen

    def has_incarnations(self, topic: str) -> bool:
        """Whether ``_topic.json`` (or ``_incarnations.json``) lists any incarnation of
        ``topic`` (a writer that reads no id must then not use the documented shape).

        Raises:
            ReplicatorError: the objects could not be read.
        """
        with self._mutex:
            if self._pinned.get(topic) or any(t == topic for t, _ in self._labels):
                return True
        meta = self._read_meta(topic_meta_key(self.prefix, self.region, topic))
        restored, _ = self._restore(topic, meta, fresh=True)
        with self._mutex:
            pinned = self._pinned.get(topic, ())
        return bool(pinned or (restored is not None and restored.incarnations))

    def _with_id(self, topic: str, incarnations: tuple[Incarnation, ...], topic_id: str,
                 now: datetime, *, later: Collection[str] = ()
                 ) -> tuple[Incarnation, ...] | None:
        """``with_incarnation``, but the documented shape is never given to ``topic_id``
        when no incarnation is recorded while the bucket says another id owns it (a
        segment footer there names another id: that one is recorded first) or cannot
        tell (later incarnations' segments exist, no footer names an id: the chain was
        lost; nothing is named until it is restored, an ERROR says so).

        Raises:
            ReplicatorError: the bucket could not be read, or the chain was lost.
        """
        if not incarnations:
            owner = self._chains.base_owner(topic)
            if owner.topic_id is not None and owner.topic_id != topic_id:
                log.warning("%s: segments at the documented shape are topic id %s's: it is "
                            "recorded as the first incarnation, %s as a later one", topic,
                            owner.topic_id, topic_id)
                incarnations = (Incarnation(owner.topic_id, BASE_INCARNATION),)
            elif owner.topic_id is None and owner.later:
                log.error("%s: _topic.json and _incarnations.json list no incarnation, but "
                          "%s/_incarnations/ holds segments of later ones: which topic id "
                          "owns the documented shape is unknown, so no segment of %s is "
                          "named until the chain is restored (docs/upgrades.md)", topic,
                          topic, topic_id)
                raise StorageError(f"{topic}: the incarnation chain was lost")
        return with_incarnation(incarnations, topic_id, now, later=later)
