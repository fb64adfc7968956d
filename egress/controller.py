"""The egress controller: source topics into level-0 segments on S3.

``Egress`` wires the parts and owns the assignment: the poll thread (``poll_loop``) runs
the consumer; the rebalance callbacks here create a ``PartitionWriter`` per assigned
partition (``partition_writer``: its segments and its durability method) and release
them durably on revoke and shutdown. Commits are served on the poll thread
(``commits``), flow control decides pauses and early closes (``flow``), and
``_topic.json`` is written by ``topic_meta``. The topics are the explicit tables plus, with
``[egress.select]``, the cluster's topics its patterns match (``selection``), listed again
every ``topic_metadata_interval``: the subscription follows, so a new topic is read from its
first record and a deleted one is released. Uploads, closes and commits run on a small
pool (``egress.upload_threads``), so the poll loop keeps polling within
``max.poll.interval.ms`` whatever S3 does.

Assignment is incremental by default (``cooperative-sticky``, unless ``kafka.config`` sets
``partition.assignment.strategy``): the callbacks get only the partitions that move, so a
rebalance closes only their segments.

Lifecycle: the constructor stores; ``start`` connects (S3 store, admin, consumer, metrics
server) and fails fast; ``run`` blocks until ``stop``; ``close`` is idempotent.

Two parts of ``Egress`` live in modules of their own: where newly assigned partitions
start (``start_positions``) and the work the poll thread starts every so often: topic
checks and the subscription, group-offset exports, heartbeats (``periodic_work``).
"""

from __future__ import annotations

import gc
import logging
import queue
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from egress.allocators import arrow_allocated_bytes, prepare_allocators
from egress.commits import CommitService, next_segment_start, started_here
from egress.encode_gate import EncodeGate
from egress.flow import FlowLimits, prefetch_overrides, segment_budget
from egress.group_export import GroupExporter
from egress.heartbeat import HeartbeatPublisher
from egress.metrics import EgressMetrics
from egress.mirror import SegmentMirror, make_mirror
from egress.origin import origin_filter
from egress.out_of_range import READ_TIMEOUT
from egress.partition_writer import PartitionWriter, WriterContext
from egress.periodic_work import PeriodicWork
from egress.poll_loop import PollLoop, Writers
from egress.rotation import CloseReason, SegmentLimits
from egress.segment import SegmentOutcome
from egress.selection import TopicSelection
from egress.start_positions import StartPositions, own_incarnation
from egress.topic_meta import TopicMetadataPublisher
from formats.base import WriterOptions
from formats.registry import get_format
from replicator.core.clock import Clock, Monotonic, monotonic, utc_now
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import (
    Admin,
    Consumer,
    TopicPartition,
)
from replicator.core.keys import PartitionRef
from replicator.core.metrics import Metrics, MetricsServer
from replicator.core.reachability import DependencyWatch, kafka_dependency, s3_dependency
from replicator.core.retry import RetryPolicy
from replicator.core.settings import EgressSettings, IngressSettings, Settings
from replicator.core.storage import ObjectStore
from replicator.core.throttle import TokenBucket

__all__ = ["CANCEL_GRACE", "DEFAULT_ASSIGNOR", "GC_THRESHOLD", "Egress", "own_incarnation"]
"""``own_incarnation`` lives in ``egress.start_positions``; importable here as before."""

log = logging.getLogger(__name__)

GC_THRESHOLD = 200_000
"""Allocations between young-generation collections while the poll loop runs."""
DEFAULT_ASSIGNOR = "cooperative-sticky"
"""Egress's ``partition.assignment.strategy`` unless ``kafka.config`` sets one (docs/deploy.md,
"Egress group membership")."""
CANCEL_GRACE = 5.0
"""Seconds cancelled segment tasks get to abort their uploads before the partition is
released anyway (a worker blocked in a request finishes the abort on its own later)."""


def _default_retry() -> RetryPolicy:
    # Steps 1-3 of the durability method: ~3 s of retries absorb S3 blips; a longer outage
    # fails the segment and the partition rewinds with the same growing backoff (capped at
    # one minute) while the other partitions keep flowing.
    return RetryPolicy(attempts=5, initial=timedelta(milliseconds=200),
                       maximum=timedelta(seconds=60))


