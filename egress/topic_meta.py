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

The publisher's partition starts (``egress.topic_starts``), incarnations
(``egress.topic_incarnations``) and seals (``egress.topic_seals``) are parts of it kept in
modules of their own; this one holds the checks and the read-modify-write they share.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Protocol

from egress.incarnation_chain import ChainStore, merge
from egress.metrics import EgressMetrics
from egress.topic_incarnations import TopicIncarnations, with_count, with_incarnation
from egress.topic_seals import PendingSeal, TopicSeals
from egress.topic_starts import TopicStarts, at_start
from replicator.core.clock import Clock
from replicator.core.errors import (
    ObjectNotFound,
    PreconditionFailed,
    ReplicatorError,
    StorageError,
    TopicError,
)
from replicator.core.keys import topic_meta_key
from replicator.core.retry import RetryPolicy, retry
from replicator.core.storage import ObjectStore
from replicator.core.wire import Incarnation, TopicMetadata

__all__ = ["MAX_CONFLICTS", "TopicMetadataPublisher", "TopicSource", "with_incarnation"]
"""``with_incarnation`` lives in ``egress.topic_incarnations``; importable here as before."""

log = logging.getLogger(__name__)

MAX_CONFLICTS = 20
"""Conditional puts refused in a row (other members writing) before a write gives up (it is
retried by its caller)."""


class TopicSource(Protocol):
    """What is read about a source topic (``replicator.core.kafka.Admin``)."""

    def partition_count(self, topic: str) -> int | None: ...
    def topic_config(self, topic: str) -> dict[str, str]: ...
    def topic_id(self, topic: str) -> str | None: ...


class TopicMetadataPublisher(TopicStarts, TopicIncarnations, TopicSeals):
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
