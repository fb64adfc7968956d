"""The replay worker of one source partition: segments in position order → destination p.

A worker exists while its controller owns destination partition ``p``; it has no thread
of its own: the process's ``Scheduler`` (``ingress.scheduler``) runs its steps on a fixed
pool. It loads the checkpoint, lists the partition's segments (all levels), and then each
step is one ``planner.next_action`` decision and its action (replay a segment, declare a
range lost, or wait: for a late segment, the rescan, an event). Waiting is a state with a
timer, not a blocked thread; segment events from the controller wake it.

Records and checkpoints are made durable by the session's delivery protocol
(``ingress.delivery``); ``_deliver`` is the only way to it.

Why this module is longer than 400 lines: the loop, the replay of one segment and the
late/lost/skipped reports all read and move the same state (position, origin, the segment
inventory, the session's delivery); the decisions are elsewhere already (``planner``,
``inventory``, ``delivery``, ``rows``), and what is left is the worker itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

import pyarrow as pa

from formats.segment_io import SegmentStreamReader, open_segment
from ingress.checkpoints import CheckpointStore, LoadTicket
from ingress.delivery import Delivery
from ingress.events import SegmentEvent
from ingress.first_position import NOT_RECORDED, PENDING, FirstPosition
from ingress.incarnations import IncarnationTracker
from ingress.inventory import SegmentInventory
from ingress.metrics import IngressMetrics
from ingress.permits import BudgetRequest, ByteBudget, FifoPermits, PermitRequest
from ingress.planner import (
    DeclareLost,
    Idle,
    LateGap,
    Produce,
    WaitFirst,
    WaitLate,
    next_action,
)
from ingress.rows import Header, Rows, batch_rows, record_bytes, split_by_bytes
from ingress.scheduler import WAIT, Scheduler
from ingress.sink import ReplaySink
from replicator.core.clock import Clock, utc_now
from replicator.core.errors import (
    FatalError,
    ObjectNotFound,
    ProducerFenced,
    ReplicatorError,
    RetriableError,
    SegmentCorrupt,
)
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.queues import read_ahead
from replicator.core.retry import Backoff
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import ObjectStore
from replicator.core.wire import Checkpoint, checkpoint_key

log = logging.getLogger(__name__)


def session_backoff() -> Backoff:
    """Restart delays after a failed replay session: short first (a broker blip), capped so
    a persistent failure (a missing topic) is retried about once a minute, never in a hot
    loop.
    """
    return Backoff(initial=timedelta(milliseconds=500), multiplier=2.0,
                   maximum=timedelta(seconds=60), jitter=0.2)


FENCED_STALL = 3
"""Fencings in a row, without a checkpoint in between, after which a partition is reported
stalled (it keeps retrying)."""

PREFETCH_BATCHES = 1
"""Batches read and decoded ahead while the current one is delivered (memory: about two
batches per active replay)."""

SENT_RECHECK = 1.0
"""Seconds a worker parked on its batch's transaction sleeps before it checks the batch
itself (its partition revoked, the transaction thread gone); the transaction's callback
wakes it at once otherwise."""

STOP_POLL = 0.1
"""Seconds between checks of a stopping worker's batch in flight (committed, or never
committable once its partition is revoked)."""


@dataclass(eq=False)
class _Run:
    """A segment replayed over the shared transaction loop: at most one batch in its
    transaction (``sent``) and one decoded ahead (``ahead``), each with its bytes of
    ``ingress.max_bytes_in_flight``; ``reader`` is ``None`` once the segment is read.
    """

    seg: SegmentKey
    name: str
    reader: SegmentStreamReader | None
    parts: Iterator[pa.RecordBatch]
    after: int | None
    ahead: tuple[Rows, Checkpoint, BudgetRequest | None] | None = None
    sent: tuple[object, Rows | None, Checkpoint, BudgetRequest | None] | None = None
    cut_short: bool = False
    """The segment went away or turned out corrupt while read (reported already)."""
    reading: BudgetRequest | None = None
    """The bytes asked for (or granted) to read the next batch."""


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs besides its seams.

    ``delivery`` is the protocol the controller chose for the process
    (``ingress.delivery.delivery_for``).
    """

    source: IngressSourceSettings
    ref: PartitionRef
    destination_topic: str
    delivery: type[Delivery]
    batch_size: int
    rescan_interval: timedelta
    batch_bytes: int = 4 * 1024**2
    origin: Header | None = None
    """The origin marker appended to every replayed record (``[ingress] mark_origin``)."""


