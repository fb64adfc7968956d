"""``{prefix}/{region}/{topic}/_topic.json``: what ingress needs to create its copy topic.

Written for every selected topic at start and when a topic is first selected, again whenever
its partition count changes (checked every ``egress.topic_metadata_interval``), and whenever
a partition's first position is recorded (``record_first_position``: before the partition's
first segment is copied to its final key). The body is ``replicator.core.wire.TopicMetadata``
(docs/architecture.md, "Topic metadata").

It also lists the topic's incarnations (``incarnation``, ``seal``): a topic deleted and
created again has a new Kafka topic id, and its segments go to a location of their own
(``replicator.core.keys``), so no incarnation ever overwrites another's segments.

The incarnations are also kept in ``_incarnations.json`` (``egress.incarnation_chain``),
written before ``_topic.json`` names a new incarnation or a seal, and merged back into every
``_topic.json`` this writer reads: an egress of an earlier release that rewrote the file
without them cannot make the live topic take the first one's key shape. The topic id is
recorded at start, when a topic is first selected and whenever ``check`` finds a new one,
not only when a segment is named: an idle topic recreated later is a later incarnation.

Several egress members write the same object, so every write is a read-modify-write with a
conditional put (``If-Match`` on the ETag read, ``If-None-Match`` when there is none), read
again when another member wrote in between. First positions are never changed once
written: an entry already there wins.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from datetime import datetime, timedelta
from typing import Literal, Protocol

from egress.incarnation_chain import ChainStore, insert, merge
from egress.metrics import EgressMetrics
from egress.topic_seals import PendingSeal, TopicSeals
from replicator.core.clock import Clock
from replicator.core.errors import (
    ObjectNotFound,
    PreconditionFailed,
    ReplicatorError,
    StorageError,
    TopicError,
)
from replicator.core.keys import (
    BASE_INCARNATION,
    PartitionRef,
    SegmentKey,
    incarnation_label,
    topic_meta_key,
)
from replicator.core.retry import RetryPolicy, retry
from replicator.core.storage import ObjectStore
from replicator.core.wire import Incarnation, TopicMetadata

log = logging.getLogger(__name__)

MAX_CONFLICTS = 20
"""Conditional puts refused in a row (other members writing) before a write gives up (it is
retried by its caller)."""


class TopicSource(Protocol):
    """What is read about a source topic (``replicator.core.kafka.Admin``)."""

    def partition_count(self, topic: str) -> int | None: ...
    def topic_config(self, topic: str) -> dict[str, str]: ...
    def topic_id(self, topic: str) -> str | None: ...


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


def at_start(cur: TopicMetadata | None, partitions: int) -> int:
    """``partitions_at_start`` of a rewritten ``_topic.json`` (pure): kept once written;
    the count now for a new file; for a file an egress wrote without it, the count that
    file recorded (its partitions existed when that egress applied ``start``).
    """
    if cur is None:
        return partitions
    return cur.partitions_at_start if cur.partitions_at_start is not None else cur.partitions


class TopicMetadataPublisher(TopicSeals):
    """Writes ``_topic.json`` of the configured topics when their partition count is new.

    Args:
        topics: the source topics.
        admin: reads partition counts and topic configs.
        store: the region's bucket.
        prefix: ``s3.prefix``.
        region: this process's region.
        metrics: the egress metrics.
        wall: the wall clock (``updated_at``).
        retry_policy: retries of the put.
        interval: ``egress.topic_metadata_interval`` (for log lines).
    """

    def __init__(self, topics: Iterable[str], admin: TopicSource, store: ObjectStore, *,
                 prefix: str, region: str, metrics: EgressMetrics, wall: Clock,
                 retry_policy: RetryPolicy, interval: timedelta) -> None:
        self.topics = sorted(topics)
        self.admin = admin
        self.store = store
        self.prefix = prefix
        self.region = region
        self.m = metrics
        self.wall = wall
        self.retry_policy = retry_policy
        self.interval = interval
        self._partition_counts: dict[str, int] = {}
        self._written_configs: dict[str, dict[str, str]] = {}
        """The topic configs of the last ``_topic.json`` this process wrote, per topic."""
        self._running = threading.Lock()
        self._mutex = threading.Lock()
        self._topic_locks: dict[str, threading.Lock] = {t: threading.Lock() for t in self.topics}
        self._first: dict[str, dict[int, int]] = {}
        """First positions known to be in each ``_topic.json`` (never change once there)."""
        self._at_start: dict[str, int] = {}
        """``partitions_at_start`` known to be in each ``_topic.json`` (never changes)."""
        self._pending: dict[str, dict[int, int]] = {}
        self._labels: dict[tuple[str, str], str] = {}
        """(topic, topic id) -> label of incarnations known to be in ``_topic.json``."""
        self._sealed: set[tuple[str, str, int]] = set()
        self._pending_seals: dict[str, dict[tuple[str, str, int], PendingSeal]] = {}
        self._chains = ChainStore(store, prefix=prefix, region=region,
                                  retry_policy=retry_policy)
        self._pinned: dict[str, tuple[Incarnation, ...]] = {}
        """The chain known to be in each ``_incarnations.json``."""
        self.on_written: Callable[[str, str, str], None] | None = None
        """Told ``(prefix, region, topic)`` after each write of a ``_topic.json`` settles
        (written, or found already holding the change; failed too): the low-RPO mirror
        copies the metadata again before the topic's next segment (``egress.mirror``)."""
        self._seen: dict[tuple[str, str], tuple[datetime, int]] = {}
        """(topic, topic id) -> when this process first read that id, and how many ids it
        had read before (the creation order: exact within the process, whatever its
        clock)."""

    def set_topics(self, topics: Iterable[str]) -> None:
        """Follow the selection: new topics get their ``_topic.json`` at the next check;
        topics no longer selected (deleted, excluded) are no longer checked, and their
        ``_topic.json`` stays (ingress keeps what was replicated).
        """
        topics = sorted(topics)
        with self._mutex:
            for t in topics:
                self._topic_locks.setdefault(t, threading.Lock())
            for t in set(self.topics) - set(topics):
                self._partition_counts.pop(t, None)
            self.topics = topics

    @property
    def running(self) -> bool:
        """True while a check runs (the poll loop does not queue a second one)."""
        return self._running.locked()

    def check(self) -> None:
        """Write ``_topic.json`` for topics whose partition count or configs are new or
        changed: a raised ``retention.ms`` reaches the destination's comparison (and its
        alignment) within one interval, as MirrorMaker 2 syncs configs. One
        DescribeConfigs per topic per check.

        Failures are logged and tried again at the next check; they never raise.
        """
        with self._running:
            for topic in self.topics:
                try:
                    n = self.admin.partition_count(topic)
                    if n is None:
                        log.warning("%s: source topic does not exist (yet)", topic)
                        continue
                    try:
                        self._check_seals(topic)
                    except ReplicatorError as e:
                        log.warning("%s: seals not checked, trying again in %s: %s", topic,
                                    self.interval, e)
                    tid = self._id_for_check(topic)
                    with self._mutex:
                        id_known = tid is None or (topic, tid) in self._labels
                    configs = self.admin.topic_config(topic)
                    if self._partition_counts.get(topic) == n and id_known \
                            and self._written_configs.get(topic) == configs \
                            and not self._chain_dropped(topic):
                        continue
                    key = topic_meta_key(self.prefix, self.region, topic)
                    now = self.wall()

                    def change(cur: TopicMetadata | None, topic: str = topic, n: int = n,
                               configs: dict[str, str] = configs, now: datetime = now,
                               tid: str | None = tid) -> TopicMetadata:
                        first = cur.first_positions if cur is not None else None
                        incs = cur.incarnations if cur is not None else ()
                        if tid is not None:
                            incs = self._with_id(topic, incs, tid, now) or incs
                            if cur is not None and len(incs) > max(1, len(cur.incarnations)):
                                # The file's count is the earlier topic's (a new id):
                                # the live one it listed (the new one may not be last).
                                was = (cur.incarnations[-1] if cur.incarnations
                                       else incs[-2]).topic_id
                                incs = with_count(incs, was, cur.partitions)
                            incs = with_count(incs, tid, n)
                        return dataclasses.replace(
                            TopicMetadata.of(topic, self.region, n, configs, now,
                                             first if first is not None else {}),
                            incarnations=incs, partitions_at_start=at_start(cur, n))

                    self._update(topic, change, fresh_chain=not id_known)
                except ReplicatorError as e:
                    log.warning("%s: _topic.json not updated, trying again in %s: %s", topic,
                                self.interval, e)
                    continue
                old = self._partition_counts.get(topic)
                old_configs = self._written_configs.get(topic)
                self._partition_counts[topic] = n
                self._written_configs[topic] = configs
                self.m.topic_meta_writes.labels(self.region, topic).inc()
                log.info("%s: wrote %s (%d partitions%s%s)", topic, key, n,
                         "" if old is None or old == n else f", was {old}",
                         "" if old_configs is None or old_configs == configs
                         else f"; configs now {dict(sorted(configs.items()))}")

    def _chain_dropped(self, topic: str) -> bool:
        """Whether ``_topic.json`` lacks incarnations this process pinned (an egress of an
        earlier release rewrote it): ``check`` then writes it again at once, so ingress
        does not wait for this process's next write to see the chain. One GET per check
        of a topic with incarnations.

        Raises:
            ReplicatorError: ``_topic.json`` could not be read.
        """
        with self._mutex:
            pinned = self._pinned.get(topic, ())
        if not pinned:
            return False
        try:
            meta = self._read_meta(topic_meta_key(self.prefix, self.region, topic))
        except TopicError:
            return True
        if meta is None:
            return True
        return any(meta.incarnation(i.topic_id) is None for i in pinned)

    def _read_meta(self, key: str) -> TopicMetadata | None:
        """The ``_topic.json`` at ``key`` (its GET retried); ``None`` while there is none.

        Raises:
            TopicError: it is unreadable.
            ReplicatorError: S3 failed.
        """
        try:
            data = retry(lambda: self.store.get(key), self.retry_policy, what=f"get {key}")
        except ObjectNotFound:
            return None
        return TopicMetadata.parse(data, where=key)

    def _id_for_check(self, topic: str) -> str | None:
        """The topic id ``check`` records (``None``: none, or the describe failed)."""
        try:
            return self.topic_id(topic)
        except ReplicatorError as e:
            log.warning("%s: topic id not read (read again at the next check and before "
                        "a segment is named): %s", topic, e)
            return None

    # --- read-modify-write ----------------------------------------------------------------

    def _restore(self, topic: str, cur: TopicMetadata | None, *, fresh: bool
                 ) -> tuple[TopicMetadata | None, bool]:
        """``cur`` with the incarnations ``_incarnations.json`` keeps merged in (read again
        when ``fresh`` or not read yet), and whether that changed it (an egress of an
        earlier release rewrote ``_topic.json`` without them).
        """
        with self._mutex:
            pinned = self._pinned.get(topic)
        if fresh or pinned is None:
            pinned, _ = self._chains.read(topic)
            with self._mutex:
                self._pinned[topic] = pinned
        if cur is None or not pinned:
            return cur, False
        merged = merge(pinned, cur.incarnations)
        if merged == cur.incarnations:
            return cur, False
        missing = [i.topic_id for i in pinned if cur.incarnation(i.topic_id) is None]
        if missing:
            log.warning("%s: _topic.json lacks incarnations %s that _incarnations.json keeps "
                        "(rewritten by an egress of an earlier release?): restored", topic,
                        ", ".join(missing))
        return dataclasses.replace(cur, incarnations=merged), True

    def _pin(self, topic: str, new: TopicMetadata) -> bool:
        """Keep ``new``'s incarnations in ``_incarnations.json`` before ``_topic.json`` says
        them; False when that object disagrees (another writer pinned another first id:
        read everything again).
        """
        with self._mutex:
            pinned = self._pinned.get(topic, ())
        if not new.incarnations or merge(pinned, new.incarnations) == pinned:
            return True
        pinned = self._chains.pin(topic, new.incarnations)
        with self._mutex:
            self._pinned[topic] = pinned
        labels = {i.topic_id: i.label for i in pinned}
        return all(labels.get(i.topic_id) == i.label for i in new.incarnations)

    def _update(self, topic: str,
                change: Callable[[TopicMetadata | None], TopicMetadata | None], *,
                fresh_chain: bool = False) -> TopicMetadata | None:
        try:
            return self._write(topic, change, fresh_chain=fresh_chain)
        finally:
            if self.on_written is not None:
                self.on_written(self.prefix, self.region, topic)

    def _write(self, topic: str,
               change: Callable[[TopicMetadata | None], TopicMetadata | None], *,
               fresh_chain: bool = False) -> TopicMetadata | None:
        """Apply ``change`` to the current ``_topic.json`` (``None``: there is none or it is
        unreadable; its incarnations restored from ``_incarnations.json``) and put the
        result conditionally, its incarnations kept in ``_incarnations.json`` first;
        ``change`` returning ``None`` writes nothing (but a restore). Returns what the
        object holds afterwards (as far as this writer knows).

        Raises:
            ReplicatorError: S3 failed (after retries), or other writers kept winning.
        """
        key = topic_meta_key(self.prefix, self.region, topic)
        for _ in range(MAX_CONFLICTS):
            try:
                data, etag = retry(lambda: self.store.get_with_etag(key), self.retry_policy,
                                   what=f"get {key}")
            except ObjectNotFound:
                current, etag_or_none = None, None
            else:
                etag_or_none = etag
                try:
                    current = TopicMetadata.parse(data, where=key)
                except TopicError as e:
                    log.warning("%s: replacing an unreadable %s: %s", topic, key, e)
                    current = None
            current, restored = self._restore(topic, current, fresh=fresh_chain)
            new = change(current)
            if new is None:
                if not restored:
                    self._remember(topic, current)
                    return current
                new = current
            assert new is not None
            if not self._pin(topic, new):
                log.info("%s: another writer pinned the incarnation chain; reading it again",
                         topic)
                fresh_chain = True
                continue
            try:
                self._put(key, new.encode(), etag_or_none)
            except (PreconditionFailed, ObjectNotFound):
                log.debug("%s: %s changed under this write; reading it again", topic, key)
                continue
            self._remember(topic, new)
            return new
        raise StorageError(f"{key}: {MAX_CONFLICTS} conditional writes in a row lost to "
                           "other writers")

    def _put(self, key: str, body: bytes, etag: str | None) -> None:
        # A reply lost after the put took effect is retried and refused (412): the caller
        # reads again and finds its own write.
        retry(lambda: self.store.put(key, body, if_match=etag, if_none_match=etag is None,
                                     content_type="application/json"),
              self.retry_policy, what=f"put {key}")

    def _remember(self, topic: str, meta: TopicMetadata | None) -> None:
        if meta is None:
            return
        with self._mutex:
            for inc in meta.incarnations:
                self._labels[(topic, inc.topic_id)] = inc.label
            if meta.partitions_at_start is not None:
                self._at_start[topic] = meta.partitions_at_start
            if meta.first_positions is not None:
                self._first.setdefault(topic, {}).update(meta.first_positions)

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

    # --- incarnations ----------------------------------------------------------------------

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
