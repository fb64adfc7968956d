"""The ingress controller: placement by group membership, one replay worker per partition,
all run by one fixed pool of threads (``ingress.scheduler``).

* A consumer in group ``ingress.group_id`` subscribes to the destination topics and pauses
  every partition at once: it never reads them, membership only decides placement. Owning
  destination partition ``p`` means replaying source partition ``p`` of every source
  mapped to that topic.
* Before a destination topic is subscribed, it is created (or grown) from the source's
  ``_topic.json``; a source whose topic cannot get enough partitions is stopped with an
  error and a metric.
* An ``SqsRelay`` thread moves S3 events from SQS to the segment-events topic; the main
  loop reads that whole topic and hands each event to the worker of its partition.

``start()`` connects and fails fast, ``run()`` blocks until ``stop()``, ``close()`` is
idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable

from formats.registry import get_format
from ingress.acks import SharedAcks, SharedAckSink
from ingress.checkpoints import CheckpointStore, FollowingCheckpointStore
from ingress.delivery import Delivery, delivery_for
from ingress.discovery import TopicDiscovery
from ingress.events import SegmentEvent
from ingress.heartbeats import HeartbeatReader
from ingress.incarnations import RECHECK, same_incarnation
from ingress.limits import DestinationLimits
from ingress.metrics import IngressMetrics
from ingress.offset_map import OffsetMapWriter, ensure_offset_map_topic
from ingress.origin import origin_marker
from ingress.ownership import Ownership
from ingress.permits import ByteBudget, FifoPermits
from ingress.relay import EventQueue, SqsRelay
from ingress.replica_stall import ReplicaStallWatch, UnacknowledgedWatch
from ingress.scheduler import Scheduler
from ingress.segment_events import KafkaSegmentEvents, SegmentEvents
from ingress.sink import ReplaySink
from ingress.throttle import ProduceThrottle
from ingress.topic_meta_cache import TopicMetaCache
from ingress.topics import SourceState, TopicAdmin, check_sources, ensure_internal_topics
from ingress.transactions import TransactionLoop
from ingress.txn_sink import SharedTxnSink
from ingress.worker import ReplayWorker
from ingress.worker_config import WorkerConfig
from replicator.core.batch_limits import message_limit
from replicator.core.clock import Clock, utc_now
from replicator.core.errors import ConfigError, ReplicatorError
from replicator.core.kafka import Admin, Consumer, GroupMetadata, TopicPartition
from replicator.core.keys import PartitionRef
from replicator.core.metrics import Metrics, MetricsServer
from replicator.core.reachability import (
    DependencyWatch,
    kafka_dependency,
    s3_dependency,
    sqs_dependency,
)
from replicator.core.settings import IngressSettings, IngressSourceSettings, Settings
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

POOL_EXTRA = 4
"""Replay pool threads beyond ``max_parallel_replays``: the replays in progress hold one
each, these run every other step (session starts, listings, lost ranges, waits)."""

PENDING_TOPIC_CHECK = 1.0
"""Seconds between _topic.json reads while a source has none yet."""

WorkerId = tuple[str, str, int]
"""(source region, source topic, partition)."""


class Ingress:
    """Replays segments of the configured sources into this region's Kafka cluster.

    Args:
        settings: the process settings (``[ingress]`` required).
        store: the destination bucket (default: ``S3ObjectStore.from_settings``).
        queue: the SQS queue of the bucket's events (default: ``SqsQueue.from_settings``).
        metrics: the registry (default: a new one).
        events: the segment-events seam (default: the Kafka topic).
        checkpoints: the checkpoint reader (default: the Kafka topic).
        admin: topic administration (default: ``replicator.core.kafka.Admin``).
        make_sink: builds a worker's sink from (source, destination topic, partition).
        clock: wall clock for planning and lag.
    """

    def __init__(self, settings: Settings, *, store: ObjectStore | None = None,
                 queue: EventQueue | None = None, metrics: Metrics | None = None,
                 events: SegmentEvents | None = None,
                 checkpoints: CheckpointStore | None = None, admin: TopicAdmin | None = None,
                 make_sink: Callable[[IngressSourceSettings, str, int], ReplaySink] | None
                 = None, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.cfg: IngressSettings = settings.require("ingress")
        self.store = store
        self.queue = queue
        self.metrics = metrics or Metrics()
        self.m = IngressMetrics.create(self.metrics, settings.region)
        self.events = events
        self.checkpoints = checkpoints
        self.admin = admin
        self._make_sink = make_sink
        self.clock = clock
        self._topic_meta: TopicMetaCache | None = None
        """Each source topic's ``_topic.json`` read once per ``RECHECK`` for all workers."""
        # Replay reads each segment's format from its own bytes; a wrong ``format.name``
        # is still a configuration error here, as in egress (one file serves both).
        get_format(settings.format.name)
        # The durability protocol of every worker of this process, chosen once.
        self._delivery: type[Delivery] = delivery_for(self.cfg.delivery)
        self.sources = {(s.region, s.name): SourceState(s) for s in self.cfg.sources
                        if s.topic is not None}
        # Entries with topic_pattern add sources to self.sources as their topics appear.
        self.discovery = TopicDiscovery(self.cfg, settings.s3.prefix, self.m)
        self.workers: dict[WorkerId, ReplayWorker] = {}
        self._epochs: dict[WorkerId, int] = {}
        """Each running worker's ownership epoch (``Ownership.epoch``), retired when it stops."""
        # Segments replayed at once, whatever the partition count: bounds memory.
        # Granted in the order asked (FIFO), so no partition starves during a catch-up.
        self._permits = FifoPermits(self.cfg.max_parallel_replays)
        # Decoded records not committed yet (a batch waiting for its transaction holds no
        # slot): bounds memory whatever the number of partitions waiting.
        self.budget = ByteBudget(self.cfg.max_bytes_in_flight)
        # Every worker's steps run here: threads do not grow with partitions
        # (ingress/README.md, "Threads").
        self.scheduler = Scheduler(self.cfg.max_parallel_replays + POOL_EXTRA, name="replay")
        self.assigned: set[tuple[str, int]] = set()
        self.subscribed: frozenset[str] = frozenset()
        self.consumer: Consumer | None = None
        # The process's one producer (docs: ingress/README.md, "Producer and fencing").
        self.ownership = Ownership()
        # Each destination topic's max.message.bytes: batches cut to fit it.
        self.limits = DestinationLimits.for_config(settings.kafka.config)
        self.limits.on_change(self._limit_changed)
        self.transactions: list[TransactionLoop] = []
        self._checkpoint_reader: FollowingCheckpointStore | None = None
        self.shared_acks: SharedAcks | None = None
        self.relay: SqsRelay | None = None
        self._relay_thread: threading.Thread | None = None
        self._server: MetricsServer | None = None
        self._watch: DependencyWatch | None = None
        """Kafka, S3 and SQS asked every few seconds while running (``/readyz``)."""
        self._stopping = threading.Event()
        self._started = False
        self._closed = False
        self._failed = False
        self._next_topic_check = 0.0
        self.heartbeats: HeartbeatReader | None = None

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Connect to S3, SQS and Kafka; create the internal topics; start the relay.

        Raises:
            ReplicatorError: anything that makes running impossible (fail fast).
        """
        s = self.settings
        if s.metrics.port:
            self._server = MetricsServer(self.metrics, s.metrics.host, s.metrics.port,
                                         healthy=self.healthy, ready=self.ready)
            self._server.start()
        if self.store is None:
            from replicator.core.s3 import S3ObjectStore

            self.store = S3ObjectStore.from_settings(s)
        if self.queue is None:
            from replicator.core.sqs import SqsQueue

            self.queue = SqsQueue.from_settings(s)
        queue: EventQueue = self.queue
        if self.admin is None:
            self.admin = Admin(s.kafka)
        ensure_internal_topics(self.admin, events_topic=self.cfg.segment_events_topic,
                               events_retention=self.cfg.segment_events_retention,
                               checkpoint_topic=self.cfg.checkpoint_topic)
        if self.events is None:
            ev = KafkaSegmentEvents(s.kafka, self.cfg.segment_events_topic, self.m)
            ev.start_reader()
            self.events = ev
        if self.checkpoints is None:
            # One reader per process, loaded once and followed: workers load from memory.
            reader = FollowingCheckpointStore(s.kafka, self.cfg.checkpoint_topic,
                                              self.metrics)
            reader.start()
            self._checkpoint_reader = reader
            self.checkpoints = reader
        self.consumer = Consumer(s.kafka, self.cfg.group_id, {"enable.partition.eof": False})
        if self._make_sink is None:
            self._start_producer()
        self.relay = SqsRelay(
            queue, self.events, self.m, bucket=s.s3.bucket, prefix=s.s3.prefix,
            sources=self.discovery.filter, max_messages=self.cfg.sqs_max_messages,
            wait_seconds=int(self.cfg.sqs_wait_time.total_seconds()))
        relay = self.relay
        self._relay_thread = threading.Thread(target=relay.run, args=(self._stopping,),
                                              name="sqs-relay", daemon=True)
        self._relay_thread.start()
        self._watch = DependencyWatch(
            [kafka_dependency(s.kafka), s3_dependency(self.store, s.s3.prefix, s.s3.endpoint_url),
             sqs_dependency(queue, self.cfg.sqs_endpoint_url or s.s3.endpoint_url)],
            self.metrics, service="ingress")
        self._watch.start()
        self._started = True
        log.info("ingress started: %d source(s), delivery %s, group %s", len(self.sources),
                 self.cfg.delivery, self.cfg.group_id)

    def transactional_id(self, n: int = 0) -> str:
        """``{group_id}.{instance}.{n}`` of producer ``n`` (``ingress.producers``): see
        ``ingress.instance_id``.
        """
        instance = self.cfg.instance_id or str(
            self.settings.kafka.config.get("group.instance.id") or socket.gethostname())
        return f"{self.cfg.group_id}.{instance}.{n}"

    def _start_producer(self) -> None:
        throttle = None
        if self.cfg.max_bytes_per_second:
            throttle = ProduceThrottle(self.cfg.max_bytes_per_second,
                                       self.m.throttled.labels(self.settings.region))
        if self.cfg.delivery == "exactly-once":
            offset_map = None
            if self.cfg.offset_map:
                assert self.admin is not None
                ensure_offset_map_topic(self.admin, self.cfg.offset_map_topic)
                offset_map = OffsetMapWriter(self.cfg.offset_map_topic, self.m,
                                             topic_ids=self.admin.topic_id)
            # A small fixed pool: destination partition p is written by producer
            # p % producers, so its transactions stay in order, and several transactions
            # can be in flight at once (each waits a few broker round trips). One producer
            # per destination partition also keeps each batch's records consecutive there
            # (the offset map relies on it).
            for n in range(self.cfg.producers):
                loop = TransactionLoop(
                    self.settings.kafka, transactional_id=self.transactional_id(n),
                    checkpoint_topic=self.cfg.checkpoint_topic, ownership=self.ownership,
                    group=self._group_metadata, metrics=self.m, offset_map=offset_map,
                    limits=self.limits,
                    linger=self.cfg.transaction_linger.total_seconds(),
                    senders=self._senders(n), name=f"transactions-{n}")
                loop.throttle = throttle
                loop.start()
                self.transactions.append(loop)
        else:
            kafka = self.settings.kafka
            self.shared_acks = SharedAcks(
                kafka, limits=self.limits,
                unacknowledged=UnacknowledgedWatch(ReplicaStallWatch(
                    lambda: Admin(kafka, timeout=5.0), self.m.destination_stalled)))
            self.shared_acks.throttle = throttle
            self.shared_acks.start()

    def _senders(self, n: int) -> Callable[[], int]:
        """How many workers write through transactional producer ``n`` now (each has at
        most one batch waiting for a transaction): its linger ends once all of them have
        handed one over (``TransactionLoop``, ``senders``).
        """
        producers = self.cfg.producers
        return lambda: sum(1 for wid in list(self.workers) if wid[2] % producers == n)

    def _group_metadata(self) -> GroupMetadata:
        consumer = self.consumer
        if consumer is None:
            raise ReplicatorError("the placement consumer is closed")
        return consumer.group_metadata()

    def run(self) -> None:
        """Place workers and dispatch events until ``stop()``."""
        if not self._started:
            self.start()
        try:
            while not self._stopping.is_set():
                if time.monotonic() >= self._next_topic_check:
                    try:
                        self._check_topics()
                    except ReplicatorError as e:
                        # Broker or store unavailable: placement stays as it is; retried
                        # at the next check.
                        log.error("checking destination topics failed, retrying in %s: %s",
                                  self.cfg.topic_check_interval, e)
                    self._next_topic_check = time.monotonic() + self._topic_check_delay()
                    self._read_heartbeats()
                if self.subscribed:
                    assert self.consumer is not None
                    for err in self.consumer.poll(0.05).errors:
                        if isinstance(err, ConfigError):
                            raise err  # e.g. a session timeout the broker refuses: exit 2
                        log.warning("placement consumer: %s", err)
                assert self.events is not None
                for ev in self.events.poll(0.05 if self.subscribed else 0.2):
                    self._dispatch(ev)
                self._reconcile()
        except BaseException:
            self._failed = True
            raise
        finally:
            self._stop_workers(list(self.workers))

    def stop(self) -> None:
        """Ask ``run`` to return (signal-safe)."""
        self._stopping.set()

    def close(self) -> None:
        """Stop workers and the relay, close clients; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self._watch is not None:
            self._watch.close()
        self._stop_workers(list(self.workers))
        self.scheduler.close()
        for loop in self.transactions:
            loop.close()
        if self._checkpoint_reader is not None:
            self._checkpoint_reader.close()
        if self.consumer is not None:
            try:
                self.consumer.close()
            except ReplicatorError as e:
                log.warning("closing the placement consumer: %s", e)
            self.consumer = None
        if self._relay_thread is not None:
            # The relay may sit in a long poll of up to sqs_wait_time.
            self._relay_thread.join(self.cfg.sqs_wait_time.total_seconds() + 5)
        if self.events is not None:
            self.events.close()
        if self._server is not None:
            self._server.close()
        log.info("ingress closed")

    # --- topics and placement ---------------------------------------------------------

    def _topic_check_delay(self) -> float:
        # While a source still waits for its _topic.json, look every second (one small GET
        # per waiting source): replay should start as soon as egress wrote it.
        interval = self.cfg.topic_check_interval.total_seconds()
        if any(st.partitions is None for st in self.sources.values()):
            return min(interval, PENDING_TOPIC_CHECK)
        return interval

    def _check_topics(self) -> None:
        """Read each source's ``_topic.json``; create/grow destinations; (re)subscribe."""
        assert self.store is not None and self.admin is not None
        found = self.discovery.run(self.store)
        for key in found.withdrawn:   # refused now: the same on every instance (topic_sets)
            self._stop_workers([w for w in self.workers if w[:2] == key])
            del self.sources[key]
            with contextlib.suppress(KeyError):
                self.m.source_not_started.remove(*key)
        for src in found.added:
            self.sources[(src.region, src.name)] = SourceState(src)
        ready = check_sources(self.sources.values(), self.store, self.admin,
                              self.settings.s3.prefix, self.m,
                              align=self.cfg.align_destination_configs)
        for (region, topic), st in self.sources.items():
            self.m.source_not_started.labels(region, topic).set(int(st.partitions is None))
        if ready != self.subscribed:
            assert self.consumer is not None
            log.info("subscribing to destination topics %s", sorted(ready))
            self.subscribed = ready
            if ready:
                self.consumer.subscribe(sorted(ready), on_assign=self._on_assign,
                                        on_revoke=self._on_revoke, on_lost=self._on_lost)
            else:
                self.consumer.unsubscribe()
        self._read_limits(ready)

    def _read_limits(self, topics: Iterable[str]) -> None:
        """Read each destination topic's max.message.bytes (``ingress.limits``)."""
        assert self.admin is not None
        for dest in sorted(topics):
            try:
                configs = self.admin.effective_topic_config(dest)
            except ReplicatorError as e:
                log.warning("reading the configs of destination topic %s: %s", dest, e)
                continue
            self.limits.update(dest, message_limit(configs))

    def _limit_changed(self, topic: str) -> None:
        """``topic``'s max.message.bytes changed: its partitions stopped at a refused
        record try again now.
        """
        log.info("destination topic %s: max.message.bytes is now %s", topic,
                 self.limits.limit(topic))
        for w in list(self.workers.values()):
            if w.cfg.destination_topic == topic:
                w.retry_refused()

    def _read_heartbeats(self) -> None:
        """Read the sources' egress heartbeats; a worker replayed up to a partition's
        caught-up position is fresh as of its heartbeat (ingress.heartbeats).
        """
        if self.store is None:
            return
        if self.heartbeats is None:
            self.heartbeats = HeartbeatReader(self.store, self.settings.s3.prefix, self.m,
                                              self.clock)
        self.heartbeats.refresh(list(self.sources))
        for (region, topic, partition), w in list(self.workers.items()):
            beat = self.heartbeats.caught_up((region, topic), partition)
            position = w.position
            if beat is not None and position is not None and position >= beat.position \
                    and same_incarnation(beat.topic_id, w.incarnations.topic_id(),
                                         w.incarnations.live_id()):
                w.freshness.heartbeat(beat.written_at)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # With cooperative-sticky only the added partitions arrive here (added with
        # incremental_assign); eager assignment replaces the whole set.
        consumer.assign_added(partitions)
        consumer.pause(partitions)  # membership only: the destination is never read
        for tp in partitions:
            self.assigned.add((tp.topic, tp.partition))
        self.ownership.grant(tp.key for tp in partitions)
        log.info("assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        log.info("revoked %s", ", ".join(f"{t}[{p}]" for t, p in sorted(gone)))
        self.assigned -= gone
        self._stop_workers([w for w in self.workers
                            if (self._dest_of(w), w[2]) in gone], release=gone)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """This member's session expired: another member may own these partitions already,
        so nothing waits for batches in flight. Exactly-once is fenced by ``ownership``
        as on a revoke; at-least-once workers are purged at once (their unacknowledged
        records are redone by the next owner: duplicates, never records of this process
        arriving beside the new owner's for ``revoke_timeout``).
        """
        gone = {(tp.topic, tp.partition) for tp in partitions}
        log.warning("lost %s (another member may own them now)",
                    ", ".join(f"{t}[{p}]" for t, p in sorted(gone)))
        self.assigned -= gone
        self._stop_workers([w for w in self.workers
                            if (self._dest_of(w), w[2]) in gone], release=gone,
                           purge_now=not self.transactions)

    def _dest_of(self, wid: WorkerId) -> str:
        return self.sources[(wid[0], wid[1])].source.destination

    def _desired(self) -> set[WorkerId]:
        out: set[WorkerId] = set()
        for st in self.sources.values():
            if st.stopped or st.partitions is None:
                continue
            src = st.source
            for topic, p in self.assigned:
                if topic == src.destination and p < st.partitions:
                    out.add((src.region, src.name, p))
        return out

    def _reconcile(self) -> None:
        for wid, w in list(self.workers.items()):
            if not w.alive:
                del self.workers[wid]
                self.ownership.retire(self._epochs.pop(wid, 0), 0.0)
        desired = self._desired()
        extra = [w for w in self.workers if w not in desired]
        if extra:
            self._stop_workers(extra)
        for wid in sorted(desired - set(self.workers)):
            self._start_worker(wid)

    def _start_worker(self, wid: WorkerId) -> None:
        assert self.store is not None and self.checkpoints is not None
        src = self.sources[(wid[0], wid[1])].source
        # The grant this worker belongs to: its batches never commit under a later one.
        epoch = self.ownership.epoch((src.destination, wid[2])) or 0
        self._epochs[wid] = epoch
        ref = PartitionRef(self.settings.s3.prefix, src.region, src.name, wid[2])
        cfg = WorkerConfig(source=src, ref=ref, destination_topic=src.destination,
                           delivery=self._delivery,
                           batch_size=self.cfg.batch_size,
                           batch_bytes=self.cfg.batch_bytes,
                           rescan_interval=self.cfg.rescan_interval,
                           origin=origin_marker(self.cfg, src.region), limits=self.limits)
        if self._topic_meta is None:
            self._topic_meta = TopicMetaCache(self.store, RECHECK)
        worker = ReplayWorker(cfg, store=self.store, checkpoints=self.checkpoints,
                              make_sink=lambda: self._sink(src, wid[2], epoch), metrics=self.m,
                              scheduler=self.scheduler, clock=self.clock,
                              permits=self._permits, budget=self.budget,
                              topic_meta=self._topic_meta)
        self.workers[wid] = worker
        self.scheduler.start()     # with the first worker (idempotent)
        worker.start()

    def _sink(self, src: IngressSourceSettings, partition: int, epoch: int) -> ReplaySink:
        if self._make_sink is not None:
            return self._make_sink(src, src.destination, partition)
        if self.transactions:
            loop = self.transactions[partition % len(self.transactions)]
            return SharedTxnSink(loop, topic=src.destination, partition=partition,
                                 epoch=epoch)
        assert self.shared_acks is not None
        return SharedAckSink(self.shared_acks, topic=src.destination, partition=partition,
                             checkpoint_topic=self.cfg.checkpoint_topic)

    def _stop_workers(self, ids: list[WorkerId],
                      release: set[tuple[str, int]] | None = None,
                      purge_now: bool = False) -> None:
        """Stop workers, each within ``revoke_timeout``; with ``release`` (the revoke
        callback), first take those partitions from ``ownership``: no transaction with a
        batch of theirs commits after this returns (ingress/README.md, point 1). With
        ``purge_now`` (lost partitions, at-least-once) their producers' queued records are
        dropped at once instead of after the deadline.
        """
        workers = [(wid, self.workers.pop(wid)) for wid in ids if wid in self.workers]
        for _, w in workers:
            w.stop()
            if purge_now:
                w.purge()
        deadline = time.monotonic() + self.cfg.revoke_timeout.total_seconds()
        if release and not self.ownership.revoke(release, self.cfg.revoke_timeout
                                                 .total_seconds()):
            log.warning("a commit containing revoked partition(s) %s was still running after "
                        "%s; the next owner's checkpoint load waits for its end",
                        ", ".join(f"{t}[{p}]" for t, p in sorted(release)),
                        self.cfg.revoke_timeout)
        # Every stop path, not only a revoke (a source no longer wanted, a partition count
        # changed, shutdown): the partition may stay owned, and a worker started for it
        # later must not share this one's epoch, or a batch of this one still waiting in
        # a transaction could commit beside the new worker's.
        for wid, _ in workers:
            if not self.ownership.retire(self._epochs.pop(wid, 0),
                                         max(0.0, deadline - time.monotonic())):
                log.warning("worker %s/%s[%d]: a commit containing its batch was still "
                            "running after %s", wid[0], wid[1], wid[2],
                            self.cfg.revoke_timeout)
        for wid, w in workers:
            if not w.join(max(0.0, deadline - time.monotonic())):
                # Before the partition is released (this runs in the revoke callback): an
                # idempotent producer has no fencing, so its queued records would still be
                # delivered beside the next owner's.
                log.error("worker %s/%s[%d] did not stop within %s; its producer is purged "
                          "and closed before the partition is released", wid[0], wid[1],
                          wid[2], self.cfg.revoke_timeout)
                w.purge()

    def _dispatch(self, ev: SegmentEvent) -> None:
        k = ev.key
        w = self.workers.get((k.region, k.topic, k.partition))
        if w is not None:
            w.offer(ev)
        elif (k.region, k.topic) not in self.sources and self.discovery.wants(k.region,
                                                                                k.topic):
            # A topic a pattern selects, not discovered yet: look now, not in an interval
            # (its worker lists the segments when it starts, this one included).
            self.discovery.poke()
            self._next_topic_check = 0.0

    # --- introspection (tests, CLI) -----------------------------------------------------

    def positions(self) -> dict[WorkerId, int | None]:
        """Newest checkpoint of each running worker (sent after its records were
        acknowledged, or committed with them).
        """
        return {wid: w.checkpointed for wid, w in self.workers.items()}

    def healthy(self) -> bool:
        """/healthz: ``run`` has not failed, the SQS relay thread and every transaction
        loop's thread are alive (a dead loop fails every batch handed to it) and the
        checkpoint reader has not failed (every load would fail until a restart).
        """
        stopping = self._stopping.is_set()
        relay_ok = self._relay_thread is None or self._relay_thread.is_alive() or stopping
        loops_ok = stopping or all(t.alive for t in self.transactions if t.started)
        reader_ok = self._checkpoint_reader is None or not self._checkpoint_reader.failed
        return not self._failed and relay_ok and loops_ok and reader_ok

    def ready(self) -> bool:
        """/readyz: started, healthy, placed in the group (subscribed), and no owned
        partition stalled (its producer fenced again and again), and Kafka, S3 and SQS
        answer (``replicator.core.reachability``).
        """
        if self._watch is not None and not self._watch.reachable:
            return False
        return self._started and self.healthy() and bool(self.subscribed) and \
            not self.stalled()

    def refused(self) -> dict[WorkerId, str]:
        """Partitions stopped at a record their destination refuses, with why."""
        return {wid: str(w.refused) for wid, w in sorted(list(self.workers.items()))
                if w.refused is not None}

    def stalled(self) -> list[WorkerId]:
        """Partitions whose replay is stalled (see ``PartitionStatus.fenced``)."""
        return sorted(wid for wid, w in list(self.workers.items()) if w.stalled)

    @property
    def failed(self) -> bool:
        """True once ``run`` ended with an error."""
        return self._failed

