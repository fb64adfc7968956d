"""The replay worker of one source partition: segments in position order → destination p.

A worker exists while its controller owns destination partition ``p``; it has no thread
of its own: the process's ``Scheduler`` (``ingress.scheduler``) runs its steps on a fixed
pool. It loads the checkpoint, lists the partition's segments (all levels), and then each
step is one ``planner.next_action`` decision and its action (replay a segment, declare a
range lost, or wait: for a late segment, the rescan, an event). Waiting is a state with a
timer, not a blocked thread; segment events from the controller wake it.

Records and checkpoints are made durable by the session's delivery protocol
(``ingress.delivery``); ``_deliver`` is the only way to it.

The replay of one segment (open, read ahead, hand batches to the delivery, park while a
batch waits for the shared transaction) is ``ingress.segment_replay`` (``SegmentReplay``,
a part of this class). Why this module is still longer than 400 lines: the session
steps, the planner's actions and the late/lost/skipped/refused reports all read and move
the same state (position, origin, the segment inventory, the session's delivery); the
decisions are elsewhere already (``planner``, ``inventory``, ``delivery``, ``rows``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from ingress.checkpoints import CheckpointStore, LoadTicket
from ingress.declared_lost import DeclaredLost
from ingress.delivery import Delivery
from ingress.events import SegmentEvent
from ingress.first_position import PENDING, FirstPosition
from ingress.freshness import PartitionFreshness
from ingress.incarnations import IncarnationTracker
from ingress.inventory import SegmentInventory
from ingress.metrics import IngressMetrics
from ingress.permits import ByteBudget, FifoPermits, PermitRequest
from ingress.planner import (
    DeclareLost,
    Idle,
    LateGap,
    Produce,
    WaitFirst,
    WaitLate,
    next_action,
)
from ingress.rows import Header, Rows
from ingress.scheduler import WAIT, Scheduler
from ingress.segment_replay import SENT_RECHECK, SegmentReplay, SegmentRun
from ingress.sink import ReplaySink
from replicator.core.clock import Clock, utc_now
from replicator.core.errors import (
    FatalError,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
    RetriableError,
)
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.retry import Backoff
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import ObjectStore
from replicator.core.wire import Checkpoint, Refusal, checkpoint_key

log = logging.getLogger(__name__)


def session_backoff() -> Backoff:
    """Restart delays after a failed replay session: short first (a broker blip), capped so
    a persistent failure (a missing topic) is retried about once a minute, never in a hot
    loop.
    """
    return Backoff(initial=timedelta(milliseconds=500), multiplier=2.0,
                   maximum=timedelta(seconds=60), jitter=0.2)


def refusal_backoff() -> Backoff:
    """Retry delays of a partition stopped at a record its destination refuses: slow (the
    refusal passes only once someone changes the destination: a changed topic config
    retries at once, ``ReplayWorker.retry_refused``).
    """
    return Backoff(initial=timedelta(seconds=10), multiplier=2.0,
                   maximum=timedelta(minutes=5), jitter=0.2)


FENCED_STALL = 3
"""Fencings in a row, without a checkpoint in between, after which a partition is reported
stalled (it keeps retrying)."""

STOP_POLL = 0.1
"""Seconds between checks of a stopping worker's batch in flight (committed, or never
committable once its partition is revoked)."""


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


class ReplayWorker(SegmentReplay):
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
        self.freshness = PartitionFreshness(metrics, labels, clock)
        self.declared_lost = DeclaredLost(ref, cfg.destination_topic, self.where, metrics,
                                          labels)
        self._m_checkpoint = metrics.checkpoint_offset.labels(**labels)
        self._m_waiting = metrics.segments_waiting.labels(**labels)
        self._m_late = metrics.segments_late.labels(**labels)
        self._m_first_waiting = metrics.first_position_waiting.labels(**labels)
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
                                   enabled=cfg.source.start != "earliest-available")
        self._latest_pending = cfg.source.start == "latest"
        """``start = "latest"``, no checkpoint, and the bucket's history not looked at yet
        (``_plan_from``): decided once per worker, at its first plan."""
        self._history_skipped = cfg.source.start == "latest"
        """Positions below ``origin`` were skipped by choice (``start = "latest"``), not
        missed: ``_report_below_origin`` leaves them alone."""
        self._pending_logged = False
        self._last_cp: Checkpoint | None = None
        self.failed: BaseException | None = None
        self.refused: RecordRefused | None = None
        """The record the destination refuses, while the partition is stopped at it."""
        self._backoff = session_backoff()
        self._refusal_backoff = refusal_backoff()
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
        self._run: SegmentRun | None = None
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
            if isinstance(e, RecordRefused):
                return self._restart_in(self._record_refused(e))
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
        self.freshness.close()
        self._m_first_waiting.set(0)
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

    def _record_refused(self, e: RecordRefused) -> float:
        """The destination refused a record of this partition for good: the partition
        stops at it (the session restarts from the checkpoint below it, so nothing after
        it is produced and nothing is skipped), reported (ERROR, ``…_partition_refused``,
        ``…_records_refused_total``), and tried again on a slow backoff, or at once when
        the destination topic's configs change (``retry_refused``). Other partitions go on.
        Returns the delay before the next session.
        """
        delay = self._refusal_backoff.next()
        self.refused = e
        self.metrics.records_refused.labels(**self._labels).inc()
        self.metrics.partition_refused.labels(**self._labels).set(1)
        log.error("%s: STOPPED at a record the destination refuses: %s. Nothing after it "
                  "is produced; retrying in %.0fs, or when the destination topic's configs "
                  "change (raise its max.message.bytes, grant the write, ...)", self.where,
                  e, delay)
        return delay

    def _persist_refusal(self) -> None:
        """A session after a refusal: record the refused record in the checkpoint itself
        (same offset, once per record), so ``replicator topics`` and ``replicator
        checkpoints`` show the partition stopped at it; the next checkpoint (past it)
        carries none.
        """
        last, e = self._last_cp, self.refused
        if last is None or e is None or e.offset is None or e.offset <= last.offset:
            return
        if last.refused is not None and last.refused.offset == e.offset:
            return
        cp = replace(last, updated_at=self.clock(),
                     refused=Refusal(e.offset, e.size, e.setting or "", e.reason))
        assert self._delivery is not None
        self._delivery.deliver(None, cp)
        self._delivery.settle()
        self._last_cp = cp

    def retry_refused(self) -> None:
        """The destination topic's configs changed: a partition stopped at a refused record
        tries again now (any thread).
        """
        if self.refused is not None:
            self._refusal_backoff.reset()
            self._not_before = 0.0
            self._wake()

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
            self.freshness.resumed(cp.updated_at)
            if cp.lost is not None:
                self.declared_lost.declared(*cp.lost)
        log.info("%s: replay starts after checkpoint %s (segment %s)", self.where,
                 "none" if cp is None else cp.offset, "-" if cp is None else cp.segment)
        self.late = None
        if cp is not None and cp.late is not None and cp.late[0] == cp.offset + 1:
            # The gap's clock survives restarts: lost_segment_timeout counts from when
            # it was first seen, not from this session's start.
            self.late = LateGap(cp.late[0], cp.late[0], cp.late[1])
            log.info("%s: positions from %d have been late since %s", self.where,
                     cp.late[0], cp.late[1].isoformat())
        self._persist_refusal()
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
        self.declared_lost.arrived(events)
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
        plan_from = self._plan_from(usable, now)
        self._m_first_waiting.set(1 if plan_from == PENDING and usable else 0)
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

    def _plan_from(self, usable: set[SegmentKey], now: datetime
                   ) -> int | Literal["pending"] | None:
        """The position the planner continues after: the checkpoint; without one, the
        position before the partition's recorded first one (a late first segment is then
        a gap like any other, lost only after lost_segment_timeout); ``None`` when egress
        records none (first_segment_delay); ``PENDING`` while its entry is not there yet
        (for at most ``first_segment_delay`` once the partition has segments:
        ``_first_position_overdue``). With ``start = "latest"`` and no checkpoint, the
        history the bucket holds at the worker's first plan is skipped first
        (``_start_latest`` checkpoints the newest segment's end); with none there, the
        partition is replayed from its first position like any other.
        """
        if self._latest_pending:
            self._latest_pending = False
            if self.position is None and usable:
                self._start_latest(usable)
            elif self.position is None:
                # Nothing in the bucket yet: there is no history to skip, and everything
                # that arrives from now on is replayed from the partition's first position.
                log.info("%s: start = latest: the bucket holds no segment of the partition "
                         "yet; replay starts at its first position", self.where)
                self._history_skipped = False
        if self.position is not None:
            return self.position
        first = self.first.get()
        if first == PENDING and not self._first_position_overdue(usable, now):
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

    def _first_position_overdue(self, usable: set[SegmentKey], now: datetime) -> bool:
        """True once the partition's segments have been in the bucket for
        ``first_segment_delay`` and egress still has not recorded where its history begins
        (an egress of a release that left it out, a lost ``_topic.json`` write): one
        ERROR, and the replay goes on as without first positions (from the earliest
        segment known; one arriving later below it is reported as not replayed). Egress
        records the entry before a partition's first segment is visible, so waiting longer
        than S3 takes to replicate ``_topic.json`` waits for nothing.
        """
        if not usable:
            return False
        arrived = [t for s, t in self.inventory.arrived.items() if s in usable]
        since = min(arrived) if arrived else now
        delay = self.cfg.source.first_segment_delay
        if now < since + delay:
            return False
        first = min(s.start for s in usable)
        log.error("%s: egress has not recorded where this partition's history begins "
                  "(first_positions in _topic.json) although its segments have been in the "
                  "bucket since %s; after first_segment_delay (%s) the replay starts at the "
                  "earliest segment known, position %d (a segment arriving later below it "
                  "is reported as NOT replayed)", self.where, since.isoformat(), delay, first)
        self.first.give_up()
        self.first_seen = since
        self._pending_logged = False
        return True

    def _wait_first_position(self, usable: set[SegmentKey]) -> float:
        """No checkpoint, and egress has not recorded where this partition begins yet."""
        assert self._delivery is not None
        self._delivery.settle()
        if not self._pending_logged and usable:
            log.warning("%s: no checkpoint; waiting for egress to record the partition's "
                        "first position in _topic.json (%d segment(s) known; at most "
                        "first_segment_delay, %s, from the first one's arrival)", self.where,
                        len(usable), self.cfg.source.first_segment_delay)
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
        if self.origin is None or self._history_skipped:
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
        self.declared_lost.declared(action.first, action.last)
        self.metrics.messages_lost.labels(**self._labels).inc(action.size)
        usable = self.inventory.usable()
        following = min((s for s in usable if s.start == action.last + 1),
                        key=lambda s: -s.end, default=None)
        cp = Checkpoint(action.last, "" if following is None else following.to_key(),
                        self.clock(), lost=(action.first, action.last))
        self._deliver(None, cp)
        self.late = None
        self._m_late.set(0)

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
        self.freshness.delivered(None if rows is None else rows.timestamps[-1])
        if rows is not None:
            self._m_produced.inc(len(rows))

    def _checkpointed(self, cp: Checkpoint) -> None:
        self.checkpointed = cp.offset
        self._m_checkpoint.set(cp.offset)
        refused = self.refused
        if refused is not None and cp.refused is None and \
                (refused.offset is None or cp.offset >= refused.offset):
            log.info("%s: replicating again past the refused record (checkpoint %d)",
                     self.where, cp.offset)
            self.refused = None
            self._refusal_backoff.reset()
            self.metrics.partition_refused.labels(**self._labels).set(0)
        if self.fenced_in_a_row or self.stalled:
            if self.stalled:
                log.info("%s: replaying again after being fenced", self.where)
                self.metrics.partition_stalled.labels(**self._labels).set(0)
            self.fenced_in_a_row = 0
            self.stalled = False
            self.fenced = False