class ReplayWorker:
    """Replays one source partition into destination partition ``p``: a task of the
    process's ``Scheduler`` (no thread of its own).

    Each ``step`` starts a session (the sink, then the checkpoint load, which is waited for
    as a state, then the segment listing) or runs one planner decision and its action,
    and returns when the worker would wait: with the seconds until its timer (a late
    segment's reload, the rescan, ``first_segment_delay``, a session restart's backoff),
    or ``WAIT`` until woken (a segment event through ``offer``, a replay permit granted,
    the checkpoint reader's progress, ``stop``). A replay of one segment is one step: it
    holds a pool thread and a replay permit until the segment is done (or ``stop``).
    """

    def __init__(self, cfg: WorkerConfig, *, store: ObjectStore, checkpoints: CheckpointStore,
                 make_sink: Callable[[], ReplaySink], metrics: IngressMetrics,
                 scheduler: Scheduler, clock: Clock = utc_now,
                 permits: FifoPermits | None = None,
                 budget: ByteBudget | None = None) -> None:
        self.cfg = cfg
        self.permits = permits
        self.budget = budget
        self.store = store
        self.checkpoints = checkpoints
        self.make_sink = make_sink
        self.metrics = metrics
        self.scheduler = scheduler
        self.clock = clock
        ref = cfg.ref
        self.key = checkpoint_key(ref.region, ref.topic, ref.partition, cfg.destination_topic)
        # The key of earlier versions (no destination): read once on upgrade.
        self.legacy_key = checkpoint_key(ref.region, ref.topic, ref.partition)
        self.where = f"{ref.region}/{ref.topic}[{ref.partition}] -> " \
                     f"{cfg.destination_topic}[{ref.partition}]"
        labels = {"region": ref.region, "topic": ref.topic, "partition": str(ref.partition)}
        self._m_produced = metrics.messages_produced.labels(**labels)
        self._m_lag = metrics.replication_lag.labels(**labels)
        self._m_checkpoint = metrics.checkpoint_offset.labels(**labels)
        self._m_waiting = metrics.segments_waiting.labels(**labels)
        self._m_late = metrics.segments_late.labels(**labels)
        self._labels = labels
        # State (touched by one step at a time, except the inbox and the flags).
        self.position: int | None = None
        """Replayed through: the records up to here are produced (the planner's view)."""
        self.checkpointed: int | None = None
        """The newest checkpoint sent after its records were acknowledged/committed."""
        self.origin: int | None = None
        """See ``Checkpoint.origin``; carried in every checkpoint once set."""
        self._reported_below: int | None = None
        """Positions from here up to ``origin`` were reported as skipped (this worker)."""
        self.incarnations = IncarnationTracker(
            store, ref, self.where, metrics.topic_incarnations.labels(**labels))
        self.inventory = SegmentInventory(store, ref, self.where,
                                          horizon=lambda: (self.position, self.origin),
                                          locations=self.incarnations.locations,
                                          current=lambda: self.incarnations.label)
        self.late: LateGap | None = None
        self.first_seen: datetime | None = None
        self.sink: ReplaySink | None = None
        self._delivery: Delivery | None = None
        self.fenced = False
        self._purged = False
        self.fenced_in_a_row = 0
        self.stalled = False
        self.first = FirstPosition(store, cfg.ref,
                                   enabled=cfg.source.start == "first-position")
        self._pending_logged = False
        self._last_cp: Checkpoint | None = None
        self.failed: BaseException | None = None
        self._backoff = session_backoff()
        # The step machine: no session (``_sink_ready`` False) → the checkpoint load
        # pending (``_load``) → replaying (``_replaying``).
        self._sink_ready = False
        self._load: LoadTicket | None = None
        self._replaying = False
        self._not_before = 0.0
        """Monotonic time before which no new session starts (restart backoff)."""
        self._after_wait: Callable[[], None] | None = None
        """What the timer of the last wait does when it expires (not woken early)."""
        self._permit: PermitRequest | None = None
        self._run: _Run | None = None
        """The segment being replayed over the shared transaction loop (``_continue``)."""
        self._orphan: tuple[Delivery, object, Checkpoint] | None = None
        """A failed session's batch still in a transaction (``_end_run``)."""
        self._inbox: list[SegmentEvent] = []
        self._lock = threading.Lock()
        self._woken = False
        self._stopping = threading.Event()
        self._started = False
        self._done = threading.Event()

    # --- controller side --------------------------------------------------------------

    def offer(self, event: SegmentEvent) -> None:
        """Hand over a segment event of this partition (any thread); wakes the worker."""
        with self._lock:
            self._inbox.append(event)
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            self._woken = True
        self.scheduler.wake(self)

    def start(self) -> None:
        """Schedule the first step."""
        self._started = True
        self.scheduler.add(self)

    def stop(self) -> None:
        """Ask the worker to stop after the current batch (signal-safe)."""
        self._stopping.set()
        self._wake()

    def purge(self) -> None:
        """The worker missed its revoke deadline: drop what its producer has not sent and
        close it (any thread), so nothing more of this worker reaches the destination once
        the partition is released; a later session never starts a producer.
        """
        self._purged = True
        self.stop()
        sink = self.sink
        if sink is not None:
            sink.purge()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker's last step; True if it ended."""
        if not self._started:
            return True
        return self._done.wait(timeout)

    @property
    def alive(self) -> bool:
        """True from ``start`` until the last step ended."""
        return self._started and not self._done.is_set()

    @property
    def replaying(self) -> bool:
        """True while a session has its checkpoint and segment list: the partition is
        replaying, or waiting for a segment or a replay slot (start-up is over).
        """
        return self._replaying

    @property
    def stopping(self) -> bool:
        """True once ``stop`` was called."""
        return self._stopping.is_set()

    # --- steps (one pool thread at a time) -------------------------------------------

    def step(self) -> float | None:
        """Run until the worker would wait; errors (fencing too) end the session and
        schedule a new one after a delay. ``None`` once stopped.
        """
        try:
            return self._step()
        except ProducerFenced as e:
            self._end_session()
            if self.stopping:
                self._finish()
                return None
            return self._restart_in(self._fenced(e, self._backoff.next()))
        except (RetriableError, FatalError) as e:
            if self.stopping:
                self._purge_unacknowledged()
            self._end_session()
            if self._purged or self.stopping:
                # Revoked or stopping: the batch in flight was not committed (its
                # partition left this process first); the next owner replays it.
                log.info("%s: stopped (%s): %s", self.where,
                         "producer purged" if self._purged else "revoked", e)
                self._finish()
                return None
            kind = "retriable" if isinstance(e, RetriableError) else "fatal"
            return self._restart_in(self._session_failed(e, kind, self._backoff.next()))
        except Exception as e:  # a bug must not become a restart hot loop
            log.exception("%s: unexpected error in the replay session", self.where)
            if self.stopping:
                self._purge_unacknowledged()
            self._end_session()
            if self.stopping:
                self._finish()
                return None
            return self._restart_in(self._session_failed(e, "unexpected",
                                                         self._backoff.next()))

    def _purge_unacknowledged(self) -> None:
        """Stopping, and the session failed (at-least-once: records not acknowledged in
        time, or one failed): drop what the producer has not delivered before the sink is
        closed, so nothing of this worker reaches the partition after the revoke releases
        it, also when the worker ends within ``revoke_timeout`` (no purge then). The next
        owner replays from the checkpoint. A transactional sink needs none: what it has
        not committed never becomes visible.
        """
        sink = self.sink
        if sink is not None and not sink.transactional:
            try:
                sink.purge()
            except ReplicatorError as e:
                log.warning("%s: purging the session's producer: %s", self.where, e)

    def _restart_in(self, delay: float) -> float:
        # Not woken early by events: a session failing before it drains its inbox must
        # not spin.
        self._not_before = time.monotonic() + delay
        return delay

    def _finish(self) -> None:
        self._end_session()
        self._done.set()

    def _step(self) -> float | None:
        with self._lock:
            woken, self._woken = self._woken, False
        if self.stopping:
            if self._run is not None and not self._collect():
                # Its batch may still commit: the revoke waits for this worker until it
                # did, or until it never can (the partition taken from ``Ownership``).
                return STOP_POLL
            if self._delivery is not None and self._replaying:
                self._delivery.settle()   # the last checkpoints out (at-least-once)
            self._finish()
            return None
        if not self._sink_ready:
            left = self._not_before - time.monotonic()
            if left > 0:
                return left
            if not self._orphan_settled():
                return SENT_RECHECK
            self._open_session()
        if not self._replaying:
            return self._start_replay()
        after, self._after_wait = self._after_wait, None
        if after is not None and not woken:
            after()
        return self._next()

    def _fenced(self, e: ProducerFenced, delay: float) -> float:
        """The producer was fenced. While the controller still owns the partition (it
        stops this worker on revoke), that is not a new owner: a transaction outlived
        ``transaction.timeout.ms`` (the coordinator aborted it and bumped the epoch) or a
        former owner's late init. A new session fences in turn, reads the committed
        checkpoint and goes on; after ``FENCED_STALL`` fencings in a row without progress
        the partition is reported stalled (ERROR, metric, /readyz) while retrying.
        Returns the delay before the new session.
        """
        self.fenced_in_a_row += 1
        self.metrics.worker_errors.labels(**self._labels, kind="fenced").inc()
        if self.fenced_in_a_row >= FENCED_STALL and not self.stalled:
            log.error("%s: STALLED: the producer was fenced %d times in a row although this "
                      "process owns the partition (another live instance with the same "
                      "transactional.id, i.e. the same ingress.instance_id?); retrying "
                      "every %.0fs at most: %s", self.where, self.fenced_in_a_row, delay, e)
            # After the log line: whoever sees the metric finds the line too.
            self.stalled = True
            self.metrics.partition_stalled.labels(**self._labels).set(1)
        else:
            log.warning("%s: producer fenced (a transaction that outlived "
                        "transaction.timeout.ms, or a former owner); new session in %.1fs: %s",
                        self.where, delay, e)
        self.fenced = True
        return delay

    def _session_failed(self, e: BaseException, kind: str, delay: float) -> float:
        log.error("%s: replay session failed (%s), restarting from the checkpoint in %.1fs: "
                  "%s", self.where, kind, delay, e)
        self.metrics.worker_errors.labels(**self._labels, kind=kind).inc()
        self.failed = e
        return delay

    def _open_session(self) -> None:
        """Session step 1: the sink and the delivery protocol; the checkpoint load begins."""
        sink = self.make_sink()
        self.sink = sink
        if self._purged:
            sink.purge()   # purged while this session was being made
        self._sink_ready = True   # from here on, _end_session closes it
        # A per-partition sink fences older owners here (init_transactions). The shared
        # producer was initialised at process start; a former owner's open transaction is
        # waited for by the checkpoint load instead (it reads read_committed past the
        # newest checkpoint record: ingress/README.md, point 3).
        sink.start()
        self._delivery = self.cfg.delivery(
            sink, self.key, self.where, on_checkpointed=self._checkpointed,
            on_aborted=self.metrics.transactions_aborted.labels(**self._labels).inc)
        self._load = self.checkpoints.begin_load()

    def _start_replay(self) -> float | None:
        """Session step 2, once the checkpoint reader has read far enough (a state, woken
        by the reader): load the checkpoint, list the segments.
        """
        if not self.checkpoints.load_ready(self._load, self._wake):
            return WAIT
        cp, upgraded = self.checkpoints.load_for(self.key, self.legacy_key, self._load)
        self._load = None
        self.position = self.checkpointed = None
        self._last_cp = None
        self.origin = None if cp is None else cp.origin
        self.incarnations.label = "" if cp is None else cp.incarnation
        if cp is not None and upgraded:
            # Written under the key with the destination at once: the legacy key is
            # read only until then (checkpoints.resolve).
            self._deliver(None, replace(cp, updated_at=self.clock()))
        elif cp is not None:
            self.position = self.checkpointed = cp.offset
            self._last_cp = cp
        if cp is not None:
            self._m_checkpoint.set(cp.offset)
        log.info("%s: replay starts after checkpoint %s (segment %s)", self.where,
                 "none" if cp is None else cp.offset, "-" if cp is None else cp.segment)
        self.late = None
        if cp is not None and cp.late is not None and cp.late[0] == cp.offset + 1:
            # The gap's clock survives restarts: lost_segment_timeout counts from when
            # it was first seen, not from this session's start.
            self.late = LateGap(cp.late[0], cp.late[0], cp.late[1])
            log.info("%s: positions from %d have been late since %s", self.where,
                     cp.late[0], cp.late[1].isoformat())
        self._drain_inbox()
        # List from the resume position: level 0 from the segment the checkpoint came
        # from (the checkpoint may lie inside it).
        anchor = None if cp is None else SegmentKey.try_parse(cp.segment)
        self.inventory.anchor = anchor.start if anchor is not None and anchor.level == 0 \
            and anchor.partition_ref == self.cfg.ref else None
        self.inventory.listed_fully = False
        self.inventory.reload()
        self._replaying = True
        self._after_wait = None
        return 0

    def _end_session(self) -> None:
        """Close the session's sink (abort what is open); the next step starts a new one."""
        self._end_run()
        self._drop_permit()
        self._delivery = None
        load, self._load = self._load, None
        self.checkpoints.cancel_load(load)
        self._replaying = False
        self._after_wait = None
        if not self._sink_ready:
            return
        self._sink_ready = False
        sink = self.sink
        self.sink = None
        if sink is None:
            return
        try:
            try:
                sink.abort()
            finally:
                sink.close()
        except ReplicatorError as e:
            log.warning("%s: closing the session's sink: %s", self.where, e)

    def _drain_inbox(self) -> bool:
        with self._lock:
            events, self._inbox = self._inbox, []
        self.inventory.apply(events)
        return bool(events)

    def _wait(self, seconds: float, then: Callable[[], None] | None = None) -> float:
        """Wait ``seconds`` (a step's return value); ``then`` runs when the timer expires,
        not when an event or stop wakes the worker first.
        """
        self._after_wait = then
        return max(0.0, seconds)

    def _wait_until(self, until: datetime, then: Callable[[], None] | None = None) -> float:
        return self._wait((until - self.clock()).total_seconds(), then)

    def _next(self) -> float:
        """One planner decision and its action."""
        src = self.cfg.source
        inventory = self.inventory
        assert self._delivery is not None
        if self._run is not None:
            return self._continue()
        self._drain_inbox()
        usable, until = self._incarnation(inventory.usable())
        self._report_below_origin(usable)
        now = self.clock()
        plan_from = self._plan_from(usable)
        if plan_from == PENDING:
            self._drop_permit()
            return self._wait_first_position(usable)
        assert not isinstance(plan_from, str)
        action = next_action(plan_from, usable, now, src, late=self.late,
                             first_seen=self.first_seen, floor=inventory.floor(),
                             until=until)
        pos = -1 if self.position is None else self.position
        self._m_waiting.set(sum(1 for s in usable if s.end > pos))
        if isinstance(action, Produce):
            return self._produce(action, now)
        self._drop_permit()
        if isinstance(action, DeclareLost):
            self._declare_lost(action)
            return 0
        # Nothing to produce now: every checkpoint out before the worker waits.
        self._delivery.settle()
        if isinstance(action, WaitFirst):
            if self.first_seen is None:
                log.info("%s: no checkpoint; waiting %s (first_segment_delay) for earlier "
                         "segments", self.where, src.first_segment_delay)
            self.first_seen = action.since
            return self._wait_until(action.until)
        if isinstance(action, WaitLate):
            return self._wait_late(action)
        assert isinstance(action, Idle)
        # The session's first rescan lists everything once (a segment starting before the
        # resume position may cover it); later ones start there.
        return self._wait_until(now + self.cfg.rescan_interval,
                                lambda: inventory.reload(full=not inventory.listed_fully))

    def _incarnation(self, usable: set[SegmentKey]) -> tuple[set[SegmentKey], int | None]:
        """The segments of the incarnation replayed now, and where it ends when known;
        a move to the next incarnation restarts the position before its first one
        (``ingress.incarnations``).
        """
        label = self.incarnations.label
        mine, position, until = self.incarnations.current(usable, self.position)
        if self.incarnations.label != label:
            assert position is not None
            self.position, self.origin, self._reported_below = position, position + 1, None
            self.late, self.first_seen = None, None
            self._m_late.set(0)
            self.inventory.prune()
        return mine, until

    def _produce(self, action: Produce, now: datetime) -> float:
        """Replay the planner's segment once the worker holds a slot."""
        assert self._delivery is not None
        if self.late is not None:
            log.info("%s: late range %d-%d arrived after %.1fs", self.where,
                     self.late.first, self.late.last, (now - self.late.since).total_seconds())
            self.late = None
            self._m_late.set(0)
        self.first_seen = None
        if not self._has_permit():
            return WAIT
        if self._delivery.can_submit:
            return self._begin(action.segment, action.skip_through)
        try:
            self._replay_segment(action.segment, action.skip_through)
        finally:
            self._drop_permit()
        return 0

    def _has_permit(self) -> bool:
        """True while this worker holds a replay slot; otherwise asks for one (FIFO: a
        partition that asked first gets the next free slot) and is woken when granted.
        """
        if self.permits is None:
            return True
        if self._permit is None:
            self._permit = self.permits.request(self._wake)
        return self._permit.granted

    def _drop_permit(self) -> None:
        """Give the slot back, or leave the queue."""
        req, self._permit = self._permit, None
        if req is not None and self.permits is not None:
            self.permits.cancel(req)

    def _plan_from(self, usable: set[SegmentKey]) -> int | Literal["pending"] | None:
        """The position the planner continues after: the checkpoint; without one, the
        position before the partition's recorded first one (a late first segment is then
        a gap like any other, lost only after lost_segment_timeout); ``None`` when egress
        records none (first_segment_delay); ``PENDING`` while its entry is not there yet.
        With ``start = "latest"`` and no checkpoint, the bucket's history is skipped first
        (``_start_latest`` checkpoints the newest segment's end).
        """
        if self.position is None and self.cfg.source.start == "latest" and usable:
            self._start_latest(usable)
        if self.position is not None:
            return self.position
        first = self.first.get()
        if first == PENDING:
            return PENDING
        if isinstance(first, int):
            if self.origin is None:
                self.origin = first
            return first - 1
        return None

    def _start_latest(self, usable: set[SegmentKey]) -> None:
        """``start = "latest"``, no checkpoint: skip the history the bucket holds now (an
        explicit choice: WARNING with the range, ``messages_skipped``) and checkpoint its
        end at once, so a restart resumes there instead of skipping further.
        """
        newest = max(usable, key=lambda s: (s.end, -s.start))
        first = min(s.start for s in usable)
        log.warning("%s: start = latest: positions %d-%d (%d) already in the bucket are "
                    "skipped; replay starts at %d", self.where, first, newest.end,
                    newest.end - first + 1, newest.end + 1)
        self.metrics.messages_skipped.labels(**self._labels).inc(newest.end - first + 1)
        self.origin = newest.end + 1
        self._deliver(None, Checkpoint(newest.end, newest.to_key(), self.clock()))

    def _wait_first_position(self, usable: set[SegmentKey]) -> float:
        """No checkpoint, and egress has not recorded where this partition begins yet."""
        assert self._delivery is not None
        self._delivery.settle()
        if not self._pending_logged:
            log.info("%s: no checkpoint; waiting for egress to record the partition's first "
                     "position in _topic.json (%d segment(s) known)", self.where, len(usable))
            self._pending_logged = True
        self._m_waiting.set(len(usable))
        return self._wait(self.first.seconds_to_recheck())

    def _report_below_origin(self, usable: set[SegmentKey]) -> None:
        """Log and count positions of segments that lie below ``origin``.

        The first replay without a checkpoint starts at the earliest segment known after
        ``first_segment_delay``; a segment that arrives later below that start was never
        replayed and never will be (replay only moves forward). Each position is reported
        once per worker. With ``start = "latest"`` everything below the start is history
        skipped by choice, reported once when the start was chosen (``_start_latest``).
        """
        if self.origin is None or self.cfg.source.start == "latest":
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

    def _wait_late(self, action: WaitLate) -> float:
        if self.inventory.partial:
            # The list started at the resume position: see every segment once before the
            # gap counts as late (one that starts earlier may cover it).
            self.inventory.reload(full=True)
            return 0
        late = action.late
        if self.position is None and (self.late is None or self.late.first != late.first):
            # Nothing replayed yet, so no checkpoint keeps the gap's clock across restarts:
            # the gap exists at least since the segment after it arrived in the bucket.
            after = [t for s, t in self.inventory.arrived.items()
                     if s.start == late.last + 1 and s in self.inventory.usable()]
            if after:
                late = replace(late, since=min(late.since, *after))
        if self.late is None or self.late.first != late.first:
            log.warning("%s: positions %d-%d are late (next segment starts at %d); reloading "
                        "the segment list with backoff for up to %s", self.where, late.first,
                        late.last, late.last + 1, self.cfg.source.lost_segment_timeout)
            self.metrics.late_gaps.labels(**self._labels).inc()
        self.late = late
        self._m_late.set(late.size)
        self._persist_late(late)

        def reload() -> None:
            self.inventory.reload(full=True)
            self.late = replace(late, reloads=late.reloads + 1)

        return self._wait_until(action.until, reload)

    def _persist_late(self, late: LateGap) -> None:
        """Record when the gap after the checkpoint was first seen, in the checkpoint
        itself (same offset), once per gap: a restart goes on counting from then.
        """
        last = self._last_cp
        if last is None or last.offset != self.position or last.offset + 1 != late.first:
            return
        if last.late is not None and last.late[0] == late.first:
            return
        cp = replace(last, updated_at=self.clock(), late=(late.first, late.since))
        assert self._delivery is not None
        self._delivery.deliver(None, cp)
        self._delivery.settle()       # at-least-once: out before the worker waits
        self._last_cp = cp

    def _declare_lost(self, action: DeclareLost) -> None:
        log.error("%s: positions %d-%d (%d) declared LOST after %s: no segment covering them "
                  "arrived", self.where, action.first, action.last, action.size,
                  self.cfg.source.lost_segment_timeout)
        self.metrics.segments_lost.labels(**self._labels).inc()
        self.metrics.messages_lost.labels(**self._labels).inc(action.size)
        usable = self.inventory.usable()
        following = min((s for s in usable if s.start == action.last + 1),
                        key=lambda s: -s.end, default=None)
        cp = Checkpoint(action.last, "" if following is None else following.to_key(),
                        self.clock(), lost=(action.first, action.last))
        self._deliver(None, cp)
        self.late = None
        self._m_late.set(0)

    def _open(self, seg: SegmentKey, skip_through: int | None
              ) -> tuple[SegmentStreamReader, int | None] | None:
        """Open a segment to replay: its reader and the offset records must lie above;
        ``None`` if it is gone or corrupt (reported, the inventory told).
        """
        try:
            reader = open_segment(self.store, seg)
        except ObjectNotFound:
            self._missing(seg)
            return None
        except SegmentCorrupt as e:
            self._corrupt(seg, e)
            return None
        log.info("%s: replaying segment %s%s", self.where, seg.to_key(),
                 "" if skip_through is None else f" (skipping offsets <= {skip_through})")
        after = self._replay_after(skip_through)
        if after is None and self.origin is None:
            self.origin = seg.start
            self._reported_below = None
            log.info("%s: first replay, no checkpoint: starts at %d; a segment arriving later "
                     "below it will be reported as skipped", self.where, seg.start)
        return reader, after

    def _holes(self, seg: SegmentKey) -> Checkpoint | None:
        """The checkpoint of ``seg``'s end when its last record lies before it: the footer
        vouches for the range, positions after the last record are holes.
        """
        if self.position is not None and self.position >= seg.end:
            return None
        name = seg.to_key()
        log.warning("%s: segment %s ends at %d but its last record is %s; checkpointing "
                    "its end", self.where, name, seg.end, self.position)
        return Checkpoint(seg.end, name, self.clock())

    def _segment_done(self, seg: SegmentKey) -> None:
        cp = self._holes(seg)
        if cp is not None:
            self._deliver(None, cp)
        self.inventory.prune()      # the segments now below the position
        self.metrics.segments_replayed.labels(**self._labels).inc()
        log.info("%s: segment %s done, checkpoint %d", self.where, seg.to_key(),
                 self.position)

    def _replay_segment(self, seg: SegmentKey, skip_through: int | None) -> None:
        """One segment in one step, each batch waited for (a sink without ``submit``)."""
        name = seg.to_key()
        opened = self._open(seg, skip_through)
        if opened is None:
            return
        reader, after = opened
        # The next batch is read and decoded while the current one is delivered.
        # Batches (and transactions) are capped by records and by bytes; the read-ahead
        # holds PREFETCH_BATCHES of them.
        batches = read_ahead((batch_rows(part, after, self.cfg.origin)
                              for b in reader.iter_batches(self.cfg.batch_size)
                              for part in split_by_bytes(b, self.cfg.batch_bytes)),
                             PREFETCH_BATCHES, name=f"prefetch-{self.key}")
        try:
            for rows in batches:
                if self.stopping:
                    return
                if rows is None:
                    continue
                self._deliver(rows, Checkpoint(rows.last_offset, name, self.clock()))
        except ObjectNotFound:
            # Deleted while read (compaction, a replicated delete): the batches delivered
            # so far stay; reload the list and go on from the segment that covers the rest.
            self._missing(seg)
            return
        except SegmentCorrupt as e:
            self._corrupt(seg, e)
            return
        finally:
            batches.close()
            reader.close()
        self._segment_done(seg)

    # --- a segment over the shared transaction loop -----------------------------------
    #
    # The worker holds its replay slot while the segment is open for reading (the slot
    # bounds open readers and decoding), and its decoded batches hold bytes of
    # ``max_bytes_in_flight`` until their transaction ends. It parks (no pool thread) while
    # its batch waits for the transaction, and gives the slot back once the segment is
    # read: so one transaction carries the batches of many partitions.

    def _begin(self, seg: SegmentKey, skip_through: int | None) -> float:
        """Open ``seg`` (the worker holds a slot) and go on with ``_continue``."""
        opened = self._open(seg, skip_through)
        if opened is None:
            self._drop_permit()
            return 0
        reader, after = opened
        parts = (part for b in reader.iter_batches(self.cfg.batch_size)
                 for part in split_by_bytes(b, self.cfg.batch_bytes))
        self._run = _Run(seg, seg.to_key(), reader, parts, after)
        return self._continue()

    def _continue(self) -> float:
        """One step of the segment being replayed: collect the batch whose transaction
        ended, hand the next one over, read one more ahead; park while the batch in the
        transaction waits.
        """
        run = self._run
        assert run is not None and self._delivery is not None
        if not self._collect():
            return SENT_RECHECK
        while not self.stopping:
            if run.sent is None and run.ahead is not None:
                ahead, cp, hold = run.ahead
                run.ahead = None
                rows, cp = self._prepare(ahead, cp)
                assert rows is not None
                run.sent = (self._delivery.submit(rows, cp, self._wake), rows, cp, hold)
            if run.ahead is not None or run.reader is None:
                break
            if not self._has_bytes(run):
                # Woken when granted (or by the transaction of the batch in flight).
                return WAIT if run.sent is None else SENT_RECHECK
            self._read(run)
        if run.reader is None:
            # Read to its end: the slot goes to another partition while the batch waits.
            self._drop_permit()
        if run.sent is not None or self.stopping:
            return SENT_RECHECK if run.sent is not None else 0
        assert run.ahead is None and run.reader is None
        holes = None if run.cut_short else self._holes(run.seg)
        if holes is not None:
            # Its checkpoint goes into a transaction like a batch (no thread waits for it).
            _, cp = self._prepare(None, holes)
            run.sent = (self._delivery.submit(None, cp, self._wake), None, cp, None)
            return SENT_RECHECK
        self._run = None
        if not run.cut_short:
            self._segment_done(run.seg)
        return 0

    def _read(self, run: _Run) -> None:
        """Decode the next batch of ``run`` into ``ahead`` (with its bytes), or close the
        reader at the segment's end (or when the segment went away or is corrupt: the
        batches handed over so far stay; the inventory knows where to go on).
        """
        assert run.reader is not None
        try:
            part = next(run.parts, None)
        except ObjectNotFound:
            self._missing(run.seg)
            part, run.cut_short = None, True
        except SegmentCorrupt as e:
            self._corrupt(run.seg, e)
            part, run.cut_short = None, True
        if part is None:
            self._close_reader(run)
            return
        rows = batch_rows(part, run.after, self.cfg.origin)
        if rows is None:
            return                  # every record at or below the checkpoint
        hold, run.reading = run.reading, None
        if hold is not None and self.budget is not None:
            self.budget.resize(hold, int(record_bytes(part).sum()))
        run.ahead = (rows, Checkpoint(rows.last_offset, run.name, self.clock()), hold)

    def _has_bytes(self, run: _Run) -> bool:
        """True once ``batch_bytes`` of ``max_bytes_in_flight`` are granted for the next
        read; asks for them otherwise (FIFO; the grant wakes the worker).
        """
        if self.budget is None:
            return True
        if run.reading is None:
            run.reading = self.budget.request(self.cfg.batch_bytes, self._wake)
        return run.reading.granted

    def _collect(self) -> bool:
        """True unless the run's batch still waits for its transaction; when it ended,
        its outcome: the position moves (committed) or the error is raised.
        """
        run = self._run
        if run is None or run.sent is None:
            return True
        assert self._delivery is not None
        handle, rows, cp, hold = run.sent
        if not self._delivery.collect(handle, cp):
            return False
        run.sent = None
        self._give_back(hold)
        self._delivered(rows, cp)
        return True

    def _give_back(self, hold: BudgetRequest | None) -> None:
        if hold is not None and self.budget is not None:
            self.budget.cancel(hold)

    def _close_reader(self, run: _Run) -> None:
        reader, run.reader = run.reader, None
        run.parts = iter(())
        self._give_back(run.reading)
        run.reading = None
        if reader is not None:
            try:
                reader.close()
            except ReplicatorError as e:
                log.warning("%s: closing segment %s: %s", self.where, run.name, e)

    def _end_run(self) -> None:
        """The session ends: close the reader, give every byte back. A batch still in a
        transaction is kept as ``_orphan``: the next session starts only once it ended
        (``_orphan_settled``), so it loads the checkpoint that batch may have committed.
        """
        run, self._run = self._run, None
        if run is None:
            return
        self._close_reader(run)
        if run.ahead is not None:
            self._give_back(run.ahead[2])
        if run.sent is not None:
            self._give_back(run.sent[3])
            if self._delivery is not None:
                self._orphan = (self._delivery, run.sent[0], run.sent[2])

    def _orphan_settled(self) -> bool:
        """True once the batch a failed session left in a transaction has ended (either
        way: committed, its checkpoint is what the next session loads; failed, nothing of
        it is visible).
        """
        if self._orphan is None:
            return True
        delivery, handle, cp = self._orphan
        try:
            if not delivery.collect(handle, cp):
                return False
        except ReplicatorError as e:
            log.info("%s: the batch up to %d left by the failed session was not committed: "
                     "%s", self.where, cp.offset, e)
        self._orphan = None
        return True

    def _replay_after(self, skip_through: int | None) -> int | None:
        """Records at or below this offset are skipped: the checkpoint, or, before the
        first one, what lies below the partition's recorded first position (nothing).
        """
        if self.position is None and skip_through is not None \
                and self.first.get() != NOT_RECORDED:
            return skip_through
        return self.position

    def _missing(self, seg: SegmentKey) -> None:
        log.warning("%s: segment %s is gone (compacted or deleted); reloading the segment "
                    "list", self.where, seg.to_key())
        self.metrics.segments_missing.labels(**self._labels).inc()
        self.inventory.mark_gone(seg)

    def _corrupt(self, seg: SegmentKey, e: SegmentCorrupt) -> None:
        log.error("%s: segment %s cannot be read and is skipped (its range waits for another "
                  "segment, then counts as lost): %s", self.where, seg.to_key(), e)
        self.metrics.segments_corrupt.labels(**self._labels).inc()
        self.inventory.mark_bad(seg)

    def _deliver(self, rows: Rows | None, cp: Checkpoint) -> None:
        """Make ``rows`` and then the checkpoint ``cp`` durable, then move the position.

        Steps 1-4 are the session's delivery protocol (``ingress.delivery``: one
        transaction per batch in exactly-once mode; pipelined acknowledgements, then the
        checkpoint, in at-least-once mode).
        5. Advance the in-memory position (the planner's) and metrics; ``checkpointed``
           follows when the protocol reports the checkpoint durable.

        A failure raises; the session restarts from the last committed checkpoint.
        Checkpoints only move forward: ``cp.offset`` is always above the position.
        """
        rows, cp = self._prepare(rows, cp)
        assert self._delivery is not None
        self._delivery.deliver(rows, cp)            # Steps 1-4
        self._delivered(rows, cp)                   # Step 5

    def _prepare(self, rows: Rows | None, cp: Checkpoint) -> tuple[Rows | None, Checkpoint]:
        """``rows`` and ``cp`` as delivered after the position: checked, origin set."""
        if self.position is not None and cp.offset <= self.position:
            raise FatalError(f"{self.where}: checkpoint {cp.offset} would not move forward "
                             f"from {self.position}")
        if cp.origin is None and self.origin is not None:
            cp = replace(cp, origin=self.origin)
        if cp.incarnation != self.incarnations.label:
            cp = replace(cp, incarnation=self.incarnations.label)
        if rows is not None:
            rows = replace(rows, start=self.origin if self.position is None
                           else self.position + 1)
        return rows, cp

    def _delivered(self, rows: Rows | None, cp: Checkpoint) -> None:
        """Step 5 of ``_deliver``: the batch is durable."""
        self.position = cp.offset
        self._last_cp = cp
        if rows is not None:
            self._m_produced.inc(len(rows))
            last_ts = rows.timestamps[-1]
            if last_ts > 0:
                self._m_lag.set(max(0.0, self.clock().timestamp() - last_ts / 1000.0))

    def _checkpointed(self, cp: Checkpoint) -> None:
        self.checkpointed = cp.offset
        self._m_checkpoint.set(cp.offset)
        if self.fenced_in_a_row or self.stalled:
            if self.stalled:
                log.info("%s: replaying again after being fenced", self.where)
                self.metrics.partition_stalled.labels(**self._labels).set(0)
            self.fenced_in_a_row = 0
            self.stalled = False
            self.fenced = False