class Egress(StartPositions, PeriodicWork):
    """Consume the configured source topics and stream every partition into segments.

    Args:
        settings: the process settings; ``[egress]`` is required.
        store: the object store (default: ``S3ObjectStore.from_settings`` at ``start``).
        metrics: the registry to export (default: a new one).
        clock: monotonic seconds for segment ages and backoff (tests pass a fake).
        wall: the wall clock for footers and ``_topic.json``.
        retry_policy: retries of the durability steps, and the rewind backoff.
        consumer_overrides: librdkafka settings applied over ``kafka.config`` (tests).
    """

    def __init__(self, settings: Settings, *, store: ObjectStore | None = None,
                 metrics: Metrics | None = None, clock: Monotonic = monotonic,
                 wall: Clock = utc_now, retry_policy: RetryPolicy | None = None,
                 consumer_overrides: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.config: EgressSettings = settings.require("egress")
        self.region = settings.region
        self.metrics = metrics or Metrics()
        self.m = EgressMetrics(self.metrics, settings.region)
        self.fmt = get_format(settings.format.name)
        self.store = store
        self.clock = clock
        self.wall = wall
        self.retry_policy = retry_policy or _default_retry()
        self._consumer_overrides = dict(consumer_overrides or {})
        self._selection = TopicSelection.of(
            self.config.select.include, self.config.select.exclude, self.config.topics,
            _own_topics(settings))
        self._limits = {t: SegmentLimits.from_settings(s) for t, s in self.config.topics.items()}
        """Segment thresholds of every topic selected so far (filled as topics are)."""
        self._subscribed: frozenset[str] = frozenset()
        self._wanted: frozenset[str] = frozenset()
        self._admin: Admin | None = None
        self._writers: Writers = {}
        self._outcomes: queue.SimpleQueue[SegmentOutcome] = queue.SimpleQueue()
        self._commits = CommitService()
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._loop: PollLoop | None = None
        self._gate: EncodeGate | None = None
        self._meta: TopicMetadataPublisher | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._mirror: SegmentMirror | None = None
        self._watch: DependencyWatch | None = None
        """Kafka and S3 asked every few seconds while running (``/readyz``)."""
        self._ctx: WriterContext | None = None
        self._server: MetricsServer | None = None
        self._last_meta = 0.0
        self._groups: GroupExporter | None = None
        self._last_groups = 0.0
        self._groups_running = threading.Event()
        self._heartbeats: HeartbeatPublisher | None = None
        self._assigned_once = False
        self._failed = False
        self._fatal: ReplicatorError | None = None
        self._closed = False

    def _tails(self) -> Mapping[tuple[str, int], tuple[int, int]]:
        """The poll loop's last ``tails`` (read by the group export's pool thread)."""
        return {} if self._loop is None else self._loop.tails

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Connect to S3 and Kafka, write ``_topic.json``, join the group, serve metrics.

        Raises:
            ReplicatorError: S3 or Kafka cannot be reached (fail fast).
        """
        if self.store is None:
            # Imported here so a library user with their own store never needs boto3.
            from replicator.core.s3 import S3ObjectStore

            self.store = S3ObjectStore.from_settings(self.settings)
        # Arrow's default allocator (mimalloc) keeps freed memory in per-thread heaps, so
        # RSS grew with the partition count although the bytes held stayed within
        # max_buffered_bytes (bench/egress_memory.py, 256 MiB budget: 256 partitions grew
        # 754 MB with mimalloc, 452 MB with the system allocator, at the same throughput).
        # Freed column buffers and encoder pages go back to the system instead of staying
        # in glibc's per-thread arenas unless the operator trades that memory for CPU
        # (egress/allocators.py).
        prepare_allocators(self.config.memory_pool, self.config.release_freed_memory)
        self._pool = ThreadPoolExecutor(self.config.upload_threads,
                                        thread_name_prefix="egress-upload")
        self._admin = Admin(self.settings.kafka)
        self._wanted = self._selected_topics()
        self._meta = TopicMetadataPublisher(
            self._wanted, self._admin, self.store,
            prefix=self.settings.s3.prefix, region=self.region, metrics=self.m,
            wall=self.wall, retry_policy=self.retry_policy,
            interval=self.config.topic_metadata_interval)
        self._gate = EncodeGate(segment_budget(self.config.max_buffered_bytes))
        self._mirror = make_mirror(self.settings, self.store, self.m,
                                   self.settings.s3.storage_class_for(0))
        if self._mirror is not None:
            self._meta.on_written = self._mirror.metadata_written
        self._ctx = WriterContext(
            store=self.store, fmt=self.fmt,
            options=WriterOptions.from_settings(self.settings.format),
            temp_prefix=self.settings.s3.temp_prefix,
            storage_class=self.settings.s3.storage_class_for(0),
            pool=self._pool, report=self._outcomes.put, clock=self.clock, wall=self.wall,
            retry_policy=self.retry_policy,
            first_positions=self._meta.record_first_position, incarnations=self._meta,
            gate=self._gate,
            mirror=self._mirror.submit if self._mirror is not None else None)
        self._meta.check()
        self._last_meta = self.clock()
        if self.config.group_export.enabled:
            self._groups = GroupExporter(
                self._admin, self.store, prefix=self.settings.s3.prefix, region=self.region,
                settings=self.config.group_export, own_group=self.config.group_id,
                metrics=self.m, wall=self.wall, tails=self._tails,
                topic_ids=self._meta.topic_id)
        self._heartbeats = HeartbeatPublisher(
            self.store, prefix=self.settings.s3.prefix, region=self.region,
            instance=str(self.settings.kafka.config.get("group.instance.id")
                         or socket.gethostname()),
            interval_of=lambda t: self.config.topic_settings(t).heartbeat_interval,
            metrics=self.m, wall=self.wall)
        # A position the source deleted (retention under a lagging consumer) stops the
        # partition with an event instead of a silent jump to the log start: egress reports
        # the exact lost range, then seeks (egress.poll_loop).
        overrides: dict[str, Any] = {"auto.offset.reset": "error"}
        if "partition.assignment.strategy" not in self.settings.kafka.config:
            # Incremental rebalancing: a member joining or leaving moves only the
            # partitions it takes or gives; the others keep their open segments.
            overrides["partition.assignment.strategy"] = DEFAULT_ASSIGNOR
        # librdkafka's prefetch is a share of max_buffered_bytes (egress.flow.Prefetch): its
        # defaults (a 64 MiB queue of up to 100 000 messages, plus a 50 MB fetch response)
        # held several times a small budget. Settings in kafka.config win.
        overrides.update(prefetch_overrides(self.config.max_buffered_bytes,
                                            self.settings.kafka.config))
        self._consumer = Consumer(self.settings.kafka, self.config.group_id,
                                  {**overrides, **self._consumer_overrides})
        self._loop = PollLoop(self._consumer, self._writers, self._commits, self._outcomes,
                              self.m, self.region,
                              FlowLimits.for_budget(
                                  segment_budget(self.config.max_buffered_bytes)),
                              self.clock, self._maybe_check_topics, self._log_start,
                              arrow_allocated_bytes, self._gate)
        self._loop.skip = origin_filter(self.config, self.m, self.region)
        if self.config.max_bytes_per_second:
            self._loop.throttle = TokenBucket(self.config.max_bytes_per_second, self.clock())
        self._subscribe(self._wanted)
        self._watch = DependencyWatch(
            [kafka_dependency(self.settings.kafka),
             s3_dependency(self.store, self.settings.s3.prefix, self.settings.s3.endpoint_url)],
            self.metrics, service="egress")
        self._watch.start()
        if self.settings.metrics.port:
            self._server = MetricsServer(self.metrics, self.settings.metrics.host,
                                         self.settings.metrics.port, healthy=self.healthy,
                                         ready=self.ready)
            self._server.start()
        log.info("egress started: group %s, topics %s, region %s", self.config.group_id,
                 ", ".join(sorted(self._wanted)) or "(none selected yet)", self.region)

    def run(self) -> None:
        """Poll until ``stop``; then close open segments (bounded) and commit.

        Raises:
            KafkaFatalError: the consumer reported a fatal error.
        """
        loop = self._loop
        assert loop is not None, "start() first"
        # Every consumed message is a GC-tracked object: with the default threshold (700)
        # the cyclic collector runs several times per consume batch and, in its older
        # generations, walks every message still buffered, which cost more CPU than all
        # the rest of the poll loop. Nothing here makes reference cycles, so collect
        # rarely while the loop runs (restored on exit).
        gc_threshold = gc.get_threshold()
        gc.set_threshold(GC_THRESHOLD, *gc_threshold[1:])
        try:
            while not self._stop.is_set():
                loop.turn()
        except ReplicatorError:
            self._failed = True
            raise
        finally:
            gc.set_threshold(*gc_threshold)
            self._release(list(self._writers), CloseReason.SHUTDOWN)
            # Nobody serves commits any more: late durability tasks fail theirs at once.
            self._commits.close()
        if self._fatal is not None:
            raise self._fatal

    def stop(self) -> None:
        """Ask ``run`` to return (signal-safe: only sets a flag)."""
        self._stop.set()

    def close(self) -> None:
        """Leave the group and release everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        for w in self._writers.values():
            w.cancel.set()
        if self._consumer is not None:
            try:
                self._consumer.close()
            except ReplicatorError as e:
                log.warning("closing the consumer failed: %s", e)
        if self._watch is not None:
            self._watch.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._mirror is not None:
            # After the upload pool: segments made durable at shutdown queue their copies.
            self._mirror.close(self.config.mirror.shutdown_timeout.total_seconds()
                               if self.config.mirror is not None else 0.0)
        if self._server is not None:
            self._server.close()
        log.info("egress closed")

    def encode_peak(self) -> int:
        """The most bytes segments and the encoders' reservations held at once
        (``egress.encode_gate``): what the budget bounds, without the Arrow allocations of
        other users of the process that ``replicator_egress_buffered_bytes_peak`` may count.
        """
        return self._gate.peak if self._gate is not None else 0

    def healthy(self) -> bool:
        """Alive: not failed, and the poll loop turned recently (or has not started)."""
        if self._failed:
            return False
        last = self._loop.last_poll if self._loop is not None else 0.0
        return last == 0.0 or time.monotonic() - last < 60.0

    def ready(self) -> bool:
        """Ready once the group assigned partitions and the loop is consuming them; not
        while a partition is stalled (its position left the source log and its log start
        cannot be read: egress.out_of_range), nor while Kafka or S3 does not answer
        (``replicator.core.reachability``).
        """
        if self._watch is not None and not self._watch.reachable:
            return False
        loop = self._loop
        last = loop.last_poll if loop is not None else 0.0
        stalled = loop.out_of_range.stalled if loop is not None else 0
        return self._assigned_once and self.healthy() and last > 0.0 and not stalled

    # --- assignment (rebalance callbacks, on the poll thread) -------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        ours = [tp for tp in partitions if tp.topic in self._limits]
        committed: list[TopicPartition] = []
        if ours:
            try:
                committed = consumer.committed(ours, timeout=30)
            except ReplicatorError as e:
                # Without the committed positions segments cannot be named; the rebalance
                # callback cannot retry, so the controller stops and the process restarts.
                self._failed = True
                self._fatal = e
                self._stop.set()
                log.error("%s", self._fatal)
                return
        assert self._ctx is not None
        # Fetch from exactly the positions read: left to the client, the fetch would start
        # at whatever is committed when it asks, and a stale commit landing in between (a
        # writer elsewhere that has not noticed it lost the partition) would make the
        # segment named from one offset hold records from another.
        topic_ids = self._topic_ids({tp.topic for tp in committed})
        committed = [own_incarnation(tp, topic_ids.get(tp.topic)) for tp in committed]
        try:
            start, fixed, archived = self._start_positions(consumer, committed, topic_ids)
        except ReplicatorError as e:
            self._failed = True
            self._fatal = e
            self._stop.set()
            log.error("reading where partitions without a commit start failed: %s", e)
            return
        try:
            consumer.assign_added([
                TopicPartition(tp.topic, tp.partition,
                               start.get((tp.topic, tp.partition), tp.offset))
                for tp in partitions])
        except ReplicatorError as e:
            self._failed = True
            self._fatal = e
            self._stop.set()
            log.error("assigning %s failed: %s", ", ".join(map(str, partitions)), e)
            return
        for tp in committed:
            key = (tp.topic, tp.partition)
            position = tp.offset if tp.offset >= 0 else None
            if key in fixed or key in archived:
                position = start[key]
            # Past records skipped by skip_origins, the commit's metadata keeps where the
            # next segment starts, so segments still touch (egress.commits).
            expected = None if position is None else next_segment_start(position,
                                                                         tp.metadata)
            ref = PartitionRef(self.settings.s3.prefix, self.region, tp.topic, tp.partition)
            # A commit egress made for a latest/time start is where the partition's history
            # begins, not a resume after segments (egress.commits.FIRST_POSITION).
            chosen = key in fixed or (position is not None and started_here(tp.metadata))
            self._writers[key] = PartitionWriter(
                ref, self._limits[tp.topic], expected, ctx=self._ctx,
                metrics=self.m.for_partition(self.region, tp.topic, tp.partition),
                commit=self._commits.committer(tp.topic, tp.partition), position=position,
                topic_id=topic_ids.get(tp.topic), resumed=position is not None and not chosen)
            if key in fixed:
                self._writers[key].commit_start()
            else:
                self._writers[key].record_resumed()
            log.info("%s[%d]: assigned, %s %s%s", tp.topic, tp.partition,
                     "starting at its first position" if chosen else "resuming at",
                     position if position is not None else "the first available offset "
                                                           "(no commit)",
                     f" (next segment from {expected}: the records between were skipped)"
                     if expected != position else "")
        self._assigned_once = True
        self.m.rebalances.labels(self.region, "assign").inc(len(committed))
        self.m.assigned.labels(self.region).set(len(self._writers))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        log.info("revoked: %s", ", ".join(f"{t}[{p}]" for t, p in keys))
        self.m.rebalances.labels(self.region, "revoke").inc(len(keys))
        self._release(keys, CloseReason.REVOKE)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        deleted = self._deleted_topics({t for t, _ in keys})
        if deleted:
            # The client noticed a topic deletion before the selection did and calls its
            # partitions lost; nobody else can own a deleted topic's partitions, so their
            # open segments are closed durably as on a revoke instead of aborted.
            log.info("source topics deleted, releasing their partitions: %s",
                     ", ".join(sorted(deleted)))
            self._release([k for k in keys if k[0] in deleted], CloseReason.REVOKE)
            keys = [k for k in keys if k[0] not in deleted]
            if not keys:
                return
        log.warning("lost (another member may own them now; open segments are aborted): %s",
                    ", ".join(f"{t}[{p}]" for t, p in keys))
        self.m.rebalances.labels(self.region, "lost").inc(len(keys))
        for k in keys:
            self._commits.retire(*k)
            w = self._writers.pop(k, None)
            if w is not None:
                w.cancel.set()
                w.discard_open()
        if self._loop is not None:
            self._loop.forget(keys)

    def _deleted_topics(self, topics: set[str]) -> set[str]:
        """Those of ``topics`` the cluster no longer has (none when it cannot be asked)."""
        if self._admin is None:
            return set()
        try:
            existing = set(self._admin.list_topics())
        except ReplicatorError as e:
            log.warning("cannot tell whether %s still exist: %s", ", ".join(sorted(topics)), e)
            return set()
        return topics - existing

    def _release(self, keys: Sequence[tuple[str, int]], reason: CloseReason) -> None:
        """Close the partitions' open segments durably within ``shutdown_timeout``, abort
        what cannot make it, and forget the partitions.
        """
        writers = [self._writers[k] for k in keys if k in self._writers]
        loop = self._loop
        if not writers or loop is None:
            return
        for w in writers:
            if w.failed is None and not w.broken.is_set():
                w.close(reason)
                w.commit_skipped(0.0, 0.0)   # no segment: commit past skipped records
            else:
                w.discard_open()
        deadline = time.monotonic() + self.config.shutdown_timeout.total_seconds()
        loop.wait_idle(writers, deadline)
        stuck = [w for w in writers if not w.queue.idle]
        for w in stuck:
            log.warning("%s: segments not durable within %s, aborting them", w.name,
                        self.config.shutdown_timeout)
            w.cancel.set()
        loop.wait_idle(stuck, time.monotonic() + CANCEL_GRACE)
        loop.drain_outcomes(self.clock())
        loop.forget([(w.ref.topic, w.ref.partition) for w in writers])
        for w in writers:
            # Whatever is still running for it (aborting) may no longer commit.
            self._commits.retire(w.ref.topic, w.ref.partition)
            self._writers.pop((w.ref.topic, w.ref.partition), None)
            log.info("%s: released (%s), committed offset %s", w.name, reason,
                     w.committed_offset)
        self.m.assigned.labels(self.region).set(len(self._writers))

    def _log_start(self, topic: str, partition: int) -> Future[int]:
        """Start reading the partition's log start offset (ListOffsets on the admin client,
        never the group consumer: egress.out_of_range explains why); returns at once.
        """
        assert self._admin is not None
        return self._admin.log_start(topic, partition, timeout=READ_TIMEOUT)


_OWN_TOPIC_FIELDS = ("checkpoint_topic", "segment_events_topic", "offset_map_topic")
"""Ingress's topics in the cluster it writes, which is also the cluster egress reads in an
active-active region: replicating them would copy one region's bookkeeping into another."""


def _own_topics(settings: Settings) -> set[str]:
    """The replicator's checkpoint, segment-events and offset-map topics, by their default
    names and the names this configuration's ``[ingress]`` gives them: internal, never
    selected by a pattern.
    """
    fields = IngressSettings.model_fields
    own = {str(fields[name].default) for name in _OWN_TOPIC_FIELDS}
    if settings.ingress is not None:
        own |= {str(getattr(settings.ingress, name)) for name in _OWN_TOPIC_FIELDS}
    return own
