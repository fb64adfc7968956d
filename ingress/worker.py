"""The replay worker of one source partition: segments in position order → destination p.

A worker runs in its own thread while its controller owns destination partition ``p``.
It loads the checkpoint, lists the partition's segments (all levels), and loops:
``planner.next_action`` decides, the worker acts (replay a segment, wait for a late one,
declare a range lost, idle until an event). Segment events from the controller wake it.

The durability order lives in ``_deliver`` and nowhere else.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc

from formats.base import TIMESTAMP_NOT_AVAILABLE, SegmentFormat
from formats.segment_io import open_segment
from ingress.checkpoints import Checkpoint, CheckpointStore
from ingress.events import SegmentEvent, partition_key
from ingress.metrics import IngressMetrics
from ingress.planner import (
    DeclareLost,
    Idle,
    LateGap,
    Produce,
    WaitFirst,
    WaitLate,
    next_action,
)
from ingress.sink import Header, ReplaySink, Rows
from replicator.core.errors import (
    FatalError,
    KafkaRetriableError,
    ProducerFenced,
    RetriableError,
    SegmentCorrupt,
    SegmentNotFound,
)
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.queues import put_unless_stopped
from replicator.core.retry import RetryPolicy
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
T = TypeVar("T")

# Restart delays after a failed replay session: short first (a broker blip), capped so a
# persistent failure (a missing topic) is retried about once a minute, never in a hot loop.
SESSION_RETRY = RetryPolicy(attempts=1_000_000, initial=timedelta(milliseconds=500),
                            multiplier=2.0, maximum=timedelta(seconds=60), jitter=0.2)


PIPELINE_DEPTH = 2
"""At-least-once: batches produced and not yet acknowledged while the next one is produced
(memory: about ``(PIPELINE_DEPTH + 1) * batch_size`` records in the producer)."""
ACK_POLL = 0.005
"""Seconds one wait for acknowledgements lasts before the worker counts again (successful
deliveries raise no event that would end the wait early: keep it short)."""
ACK_TIMEOUT = 120.0
"""Seconds a batch may stay unacknowledged (librdkafka's delivery timeout is 300 s, but a
worker this far behind restarts from its checkpoint instead)."""


def utc_now() -> datetime:
    """The wall clock (injected elsewhere in tests)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs besides its seams."""

    source: IngressSourceSettings
    ref: PartitionRef
    destination_topic: str
    exactly_once: bool
    batch_size: int
    rescan_interval: timedelta


def batch_rows(batch: pa.RecordBatch, after: int | None) -> Rows | None:
    """The records of ``batch`` with offsets above ``after``, column by column."""
    n = batch.num_rows
    if n == 0:
        return None
    offsets = batch.column("offset")
    if after is not None:
        if offsets[n - 1].as_py() <= after:
            return None
        if offsets[0].as_py() <= after:
            batch = batch.filter(pc.greater(offsets, pa.scalar(after, pa.int64())))
            offsets = batch.column("offset")
    ts = batch.column("timestamp").cast(pa.int64()).to_pylist()
    types = batch.column("timestamp_type")
    if pc.any(pc.equal(types, TIMESTAMP_NOT_AVAILABLE)).as_py():
        ts = [0 if t == TIMESTAMP_NOT_AVAILABLE else x
              for x, t in zip(ts, types.to_pylist(), strict=True)]
    hcol = batch.column("headers")
    flat = hcol.flatten()  # respects slicing, unlike .values
    headers: list[list[Header] | None]
    if len(flat) == 0:
        headers = [None] * batch.num_rows
    else:
        # Column-wise: no dict per header (to_pylist of a list<struct> builds one).
        hkeys = flat.field("key").to_pylist()
        hvals = flat.field("value").to_pylist()
        headers = []
        i = 0
        for n in pc.list_value_length(hcol).to_pylist():
            if n:
                headers.append(list(zip(hkeys[i:i + n], hvals[i:i + n], strict=True)))
                i += n
            else:
                headers.append(None)
    return Rows(offsets.to_pylist(), ts, batch.column("key").to_pylist(),
                batch.column("value").to_pylist(), headers)


class Prefetcher(Iterator[T]):
    """Runs an iterator one item ahead in a thread (memory: ``depth`` items).

    Errors of the source iterator are raised by ``__next__`` in the consumer's thread.
    ``close`` stops the thread and waits for it, so the source may be released after.
    """

    _DONE = object()

    def __init__(self, source: Iterator[T], *, name: str, depth: int = 1) -> None:
        self._source = source
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        return put_unless_stopped(self._queue, item, self._closed)

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put((item, None)):
                    return
            self._put((self._DONE, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer thread
            self._put((None, e))

    def __next__(self) -> T:
        item, error = self._queue.get()
        if error is not None:
            raise error
        if item is self._DONE:
            self._queue.put((self._DONE, None))  # stay exhausted
            raise StopIteration
        return cast(T, item)

    def close(self) -> None:
        """Stop reading ahead and wait for the thread."""
        self._closed.set()
        self._thread.join()


class ReplayWorker:
    """Replays one source partition into destination partition ``p``; one thread."""

    def __init__(self, cfg: WorkerConfig, *, store: ObjectStore, fmt: SegmentFormat,
                 checkpoints: CheckpointStore, make_sink: Callable[[], ReplaySink],
                 metrics: IngressMetrics, clock: Clock = utc_now,
                 sleep: Callable[[float], None] | None = None,
                 permits: threading.Semaphore | None = None) -> None:
        self.cfg = cfg
        self.permits = permits
        self.store = store
        self.fmt = fmt
        self.checkpoints = checkpoints
        self.make_sink = make_sink
        self.metrics = metrics
        self.clock = clock
        self._sleep = sleep
        ref = cfg.ref
        self.key = partition_key(ref.region, ref.topic, ref.partition)
        self.where = f"{ref.region}/{ref.topic}[{ref.partition}] -> " \
                     f"{cfg.destination_topic}[{ref.partition}]"
        labels = {"region": ref.region, "topic": ref.topic, "partition": str(ref.partition)}
        self._m_produced = metrics.messages_produced.labels(**labels)
        self._m_lag = metrics.replication_lag.labels(**labels)
        self._m_checkpoint = metrics.checkpoint_offset.labels(**labels)
        self._m_waiting = metrics.segments_waiting.labels(**labels)
        self._m_late = metrics.segments_late.labels(**labels)
        self._labels = labels
        # State (owned by the worker thread, except the inbox).
        self.position: int | None = None
        """Replayed through: the records up to here are produced (the planner's view)."""
        self.checkpointed: int | None = None
        """The newest checkpoint sent after its records were acknowledged/committed."""
        self._sent = 0
        self._unsettled: deque[tuple[int, Checkpoint]] = deque()
        self.origin: int | None = None
        """See ``Checkpoint.origin``; carried in every checkpoint once set."""
        self._reported_below: int | None = None
        """Positions from here up to ``origin`` were reported as skipped (this worker)."""
        self.segments: set[SegmentKey] = set()
        self.bad: set[SegmentKey] = set()
        self.gone: set[SegmentKey] = set()
        self.late: LateGap | None = None
        self.first_seen: datetime | None = None
        self.sink: ReplaySink | None = None
        self.fenced = False
        self.failed: BaseException | None = None
        self._inbox: list[SegmentEvent] = []
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # --- controller side --------------------------------------------------------------

    def offer(self, event: SegmentEvent) -> None:
        """Hand over a segment event of this partition (any thread); wakes the worker."""
        with self._cond:
            self._inbox.append(event)
            self._cond.notify()

    def start(self) -> None:
        """Run in a new thread."""
        self._thread = threading.Thread(target=self.run, name=f"replay-{self.key}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the worker to stop after the current batch (signal-safe)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; True if it ended."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        """True once ``stop`` was called."""
        return self._stopping.is_set()

    # --- worker thread ----------------------------------------------------------------

    def run(self) -> None:
        """Replay sessions until stopped or fenced; errors restart a session after a delay."""
        delays = SESSION_RETRY.delays()
        while not self.stopping:
            try:
                self._session()
                return
            except ProducerFenced as e:
                log.warning("%s: fenced by a newer owner, giving the partition up: %s",
                            self.where, e)
                self.fenced = True
                self.metrics.worker_errors.labels(**self._labels, kind="fenced").inc()
                return
            except (RetriableError, FatalError) as e:
                kind = "retriable" if isinstance(e, RetriableError) else "fatal"
                self._session_failed(e, kind, next(delays))
            except Exception as e:  # a bug must not become a restart hot loop
                log.exception("%s: unexpected error in the replay session", self.where)
                self._session_failed(e, "unexpected", next(delays))

    def _session_failed(self, e: BaseException, kind: str, delay: float) -> None:
        log.error("%s: replay session failed (%s), restarting from the checkpoint in %.1fs: "
                  "%s", self.where, kind, delay, e)
        self.metrics.worker_errors.labels(**self._labels, kind=kind).inc()
        self.failed = e
        # Not woken by events: a session failing before it drains its inbox must not spin.
        if self._sleep is not None:
            self._sleep(delay)
        else:
            self._stopping.wait(delay)

    def _wait_for(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; returns early (True) on an event or stop."""
        if self._sleep is not None:
            self._sleep(seconds)
            return False
        with self._cond:
            if self._inbox or self.stopping:
                return True
            return self._cond.wait(max(0.0, seconds))

    def _session(self) -> None:
        sink = self.make_sink()
        self.sink = sink
        try:
            # Fence first: once init_transactions returns, an older owner's open
            # transaction is aborted, so the checkpoint read below is the committed truth.
            sink.start()
            cp = self.checkpoints.load(self.key)
            self.position = self.checkpointed = None if cp is None else cp.offset
            self.origin = None if cp is None else cp.origin
            self._sent = 0
            self._unsettled.clear()
            if cp is not None:
                self._m_checkpoint.set(cp.offset)
            log.info("%s: replay starts after checkpoint %s (segment %s)", self.where,
                     "none" if cp is None else cp.offset, "-" if cp is None else cp.segment)
            self.late = None
            self._drain_inbox()
            self._reload()
            self._loop(sink)
            self._settle_all(sink)
        finally:
            try:
                sink.abort()
            finally:
                sink.close()
                self.sink = None

    def _drain_inbox(self) -> bool:
        with self._cond:
            events, self._inbox = self._inbox, []
        for ev in events:
            if ev.kind == "created":
                self.segments.add(ev.key)
                self.bad.discard(ev.key)
                self.gone.discard(ev.key)
            else:
                self.segments.discard(ev.key)
        return bool(events)

    def _reload(self, *, retry_gone: bool = True) -> None:
        """List the partition's segments (all levels).

        With ``retry_gone`` (the periodic and late reloads, which are paced), segments
        that were missing when read get one more chance if the listing still shows them.
        """
        if retry_gone:
            self.gone.clear()
        ref = self.cfg.ref
        found: set[SegmentKey] = set()
        for info in self.store.list(ref.segments_prefix()):
            seg = SegmentKey.try_parse(info.key)
            if seg is not None and seg.partition_ref == ref:
                found.add(seg)
            else:
                log.debug("%s: ignoring non-segment object %s", self.where, info.key)
        self.segments = found
        log.debug("%s: %d segment(s) listed", self.where, len(found))

    def _loop(self, sink: ReplaySink) -> None:
        src = self.cfg.source
        while not self.stopping:
            self._drain_inbox()
            usable = self.segments - self.bad - self.gone
            self._report_below_origin(usable)
            now = self.clock()
            excluded = (self.bad | self.gone) & self.segments
            floor = min((s.start for s in excluded), default=None)
            action = next_action(self.position, usable, now, src, late=self.late,
                                 first_seen=self.first_seen, floor=floor)
            pos = -1 if self.position is None else self.position
            self._m_waiting.set(sum(1 for s in usable if s.end > pos))
            if isinstance(action, Produce):
                if self.late is not None:
                    log.info("%s: late range %d-%d arrived after %.1fs", self.where,
                             self.late.first, self.late.last,
                             (now - self.late.since).total_seconds())
                    self.late = None
                    self._m_late.set(0)
                self.first_seen = None
                self._replay(sink, action.segment, action.skip_through)
                continue
            if isinstance(action, DeclareLost):
                self._declare_lost(sink, action)
                continue
            # Nothing to produce now: every checkpoint out before the worker waits.
            self._settle_all(sink)
            if isinstance(action, WaitFirst):
                if self.first_seen is None:
                    log.info("%s: no checkpoint; waiting %s (first_segment_delay) for earlier "
                             "segments", self.where, src.first_segment_delay)
                self.first_seen = action.since
                self._wait_until(action.until)
            elif isinstance(action, WaitLate):
                self._wait_late(action)
            else:
                assert isinstance(action, Idle)
                if not self._wait_until(now + self.cfg.rescan_interval):
                    self._reload()

    def _report_below_origin(self, usable: set[SegmentKey]) -> None:
        """Log and count positions of segments that lie below ``origin``.

        The first replay without a checkpoint starts at the earliest segment known after
        ``first_segment_delay``; a segment that arrives later below that start was never
        replayed and never will be (replay only moves forward). Each position is reported
        once per worker.
        """
        if self.origin is None:
            return
        low = self.origin if self._reported_below is None else self._reported_below
        below = [s for s in usable if s.start < low]
        if not below:
            return
        first = min(s.start for s in below)
        last = low - 1
        log.error("%s: segment(s) %s arrived after the first replay started at %d without a "
                  "checkpoint: positions %d-%d (%d) were NOT replayed (raise "
                  "first_segment_delay if first segments can be this late)", self.where,
                  ", ".join(sorted(s.to_key() for s in below)), self.origin, first, last,
                  last - first + 1)
        self.metrics.messages_skipped.labels(**self._labels).inc(last - first + 1)
        self._reported_below = first

    def _wait_until(self, until: datetime) -> bool:
        """Wait until ``until``; True if woken early by an event or stop."""
        return self._wait_for((until - self.clock()).total_seconds())

    def _wait_late(self, action: WaitLate) -> None:
        late = action.late
        if self.late is None or self.late.first != late.first:
            log.warning("%s: positions %d-%d are late (next segment starts at %d); reloading "
                        "the segment list with backoff for up to %s", self.where, late.first,
                        late.last, late.last + 1, self.cfg.source.lost_segment_timeout)
            self.metrics.late_gaps.labels(**self._labels).inc()
        self.late = late
        self._m_late.set(late.size)
        if not self._wait_until(action.until):
            self._reload()
            self.late = replace(late, reloads=late.reloads + 1)

    def _declare_lost(self, sink: ReplaySink, action: DeclareLost) -> None:
        log.error("%s: positions %d-%d (%d) declared LOST after %s: no segment covering them "
                  "arrived", self.where, action.first, action.last, action.size,
                  self.cfg.source.lost_segment_timeout)
        self.metrics.segments_lost.labels(**self._labels).inc()
        self.metrics.messages_lost.labels(**self._labels).inc(action.size)
        usable = self.segments - self.bad - self.gone
        following = min((s for s in usable if s.start == action.last + 1),
                        key=lambda s: -s.end, default=None)
        cp = Checkpoint(action.last, "" if following is None else following.to_key(),
                        self.clock(), lost=(action.first, action.last))
        self._deliver(sink, None, cp)
        self.late = None
        self._m_late.set(0)

    def _replay(self, sink: ReplaySink, seg: SegmentKey, skip_through: int | None) -> None:
        """Replay one segment while holding a permit (memory: one per active replay)."""
        permits = self.permits
        if permits is None:
            self._replay_segment(sink, seg, skip_through)
            return
        while not permits.acquire(timeout=0.2):
            if self.stopping:
                return
        try:
            self._replay_segment(sink, seg, skip_through)
        finally:
            permits.release()

    def _replay_segment(self, sink: ReplaySink, seg: SegmentKey, skip_through: int | None
                        ) -> None:
        name = seg.to_key()
        try:
            reader = open_segment(self.store, self.fmt, seg)
        except SegmentNotFound:
            self._missing(seg)
            return
        except SegmentCorrupt as e:
            self._corrupt(seg, e)
            return
        log.info("%s: replaying segment %s%s", self.where, name,
                 "" if skip_through is None else f" (skipping offsets <= {skip_through})")
        after = self.position
        if after is None and self.origin is None:
            self.origin = seg.start
            self._reported_below = None
            log.info("%s: first replay, no checkpoint: starts at %d; a segment arriving later "
                     "below it will be reported as skipped", self.where, seg.start)
        # The next batch is read and decoded while the current one is committed.
        batches = Prefetcher((batch_rows(b, after)
                              for b in reader.iter_batches(self.cfg.batch_size)),
                             name=f"prefetch-{self.key}")
        try:
            for rows in batches:
                if self.stopping:
                    return
                if rows is None:
                    continue
                self._deliver(sink, rows, Checkpoint(rows.last_offset, name, self.clock()))
        except SegmentNotFound:
            self._missing(seg)
            return
        except SegmentCorrupt as e:
            self._corrupt(seg, e)
            return
        finally:
            batches.close()
            reader.close()
        if self.position is None or self.position < seg.end:
            # The footer vouches for the range: positions after the last record are holes.
            log.warning("%s: segment %s ends at %d but its last record is %s; checkpointing "
                        "its end", self.where, name, seg.end, self.position)
            self._deliver(sink, None, Checkpoint(seg.end, name, self.clock()))
        self.metrics.segments_replayed.labels(**self._labels).inc()
        log.info("%s: segment %s done, checkpoint %d", self.where, name, self.position)

    def _missing(self, seg: SegmentKey) -> None:
        log.warning("%s: segment %s is gone (compacted or deleted); reloading the segment "
                    "list", self.where, seg.to_key())
        self.metrics.segments_missing.labels(**self._labels).inc()
        self._reload(retry_gone=False)
        # Even if a stale listing still shows it, do not try it again before a new
        # "created" event or a paced reload: a missing object is not retried in a loop.
        self.gone = {s for s in self.gone if s in self.segments}
        self.gone.add(seg)

    def _corrupt(self, seg: SegmentKey, e: SegmentCorrupt) -> None:
        log.error("%s: segment %s cannot be read and is skipped (its range waits for another "
                  "segment, then counts as lost): %s", self.where, seg.to_key(), e)
        self.metrics.segments_corrupt.labels(**self._labels).inc()
        self.bad.add(seg)

    def _deliver(self, sink: ReplaySink, rows: Rows | None, cp: Checkpoint) -> None:
        """Make ``rows`` durable in the destination, then the checkpoint ``cp``.

        Exactly-once (one Kafka transaction per batch, done when this returns):
          1. begin a transaction;
          2. produce the records to the destination partition;
          3. flush: the records are in the destination log before the checkpoint is sent,
             so no broker ever holds this checkpoint without its records (a broker that
             shows aborted records to read_committed readers, like the embedded Tansu,
             would otherwise let a successor skip records that were never written). Kept
             on Apache Kafka, which hides aborted records: commit flushes anyway, so this
             only moves that wait before the checkpoint's send;
          4. produce the checkpoint record to the checkpoint topic, same transaction, and
             commit: records and checkpoint become visible together or not at all.
        At-least-once (idempotent producer, pipelined: up to ``PIPELINE_DEPTH`` batches
        are unacknowledged while the next one is produced):
          1. no transaction;
          2. produce the records;
          3. once every record of the batch is acknowledged (acks=all; ``_settle``),
          4. produce its checkpoint. A checkpoint is never sent before its records are
             acknowledged; it is flushed itself before the worker waits or stops.
        5. Advance the in-memory position (the planner's) and metrics; ``checkpointed``
           follows at step 4.

        A failure before step 4 completes aborts the transaction (exactly-once) and raises;
        the session restarts from the last committed checkpoint. Checkpoints only move
        forward: ``cp.offset`` is always above the position.
        """
        if self.position is not None and cp.offset <= self.position:
            raise FatalError(f"{self.where}: checkpoint {cp.offset} would not move forward "
                             f"from {self.position}")
        if cp.origin is None and self.origin is not None:
            cp = replace(cp, origin=self.origin)
        if self.cfg.exactly_once:
            try:
                sink.begin()                        # step 1
                if rows is not None:
                    sink.produce(rows)              # step 2
                    sink.flush()                    # step 3
                sink.produce_checkpoint(self.key, cp)   # step 4
                sink.commit()
            except ProducerFenced:
                raise
            except (RetriableError, FatalError):
                self.metrics.transactions_aborted.labels(**self._labels).inc()
                sink.abort()
                raise
            self._checkpointed(cp)
        else:
            if rows is not None:
                sink.produce(rows)                  # step 2
                self._sent += len(rows)
            self._unsettled.append((self._sent, cp))
            self._settle(sink, depth=PIPELINE_DEPTH)    # steps 3-4
        # Step 5
        self.position = cp.offset
        if rows is not None:
            self._m_produced.inc(len(rows))
            last_ts = rows.timestamps[-1]
            if last_ts > 0:
                self._m_lag.set(max(0.0, self.clock().timestamp() - last_ts / 1000.0))

    def _settle(self, sink: ReplaySink, *, depth: int) -> None:
        """At-least-once steps 3-4: checkpoint the newest batch whose records are all
        acknowledged; wait until at most ``depth`` batches are not.

        The sink's outstanding count covers records and checkpoints, and one partition's
        records are acknowledged in the order they were produced: so every record but the
        last ``outstanding`` ones is acknowledged (a bound that can only understate).

        Raises:
            KafkaRetriableError: a record failed, or was not acknowledged within
                ``ACK_TIMEOUT`` seconds.
        """
        deadline = time.monotonic() + ACK_TIMEOUT
        while True:
            wait = 0.0 if len(self._unsettled) <= depth else ACK_POLL
            acknowledged = self._sent - sink.outstanding(wait)
            ready: Checkpoint | None = None
            while self._unsettled and self._unsettled[0][0] <= acknowledged:
                ready = self._unsettled.popleft()[1]
            if ready is not None:
                sink.produce_checkpoint(self.key, ready)
                self._checkpointed(ready)
            if len(self._unsettled) <= depth:
                return
            if time.monotonic() > deadline:
                raise KafkaRetriableError(f"{self.where}: records up to offset "
                                          f"{self._unsettled[0][1].offset} not acknowledged "
                                          f"within {ACK_TIMEOUT:.0f}s")

    def _settle_all(self, sink: ReplaySink) -> None:
        """At-least-once: every checkpoint sent and acknowledged (before waiting/stopping)."""
        if self.cfg.exactly_once:
            return
        self._settle(sink, depth=0)
        if sink.outstanding():   # the checkpoints just sent (the records are acknowledged)
            sink.flush()

    def _checkpointed(self, cp: Checkpoint) -> None:
        self.checkpointed = cp.offset
        self._m_checkpoint.set(cp.offset)
