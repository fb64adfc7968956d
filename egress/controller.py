"""The egress controller: source topics into level-0 segments on S3 (SPEC 1-3).

One poll thread runs the consumer (``run``): it groups each consumed batch by partition,
hands the runs to the partition writers, closes segments by age and memory, pauses
partitions that cannot keep up and rewinds partitions whose segment failed. Uploads,
closes and commits run on a small pool (``egress.upload_threads``), so the poll loop keeps
polling within ``max.poll.interval.ms`` whatever S3 does.

Lifecycle: the constructor stores; ``start`` connects (S3 store, admin, consumer, metrics
server) and fails fast; ``run`` blocks until ``stop``; ``close`` is idempotent.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from egress.metrics import EgressMetrics
from egress.partition_writer import (
    PartitionWriter,
    SegmentOutcome,
    WriterContext,
)
from egress.rotation import (
    CloseReason,
    SegmentLimits,
    memory_pressure,
    pick_memory_victims,
    should_rotate,
)
from egress.topic_meta import topic_metadata
from formats.base import WriterOptions
from formats.registry import get_format, use_memory_pool
from replicator.core.errors import KafkaRetriableError, ReplicatorError
from replicator.core.kafka import (
    Admin,
    KafkaException,
    Message,
    TopicPartition,
    make_consumer,
    message_error,
    translate,
)
from replicator.core.keys import PartitionRef, topic_meta_key
from replicator.core.metrics import Metrics, MetricsServer
from replicator.core.retry import RetryPolicy, retry
from replicator.core.settings import EgressSettings, Settings
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

CONSUME_BATCH = 2000
"""Messages per ``consume`` call: large enough to amortise the call, small enough that one
batch is a negligible addition to the memory budget."""
POLL_TIMEOUT = 0.1
"""Seconds a ``consume`` call waits when idle; bounds how late an age rotation fires."""
TICK_INTERVAL = 0.02
"""Age, memory and pause decisions run at most this often (they walk every partition)."""
GAUGE_INTERVAL = 1.0
MEMORY_RESUME_RATIO = 0.8
"""A process paused for memory resumes below this share of ``max_buffered_bytes``."""
BACKLOG_SHARE = 4
"""A partition is paused while its batches waiting for the encoder exceed
``max_buffered_bytes / BACKLOG_SHARE``."""
MAX_CLOSING = 4
"""A partition with this many segments waiting to become durable is paused. Their bytes
count against ``max_buffered_bytes`` anyway; at 2, small segments closing faster than a
loaded machine encoded them paused partitions (and threw their prefetch away) in one run out
of two, a fifth of the throughput."""
GC_THRESHOLD = 200_000
"""Allocations between young-generation collections while the poll loop runs."""
CANCEL_GRACE = 5.0
"""Seconds cancelled segment tasks get to abort their uploads before the partition is
released anyway (a worker blocked in a request finishes the abort on its own later)."""
COMMIT_POLICY = RetryPolicy(attempts=3, initial=timedelta(milliseconds=100))
COMMIT_WAIT = 120.0
"""Seconds a worker waits for the poll thread to serve its commit (far above a poll turn)."""


def _default_retry() -> RetryPolicy:
    # Steps 1-3 of the durability method: ~3 s of retries absorb S3 blips; a longer outage
    # fails the segment and the partition rewinds with the same growing backoff (capped at
    # one minute) while the other partitions keep flowing.
    return RetryPolicy(attempts=5, initial=timedelta(milliseconds=200),
                       maximum=timedelta(seconds=60))


class Egress:
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
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 retry_policy: RetryPolicy | None = None,
                 consumer_overrides: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.config: EgressSettings = settings.require("egress")
        self.region = settings.region
        self.metrics = metrics or Metrics()
        self.m = EgressMetrics(self.metrics)
        self.fmt = get_format(settings.format.name)
        self.store = store
        self.clock = clock
        self.wall = wall
        self.retry_policy = retry_policy or _default_retry()
        self._consumer_overrides = dict(consumer_overrides or {})
        self._limits = {t: SegmentLimits.from_settings(s) for t, s in self.config.topics.items()}
        self._writers: dict[tuple[str, int], PartitionWriter] = {}
        self._outcomes: queue.SimpleQueue[SegmentOutcome] = queue.SimpleQueue()
        self._commit_requests: queue.SimpleQueue[tuple[str, int, int, Future[None]]] = \
            queue.SimpleQueue()
        self._stop = threading.Event()
        self._loop_done = threading.Event()
        self._paused: set[tuple[str, int]] = set()
        self._memory_paused = False
        self._consumer: Any = None
        self._admin: Admin | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._ctx: WriterContext | None = None
        self._server: MetricsServer | None = None
        self._partition_counts: dict[str, int] = {}
        self._meta_running = threading.Lock()
        self._last_tick = 0.0
        self._last_gauges = 0.0
        self._last_meta = 0.0
        self._last_poll = 0.0
        self._assigned_once = False
        self._failed = False
        self._fatal: ReplicatorError | None = None
        self._closed = False
        # A partition whose encoder falls this far behind is paused, so one slow partition
        # cannot take the whole budget. Not lower: a partition's backlog grows by a row
        # group's worth while that group is compressed, and every pause throws away what
        # librdkafka had prefetched for the partition (measured: a budget/16 limit paused
        # partitions several times a second and cost a quarter of the throughput).
        self._backlog_limit = max(4 * 1024**2, self.config.max_buffered_bytes // BACKLOG_SHARE)
        self._min_victim = min(1024**2, self.config.max_buffered_bytes // 64)

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
        assert self.store is not None
        # Arrow's default allocator (mimalloc) keeps freed memory in per-thread heaps, so
        # RSS grew with the partition count although the bytes held stayed within
        # max_buffered_bytes (bench/egress_memory.py, 256 MiB budget: 256 partitions grew
        # 754 MB with mimalloc, 452 MB with the system allocator, at the same throughput).
        use_memory_pool(self.config.memory_pool)
        self._pool = ThreadPoolExecutor(self.config.upload_threads,
                                        thread_name_prefix="egress-upload")
        f = self.settings.format
        self._ctx = WriterContext(
            store=self.store, fmt=self.fmt,
            options=WriterOptions(f.compression, f.compression_level, f.created_by,
                                  f.row_group_size),
            temp_prefix=self.settings.s3.temp_prefix,
            storage_class=self.settings.s3.storage_class_for(0),
            pool=self._pool, report=self._outcomes.put, clock=self.clock, wall=self.wall,
            retry_policy=self.retry_policy)
        self._admin = Admin(self.settings.kafka)
        self._check_topics()
        self._last_meta = self.clock()
        self._consumer = make_consumer(self.settings.kafka, self.config.group_id,
                                       self._consumer_overrides)
        self._consumer.subscribe(sorted(self.config.topics), on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        if self.settings.metrics.port:
            self._server = MetricsServer(self.metrics, self.settings.metrics.host,
                                         self.settings.metrics.port, healthy=self.healthy,
                                         ready=self.ready)
            self._server.start()
        log.info("egress started: group %s, topics %s, region %s", self.config.group_id,
                 ", ".join(sorted(self.config.topics)), self.region)

    def run(self) -> None:
        """Poll until ``stop``; then close open segments (bounded) and commit.

        Raises:
            KafkaFatalError: the consumer reported a fatal error.
        """
        consumer = self._consumer
        assert consumer is not None, "start() first"
        # Every consumed message is a GC-tracked object: with the default threshold (700)
        # the cyclic collector runs several times per consume batch and, in its older
        # generations, walks every message still buffered, which cost more CPU than all
        # the rest of the poll loop. Nothing here makes reference cycles, so collect
        # rarely while the loop runs (restored on exit).
        gc_threshold = gc.get_threshold()
        gc.set_threshold(GC_THRESHOLD, *gc_threshold[1:])
        try:
            while not self._stop.is_set():
                try:
                    msgs = consumer.consume(num_messages=CONSUME_BATCH, timeout=POLL_TIMEOUT)
                except KafkaException as e:
                    raise translate(e, "consume") from e
                now = self.clock()
                self._last_poll = time.monotonic()
                if msgs:
                    self._dispatch(msgs, now)
                self._serve_commits()
                self._drain_outcomes(now)
                if now - self._last_tick >= TICK_INTERVAL:
                    self._last_tick = now
                    self._tick(now)
        except ReplicatorError:
            self._failed = True
            raise
        finally:
            gc.set_threshold(*gc_threshold)
            self._release(list(self._writers), CloseReason.SHUTDOWN)
            # Nobody serves commits any more: late durability tasks fail theirs at once.
            self._loop_done.set()
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
            except KafkaException as e:
                log.warning("closing the consumer failed: %s", translate(e, "close consumer"))
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._server is not None:
            self._server.close()
        log.info("egress closed")

    def healthy(self) -> bool:
        """Alive: not failed, and the poll loop turned recently (or has not started)."""
        if self._failed:
            return False
        return self._last_poll == 0.0 or time.monotonic() - self._last_poll < 60.0

    def ready(self) -> bool:
        """Ready once the group assigned partitions and the loop is consuming them."""
        return self._assigned_once and self.healthy() and self._last_poll > 0.0

    # --- the poll thread --------------------------------------------------------------

    def _dispatch(self, msgs: Sequence[Message], now: float) -> None:
        runs: dict[tuple[str | None, int | None], list[Message]] = {}
        for m in msgs:
            if m.error() is not None:
                self._consume_error(m)
                continue
            k = (m.topic(), m.partition())
            run = runs.get(k)
            if run is None:
                runs[k] = [m]
            else:
                run.append(m)
        for (topic, partition), run in runs.items():
            w = self._writers.get((topic, partition))  # type: ignore[arg-type]
            if w is None:
                # Delivered just before a revoke took effect: the next owner reads them.
                log.debug("%s[%s]: %d messages of a partition not assigned here dropped",
                          topic, partition, len(run))
                self.m.dropped.labels(self.region, str(topic), str(partition)).inc(len(run))
                continue
            w.append(run, now)

    def _consume_error(self, m: Message) -> None:
        err = message_error(m)
        if err is None:
            return  # partition EOF
        self.m.consume_errors.labels(self.region).inc()
        if isinstance(err, KafkaRetriableError):
            log.warning("consumer: %s", err)
            return
        raise err

    def _drain_outcomes(self, now: float) -> None:
        while True:
            try:
                o = self._outcomes.get_nowait()
            except queue.Empty:
                return
            o.writer.outcome(o, now)

    def _tick(self, now: float) -> None:
        writers = list(self._writers.values())
        for w in writers:
            seg = w.segment
            if seg is not None:
                reason = should_rotate(seg.stats(), w.limits, now)
                if reason is not None:
                    w.close(reason)
        self._apply_memory_budget(writers)
        for w in writers:
            if w.ready_to_rewind(now):
                self._rewind(w)
        self._apply_pauses(writers)
        if now - self._last_gauges >= GAUGE_INTERVAL:
            self._last_gauges = now
            self._update_gauges(writers)
        if now - self._last_meta >= self.config.topic_metadata_interval.total_seconds():
            self._last_meta = now
            if self._pool is not None and not self._meta_running.locked():
                self._pool.submit(self._check_topics)

    def _apply_memory_budget(self, writers: Sequence[PartitionWriter]) -> None:
        budget = self.config.max_buffered_bytes
        open_held: dict[PartitionWriter, int] = {}
        in_flight = 0
        for w in writers:
            o, c = w.held_bytes()
            if w.segment is not None:
                open_held[w] = o
            in_flight += c
        # While paused for memory, close down to the resume level, or the pause (which
        # stops the growth that would otherwise trigger closes) could never end.
        target = int(budget * MEMORY_RESUME_RATIO) if self._memory_paused else budget
        victims = pick_memory_victims(open_held, target, in_flight=in_flight,
                                      min_victim_bytes=self._min_victim)
        for w in victims:
            log.info("%s: closing the open segment early (holds %d bytes; %d held in all, "
                     "budget %d)", w.name, open_held[w], sum(open_held.values()) + in_flight,
                     budget)
            w.close(CloseReason.MEMORY)
        held = sum(open_held.values()) + in_flight
        self._memory_paused = memory_pressure(held, budget, self._memory_paused,
                                              resume_ratio=MEMORY_RESUME_RATIO)
        self.m.buffered.labels(self.region).set(held)

    def _apply_pauses(self, writers: Sequence[PartitionWriter]) -> None:
        want: set[tuple[str, int]] = set()
        for w in writers:
            if (self._memory_paused or w.failed is not None or w.broken.is_set()
                    or len(w.closing) >= MAX_CLOSING
                    or w.backlog_bytes() >= self._backlog_limit):
                want.add((w.ref.topic, w.ref.partition))
        pause, resume = want - self._paused, self._paused - want
        if pause:
            self._consumer.pause([TopicPartition(t, p) for t, p in sorted(pause)])
            log.debug("paused %s", sorted(pause))
        if resume:
            self._consumer.resume([TopicPartition(t, p) for t, p in sorted(resume)])
            log.debug("resumed %s", sorted(resume))
        self._paused = want
        self.m.paused.labels(self.region).set(len(want))

    def _rewind(self, w: PartitionWriter) -> None:
        offset = w.rewind()
        tp = TopicPartition(w.ref.topic, w.ref.partition, offset)
        try:
            self._consumer.seek(tp)
        except KafkaException as e:
            # Not fatal: the partition stays where it is and is rewound again later.
            err = translate(e, f"seek {w.name} to {offset}")
            log.warning("%s: %s", w.name, err)
            return
        log.info("%s: rewound to offset %d after a failed segment", w.name, offset)

    def _update_gauges(self, writers: Sequence[PartitionWriter]) -> None:
        self.m.assigned.labels(self.region).set(len(writers))
        self.m.open_segments.labels(self.region).set(
            sum(len(w.closing) + (w.segment is not None) for w in writers))
        # The consumer's position is past transaction markers; the writers' next offset
        # is the last record's + 1. On a transactional source the high watermark ends with
        # a commit marker, so lag from the next offset alone never reached 0 (seen on
        # Apache Kafka: 1 per partition for good).
        try:
            positions = {(tp.topic, tp.partition): tp.offset for tp in self._consumer.position(
                [TopicPartition(w.ref.topic, w.ref.partition) for w in writers])}
        except KafkaException as e:
            log.debug("no consumer positions: %s", e)
            positions = {}
        for w in writers:
            if w.next_offset is None:
                continue
            try:
                # The cached watermark comes from the last fetch response: no request, and
                # for a read_committed consumer it is the last stable offset. (It is also
                # right on brokers whose ListOffsets "latest" is not, like Tansu.)
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(w.ref.topic, w.ref.partition), cached=True)
            except KafkaException as e:
                log.debug("%s: no cached watermark: %s", w.name, e)
                continue
            if high is not None and high >= 0:
                position = max(w.next_offset,
                               positions.get((w.ref.topic, w.ref.partition), -1))
                w.metrics.lag.set(max(0, high - position))

    # --- assignment -------------------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        ours = [tp for tp in partitions if tp.topic in self._limits]
        committed: list[Any] = []
        if ours:
            try:
                committed = consumer.committed(ours, timeout=30)
            except KafkaException as e:
                # Without the committed positions segments cannot be named; the rebalance
                # callback cannot retry, so the controller stops and the process restarts.
                self._failed = True
                self._fatal = translate(e, "read committed offsets at assignment")
                self._stop.set()
                log.error("%s", self._fatal)
                return
        assert self._ctx is not None
        for tp in committed:
            expected = tp.offset if tp.offset >= 0 else None
            ref = PartitionRef(self.settings.s3.prefix, self.region, tp.topic, tp.partition)
            self._writers[(tp.topic, tp.partition)] = PartitionWriter(
                ref, self._limits[tp.topic], expected, ctx=self._ctx,
                metrics=self.m.for_partition(self.region, tp.topic, tp.partition),
                commit=self._committer(tp.topic, tp.partition),
                low_watermark=self._low_watermark_reader(tp.topic, tp.partition))
            log.info("%s[%d]: assigned, resuming at %s", tp.topic, tp.partition,
                     expected if expected is not None else "the first available offset "
                                                           "(no commit)")
        self._assigned_once = True
        self.m.rebalances.labels(self.region, "assign").inc(len(committed))
        self.m.assigned.labels(self.region).set(len(self._writers))

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        log.info("revoked: %s", ", ".join(f"{t}[{p}]" for t, p in keys))
        self.m.rebalances.labels(self.region, "revoke").inc(len(keys))
        self._release(keys, CloseReason.REVOKE)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        log.warning("lost (another member may own them now; open segments are aborted): %s",
                    ", ".join(f"{t}[{p}]" for t, p in keys))
        self.m.rebalances.labels(self.region, "lost").inc(len(keys))
        for k in keys:
            w = self._writers.pop(k, None)
            if w is not None:
                w.cancel.set()
                w.discard_open()
        self._forget_pauses(keys)

    def _forget_pauses(self, keys: Sequence[tuple[str, int]]) -> None:
        # A pause survives a reassignment in librdkafka: resume while still assigned, or a
        # partition coming back to this member would never be fetched again.
        paused = [k for k in keys if k in self._paused]
        if not paused:
            return
        self._paused.difference_update(paused)
        try:
            self._consumer.resume([TopicPartition(t, p) for t, p in paused])
        except KafkaException as e:
            log.warning("resuming %s before release failed: %s", paused,
                        translate(e, "resume"))

    def _release(self, keys: Sequence[tuple[str, int]], reason: CloseReason) -> None:
        """Close the partitions' open segments durably within ``shutdown_timeout``, abort
        what cannot make it, and forget the partitions."""
        writers = [self._writers[k] for k in keys if k in self._writers]
        if not writers:
            return
        for w in writers:
            if w.failed is None and not w.broken.is_set():
                w.close(reason)
            else:
                w.discard_open()
        deadline = time.monotonic() + self.config.shutdown_timeout.total_seconds()
        self._wait_idle(writers, deadline)
        stuck = [w for w in writers if not w.queue.idle]
        for w in stuck:
            log.warning("%s: segments not durable within %s, aborting them", w.name,
                        self.config.shutdown_timeout)
            w.cancel.set()
        self._wait_idle(stuck, time.monotonic() + CANCEL_GRACE)
        self._drain_outcomes(self.clock())
        self._forget_pauses([(w.ref.topic, w.ref.partition) for w in writers])
        for w in writers:
            self._writers.pop((w.ref.topic, w.ref.partition), None)
            log.info("%s: released (%s), committed offset %s", w.name, reason,
                     w.committed_offset)
        self.m.assigned.labels(self.region).set(len(self._writers))

    def _wait_idle(self, writers: Sequence[PartitionWriter], deadline: float) -> None:
        """Wait for the writers' queues while serving their commits (poll thread)."""
        while time.monotonic() < deadline:
            self._serve_commits()
            if all(w.queue.idle for w in writers):
                break
            time.sleep(0.005)
        self._serve_commits()

    def _committer(self, topic: str, partition: int) -> Callable[[int], None]:
        """Step 4 of a partition's durability method: commit ``offset`` synchronously.

        The worker hands the commit to the poll thread and waits for its result: a
        synchronous commit issued from another thread waits for the poll thread's next
        ``consume`` anyway, and commits must interleave correctly with rebalances, which
        run on the poll thread.
        """
        def commit(offset: int) -> None:
            done: Future[None] = Future()
            self._commit_requests.put((topic, partition, offset, done))
            deadline = time.monotonic() + COMMIT_WAIT
            while True:
                try:
                    done.result(timeout=0.2)
                    return
                except TimeoutError:
                    if self._loop_done.is_set() or time.monotonic() > deadline:
                        raise KafkaRetriableError(
                            f"commit {topic}[{partition}]@{offset}: the poll loop "
                            "ended or did not serve it in time") from None

        return commit

    def _serve_commits(self) -> None:
        """Commit every queued offset in one synchronous request (poll thread)."""
        requests: list[tuple[str, int, int, Future[None]]] = []
        while True:
            try:
                requests.append(self._commit_requests.get_nowait())
            except queue.Empty:
                break
        if not requests:
            return
        what = ", ".join(f"{t}[{p}]@{o}" for t, p, o, _ in requests)

        def once() -> list[Any]:
            try:
                return self._consumer.commit(
                    offsets=[TopicPartition(t, p, o) for t, p, o, _ in requests],
                    asynchronous=False) or []
            except KafkaException as e:
                raise translate(e, f"commit {what}") from e

        try:
            results = retry(once, COMMIT_POLICY, what=f"commit {what}")
        except ReplicatorError as e:
            for *_, done in requests:
                done.set_exception(e)
            return
        errors = {(r.topic, r.partition): r.error for r in results if r.error is not None}
        for t, p, o, done in requests:
            err = errors.get((t, p))
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(translate(KafkaException(err), f"commit {t}[{p}]@{o}"))

    def _low_watermark_reader(self, topic: str, partition: int) -> Callable[[], int | None]:
        def low() -> int | None:
            try:
                lo, _ = self._consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                             timeout=10, cached=False)
            except KafkaException as e:
                log.warning("%s[%d]: cannot read the log start offset, a retention loss "
                            "before this segment would go unnoticed: %s", topic, partition,
                            translate(e, "watermarks"))
                return None
            return int(lo) if lo is not None and lo >= 0 else None

        return low

    # --- topic metadata ---------------------------------------------------------------

    def _check_topics(self) -> None:
        """Write ``_topic.json`` for topics whose partition count is new or changed."""
        assert self._admin is not None and self.store is not None
        with self._meta_running:
            for topic in sorted(self.config.topics):
                try:
                    n = self._admin.partition_count(topic)
                    if n is None:
                        log.warning("%s: source topic does not exist (yet)", topic)
                        continue
                    if self._partition_counts.get(topic) == n:
                        continue
                    configs = self._admin.topic_config(topic)
                    key = topic_meta_key(self.settings.s3.prefix, self.region, topic)
                    body = topic_metadata(topic, self.region, n, configs, self.wall())
                    self._put_meta(key, body)
                except (ReplicatorError, KafkaException) as e:
                    log.warning("%s: _topic.json not updated, trying again in %s: %s", topic,
                                self.config.topic_metadata_interval, e)
                    continue
                old = self._partition_counts.get(topic)
                self._partition_counts[topic] = n
                self.m.topic_meta_writes.labels(self.region, topic).inc()
                log.info("%s: wrote %s (%d partitions%s)", topic, key, n,
                         "" if old is None else f", was {old}")

    def _put_meta(self, key: str, body: bytes) -> None:
        store = self.store
        assert store is not None
        retry(lambda: store.put(key, body, content_type="application/json"),
              self.retry_policy, what=f"put {key}")
