"""What the poll thread starts every so often besides polling: the topic check (selection,
then ``_topic.json``, on the pool) and the subscription that follows its result, the
export of consumer-group offsets and the heartbeats.

``PeriodicWork`` is a part of ``egress.controller.Egress`` (the attributes and the methods it
names are the controller's), kept apart so that each module stays small.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from egress.group_export import GroupExporter
from egress.heartbeat import HeartbeatPublisher, caught_up
from egress.metrics import EgressMetrics
from egress.poll_loop import Writers
from egress.rotation import SegmentLimits
from egress.selection import TopicSelection
from egress.topic_meta import TopicMetadataPublisher
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, Consumer, TopicPartition
from replicator.core.settings import EgressSettings

# The controller's logger: these lines keep the logger name they had before this part moved
# out of egress/controller.py (operators filter on it; docs/runbooks.md shows it).
log = logging.getLogger("egress.controller")


class PeriodicWork:
    """The periodic work of ``egress.controller.Egress`` (a part of it)."""

    config: EgressSettings
    region: str
    m: EgressMetrics
    _selection: TopicSelection
    _limits: dict[str, SegmentLimits]
    _subscribed: frozenset[str]
    _wanted: frozenset[str]
    _admin: Admin | None
    _consumer: Consumer | None
    _writers: Writers
    _pool: ThreadPoolExecutor | None
    _meta: TopicMetadataPublisher | None
    _last_meta: float
    _groups: GroupExporter | None
    _last_groups: float
    _groups_running: threading.Event
    _heartbeats: HeartbeatPublisher | None

    if TYPE_CHECKING:
        # The controller's rebalance callbacks: declared for the type checker only, so
        # that no stub here can shadow them in the controller's method order.
        def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

        def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

        def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

    def _maybe_check_topics(self, now: float) -> None:
        """Follow the selection a finished check found, and queue a new check (selection,
        then ``_topic.json``) every ``topic_metadata_interval`` (poll thread).
        """
        wanted = self._wanted
        if wanted != self._subscribed:
            self._subscribe(wanted)
        self._maybe_export_groups(now)
        self._maybe_heartbeat(now)
        if now - self._last_meta < self.config.topic_metadata_interval.total_seconds():
            return
        self._last_meta = now
        if self._pool is not None and self._meta is not None and not self._meta.running:
            self._pool.submit(self._check_topics)

    def _maybe_export_groups(self, now: float) -> None:
        """Queue a group-offset export every ``group_export.interval`` (poll thread), for
        the topics whose partition 0 this member owns (one writer per topic).
        """
        if self._groups is None or self._pool is None or self._groups_running.is_set() \
                or now - self._last_groups < self.config.group_export.interval.total_seconds():
            return
        topics = {t for t, p in self._writers if p == 0}
        if not topics:
            # Nothing to write (yet, or another member owns every partition 0): look again
            # in a second rather than a whole interval.
            self._last_groups = now - self.config.group_export.interval.total_seconds() + 1.0
            return
        self._last_groups = now
        self._groups_running.set()
        self._pool.submit(self._export_groups, self._groups, topics)

    def _maybe_heartbeat(self, now: float) -> None:
        """Queue the heartbeats that are due (poll thread: the writers and the consumer's
        positions and cached watermarks are read here; the PUT runs on the pool).
        """
        hb, pool, consumer = self._heartbeats, self._pool, self._consumer
        if hb is None or pool is None or consumer is None or not hb.may_be_due(now):
            return
        for topic in hb.due({t for t, _ in self._writers}, now):
            writers = {p: w for (t, p), w in self._writers.items() if t == topic}
            tps = [TopicPartition(topic, p) for p in writers]
            try:
                positions = {tp.partition: tp.offset for tp in consumer.position(tps)}
                highs = {tp.partition: consumer.watermarks(tp, cached=True)[1] for tp in tps}
            except ReplicatorError as e:
                log.debug("heartbeat of %s: no positions or watermarks: %s", topic, e)
                positions, highs = {}, {}
            ids = {p: t for p, w in writers.items() if (t := w.topic_id) is not None}
            pool.submit(hb.write, topic, caught_up(writers, positions, highs), ids)

    def _export_groups(self, exporter: GroupExporter, topics: set[str]) -> None:
        try:
            exporter.export(topics)
        finally:
            self._groups_running.clear()

    def _check_topics(self) -> None:
        """List and select the topics, write their ``_topic.json`` (pool thread); the poll
        thread subscribes to the result afterwards, so a new topic's ``_topic.json`` exists
        before its first segment.
        """
        assert self._meta is not None
        try:
            wanted = self._selected_topics()
        except ReplicatorError as e:
            log.warning("listing the source topics failed, keeping the selection of %d "
                        "topics; trying again in %s: %s", len(self._wanted),
                        self.config.topic_metadata_interval, e)
            wanted = self._wanted
        self._meta.set_topics(wanted)
        self._meta.check()
        self._wanted = wanted

    def _selected_topics(self) -> frozenset[str]:
        """The explicit topics, plus the cluster's topics the patterns select.

        Raises:
            ReplicatorError: the cluster's topics could not be listed.
        """
        if not self._selection.dynamic:
            return self._selection.explicit
        assert self._admin is not None
        return self._selection.select(self._admin.list_topics())

    def _subscribe(self, topics: frozenset[str]) -> None:
        """(Re)subscribe to ``topics`` (poll thread). With the cooperative assignor only
        the partitions of added or removed topics move; the others keep their segments.
        """
        assert self._consumer is not None
        for t in topics - self._limits.keys():
            self._limits[t] = SegmentLimits.from_settings(self.config.topic_settings(t))
        added, removed = topics - self._subscribed, self._subscribed - topics
        if self._subscribed:
            log.info("topic selection changed: added %s; removed %s",
                     ", ".join(sorted(added)) or "none", ", ".join(sorted(removed)) or "none")
        self.m.selected_topics.labels(self.region).set(len(topics))
        self._subscribed = topics
        if not topics:
            # Nothing selected (yet): librdkafka refuses an empty subscription.
            self._consumer.unsubscribe()
            return
        self._consumer.subscribe(sorted(topics), on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
