"""The replay worker of one source partition: segments in position order → destination p.

A worker exists while its controller owns destination partition ``p``; it has no thread
of its own: the process's ``Scheduler`` (``ingress.scheduler``) runs its steps on a fixed
pool. It is an explicit state machine (``ingress.replay_state``: the states, the table of
moves, ``ReplayStates.enter``): each ``step`` acts on its state, sessions start and end,
and a session's step is one ``planner.next_action`` decision and its action (replay a
segment, declare a range lost, or wait: for a late segment, the rescan, an event, the
partition's first position). Waiting is a timer, not a blocked thread; segment events
from the controller wake it.

Its parts: ``Progress`` (the position, and ``deliver``, the one way records and
checkpoints are made durable, through the session's protocol ``ingress.delivery``),
``SegmentReplayer`` (one segment's replay), ``CheckpointWriter`` (checkpoints without
records), ``StartPoint`` (where a replay without a checkpoint starts), ``PartitionStatus``
(the reports and data of the refused, fenced and failed states).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from ingress.checkpoint_writer import CheckpointWriter
from ingress.checkpoints import CheckpointStore, LoadTicket
from ingress.declared_lost import DeclaredLost
from ingress.events import SegmentEvent
from ingress.first_position import PENDING, FirstPosition
from ingress.freshness import PartitionFreshness
from ingress.gaps import Gaps
from ingress.incarnations import IncarnationTracker
from ingress.inventory import SegmentInventory
from ingress.metrics import IngressMetrics
from ingress.permits import ByteBudget, FifoPermits, PermitRequest
from ingress.planner import (
    DeclareLost,
    Idle,
    Produce,
    WaitFirst,
    WaitLate,
    next_action,
)
from ingress.progress import Progress
from ingress.replay_state import ReplayState, ReplayStates
from ingress.scheduler import WAIT, Scheduler
from ingress.segment_replay import SENT_RECHECK, ReplayerHooks, SegmentReplayer
from ingress.sink import Interrupted, ReplaySink
from ingress.start_point import StartPoint
from ingress.status import PartitionStatus
from ingress.topic_meta_cache import TopicMetaCache
from ingress.worker_config import STOP_POLL, WorkerConfig
from replicator.core.clock import Clock, utc_now
from replicator.core.errors import (
    FatalError,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
    RetriableError,
)
from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectStore
from replicator.core.wire import Checkpoint, checkpoint_key

log = logging.getLogger(__name__)

S = ReplayState


class ReplayWorker:
    """Replays one source partition into destination partition ``p``: a task of the
    process's ``Scheduler`` (no thread of its own).

    Each ``step`` acts on the worker's state (``ingress.replay_state``) and returns when
    the worker would wait: with the seconds until its timer (a late segment's reload, the
    rescan, ``first_segment_delay``, a session restart's backoff), or ``WAIT`` until woken
    (a segment event through ``offer``, a replay permit granted, the checkpoint reader's
    progress, ``stop``). A replay of one segment is one step: it holds a pool thread and a
    replay permit until the segment is done (or ``stop``).
    """

    def __init__(self, cfg: WorkerConfig, *, store: ObjectStore, checkpoints: CheckpointStore,
                 make_sink: Callable[[], ReplaySink], metrics: IngressMetrics,
                 scheduler: Scheduler, clock: Clock = utc_now,
                 permits: FifoPermits | None = None,
                 budget: ByteBudget | None = None,
                 topic_meta: TopicMetaCache | None = None) -> None:
        self.cfg = cfg
        self.permits = permits
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
        self._labels = labels
        self.freshness = PartitionFreshness(metrics, labels, clock)
        self.declared_lost = DeclaredLost(
            ref, cfg.destination_topic, self.where, metrics, labels,
            current=lambda: self.incarnations.label,
            topic_id_of=lambda label: self.incarnations.id_of(label))  # noqa: PLW0108 (later)
        self._m_checkpoint = metrics.checkpoint_offset.labels(**labels)
        self._m_waiting = metrics.segments_waiting.labels(**labels)
        self._m_first_waiting = metrics.first_position_waiting.labels(**labels)
        self.states = ReplayStates(self.where, self._entered)
        self.status = PartitionStatus(self.where, metrics, labels)
        self.incarnations = IncarnationTracker(
            store, ref, self.where, metrics.topic_incarnations.labels(**labels),
            lost=metrics.messages_lost.labels(**labels).inc, cache=topic_meta)
        self.progress = Progress(self.where, lambda: self.incarnations.label, self.freshness,
                                 metrics.messages_produced.labels(**labels).inc,
                                 lambda: self.status.refusal)
        self.writer = CheckpointWriter(self.progress, self.where, clock)
        self.inventory = SegmentInventory(
            store, ref, self.where,
            horizon=lambda: (self.progress.position, self.progress.origin),
            locations=self.incarnations.locations, current=lambda: self.incarnations.label)
        self.first = FirstPosition(store, cfg.ref,
                                   enabled=cfg.source.start != "earliest-available",
                                   cache=topic_meta)
        self.start_point = StartPoint(cfg.source, self.first, self.inventory, self.progress,
                                      self.writer, metrics, labels, self.where)
        self.replay = SegmentReplayer(
            cfg, store=store, metrics=metrics, labels=labels, clock=clock, budget=budget,
            inventory=self.inventory, first=self.first, progress=self.progress,
            writer=self.writer, where=self.where, key=self.key,
            hooks=ReplayerHooks(wake=self._wake, drop_permit=self._drop_permit,
                                stopping=lambda: self.stopping,
                                refused_at=lambda: self.status.refused_at))
        self.gaps = Gaps(cfg.source, self.inventory, self.progress, self.writer,
                         self.declared_lost, metrics, labels, self.where)
        self.sink: ReplaySink | None = None
        self._purged = False
        self._load: LoadTicket | None = None
        self._not_before = 0.0
        """Monotonic time before which no new session starts (the backoff of the state)."""
        self._retry_now = False
        """The destination's configs changed since the session began (``retry_refused``)."""
        self._stopped_from: ReplayState | None = None
        self._after_wait: Callable[[], None] | None = None
        """What the timer of the last wait does when it expires (not woken early)."""
        self._permit: PermitRequest | None = None
        self._inbox: list[SegmentEvent] = []
        self._lock = threading.Lock()
        self._woken = False
        self._stopping = threading.Event()
        self._started = False
        self._done = threading.Event()

    # --- what the controller reads --------------------------------------------------------

    @property
    def state(self) -> ReplayState:
        """The worker's state (``ingress.replay_state``)."""
        return self.states.state

    @property
    def position(self) -> int | None:
        """Replayed through (the planner's view)."""
        return self.progress.position

    @property
    def checkpointed(self) -> int | None:
        """The newest checkpoint made durable after its records."""
        return self.progress.checkpointed

    @property
    def origin(self) -> int | None:
        """Where the partition's replicated history begins (``Checkpoint.origin``)."""
        return self.progress.origin

    @property
    def refused(self) -> RecordRefused | None:
        """The record the destination refuses, while the partition is stopped at it."""
        return self.status.refused

    @property
    def stalled(self) -> bool:
        """Fenced ``FENCED_STALL`` times in a row without progress."""
        return self.status.stalled

    @property
    def failed(self) -> BaseException | None:
        """The last session failure."""
        return self.status.failed

    @property
    def replaying(self) -> bool:
        """True while a session has its checkpoint and segment list: the partition is
        replaying, or waiting for a segment or a replay slot (start-up is over).
        """
        return self.states.state in (S.REPLAYING, S.WAITING_FIRST, S.LATE, S.LOST)

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
        """Ask the worker to stop after the current batch (signal-safe); a produce waiting
        for the throttle gives up at once.
        """
        self._stopping.set()
        sink = self.sink
        if sink is not None:
            sink.interrupt()
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

    def retry_refused(self) -> None:
        """The destination topic's configs changed: a partition stopped at a refused record
        tries again now (any thread); one whose retry is running tries again as soon as
        that one fails too.
        """
        if self.status.retry_refused():
            with self._lock:
                self._retry_now = True
            self._wake()

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
    def stopping(self) -> bool:
        """True once ``stop`` was called."""
        return self._stopping.is_set()

    # --- steps (one pool thread at a time) -------------------------------------------

    def step(self) -> float | None:
        """Run until the worker would wait; a failure ends the session and moves to the
        state that says why (``_ended``). ``None`` once stopped.
        """
        try:
            return self._step()
        except Interrupted:
            return self._stop_step()     # a stop ended a produce's wait for the throttle
        except Exception as e:  # noqa: BLE001 - every failure ends the session; a bug never hot-loops
            return self._ended(e)

    def _step(self) -> float | None:
        with self._lock:
            woken, self._woken = self._woken, False
            retry_now = self._retry_now
        state = self.states.state
        if self.stopping or state is S.STOPPING:
            return self._stop_step()
        if state in (S.NEW, S.RESTARTING, S.REFUSED, S.FENCED):
            left = self._not_before - time.monotonic()
            if left > 0 and not (state is S.REFUSED and retry_now):
                return left
            if not self.replay.orphan_settled():
                return SENT_RECHECK
            self._open_session()
        if self.states.state is S.OPENING:
            return self._start_replay()
        after, self._after_wait = self._after_wait, None
        if after is not None and not woken:
            after()
        return self._next()

    def _entered(self, old: ReplayState, new: ReplayState) -> None:
        """After every move (``ReplayStates.enter``): the gauges that follow the state."""
        self._m_first_waiting.set(1 if new is S.WAITING_FIRST else 0)
        if old is S.LATE and new is not S.LATE:
            self.metrics.segments_late.labels(**self._labels).set(0)

    def _ended(self, e: BaseException) -> float | None:
        """The session failed with ``e``: it ends, and the worker moves to the state that
        says why, with its report and backoff: ``FENCED``, ``REFUSED`` (the partition
        stops at the record), or ``RESTARTING``; a stopping worker stops instead.
        """
        if not isinstance(e, ReplicatorError):
            log.exception("%s: unexpected error in the replay session", self.where)
        fenced = isinstance(e, ProducerFenced)
        if self.stopping and not fenced:
            self._purge_unacknowledged()
        self._end_session()
        if self._purged or self.stopping:
            if not fenced:
                # Revoked or stopping: the batch in flight was not committed (its
                # partition left this process first); the next owner replays it.
                log.info("%s: stopped (%s): %s", self.where,
                         "producer purged" if self._purged else "revoked", e)
            self._finish()
            return None
        if isinstance(e, ProducerFenced):
            delay, state = self.status.fenced(e), S.FENCED
        elif isinstance(e, RecordRefused):
            delay, state = self.status.record_refused(e), S.REFUSED
        elif isinstance(e, RetriableError | FatalError):
            kind = "retriable" if isinstance(e, RetriableError) else "fatal"
            delay, state = self.status.session_failed(e, kind), S.RESTARTING
        else:
            delay, state = self.status.session_failed(e, "unexpected"), S.RESTARTING
        # Not woken early by events: a session failing before it drains its inbox must
        # not spin.
        self._not_before = time.monotonic() + delay
        self.states.enter(state, str(e))
        with self._lock:
            if state is S.REFUSED and self._retry_now:
                return 0            # the destination changed while this session ran
        return delay

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

    def _stop_step(self) -> float | None:
        """``STOPPING``: the batch in flight ends (committed, or never committable once
        its partition is revoked), the last checkpoints go out, then ``STOPPED``.
        """
        if self.states.state is not S.STOPPING:
            self._stopped_from = self.states.state
            self.states.enter(S.STOPPING, "stop")
        if self.replay.run is not None and not self.replay.collect():
            # Its batch may still commit: the revoke waits for this worker until it
            # did, or until it never can (the partition taken from ``Ownership``).
            return STOP_POLL
        delivery = self.progress.delivery
        if delivery is not None and self._stopped_from in (S.REPLAYING, S.WAITING_FIRST,
                                                           S.LATE, S.LOST):
            delivery.settle()   # the last checkpoints out (at-least-once)
        self._finish()
        return None

    def _finish(self) -> None:
        """``STOPPED``: the session closed, the worker's last step."""
        self._end_session()
        self.freshness.close()
        self._m_first_waiting.set(0)
        if self.states.state is not S.STOPPING:
            self.states.enter(S.STOPPING, "stop")
        self.states.enter(S.STOPPED)
        self._done.set()

    def _open_session(self) -> None:
        """``OPENING``: the sink and the delivery protocol; the checkpoint load begins."""
        with self._lock:
            self._retry_now = False
        self.states.enter(S.OPENING)
        sink = self.make_sink()
        self.sink = sink            # from here on, _end_session closes it
        if self._purged:
            sink.purge()   # purged while this session was being made
        # A per-partition sink fences older owners here (init_transactions). The shared
        # producer was initialised at process start; a former owner's open transaction is
        # waited for by the checkpoint load instead (it reads read_committed past the
        # newest checkpoint record: ingress/README.md, point 3).
        sink.start()
        self.progress.delivery = self.cfg.delivery(
            sink, self.key, self.where, on_checkpointed=self._checkpointed,
            on_aborted=self.metrics.transactions_aborted.labels(**self._labels).inc)
        self._load = self.checkpoints.begin_load()

    def _start_replay(self) -> float | None:
        """``OPENING`` → ``REPLAYING`` once the checkpoint reader has read far enough
        (woken by the reader): load the checkpoint, list the segments.
        """
        if not self.checkpoints.load_ready(self._load, self._wake):
            return WAIT
        cp, upgraded = self.checkpoints.load_for(self.key, self.legacy_key, self._load)
        self._load = None
        progress = self.progress
        progress.resume(None)
        progress.origin = None if cp is None else cp.origin
        self.incarnations.label = "" if cp is None else cp.incarnation
        if cp is not None and upgraded:
            self.writer.upgrade(cp)
        elif cp is not None:
            progress.resume(cp)
        if cp is not None:
            self._m_checkpoint.set(cp.offset)
            self.freshness.resumed(cp.updated_at)
            if cp.lost is not None:
                self.declared_lost.declared(*cp.lost, cp.incarnation)
            if cp.refused is not None and self.status.refusal is None:
                self.status.refusal = cp.refused    # replayed alone
        log.info("%s: replay starts after checkpoint %s (segment %s)", self.where,
                 "none" if cp is None else cp.offset, "-" if cp is None else cp.segment)
        self.gaps.resumed(cp)
        if self.status.refusal is not None:
            self.writer.refusal(self.status.refusal)
        self._drain_inbox()
        # List from the resume position: level 0 from the segment the checkpoint came
        # from (the checkpoint may lie inside it).
        anchor = None if cp is None else SegmentKey.try_parse(cp.segment)
        self.inventory.anchor = anchor.start if anchor is not None and anchor.level == 0 \
            and anchor.partition_ref == self.cfg.ref else None
        self.inventory.listed_fully = False
        self.inventory.reload()
        self.states.enter(S.REPLAYING, "checkpoint loaded")
        self._after_wait = None
        return 0

    def _end_session(self) -> None:
        """Close the session's sink (abort what is open); the next step starts a new one."""
        self.replay.end_run()
        self._drop_permit()
        self.progress.delivery = None
        load, self._load = self._load, None
        self.checkpoints.cancel_load(load)
        self._after_wait = None
        sink, self.sink = self.sink, None
        if sink is None:
            return
        try:
            try:
                sink.abort()
            finally:
                sink.close()
        except ReplicatorError as e:
            log.warning("%s: closing the session's sink: %s", self.where, e)

    def _checkpointed(self, cp: Checkpoint) -> None:
        """The delivery made ``cp`` durable after its records."""
        self.progress.checkpointed = cp.offset
        self._m_checkpoint.set(cp.offset)
        self.status.checkpointed(cp)

    # --- a session's steps ---------------------------------------------------------------

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
        """One planner decision and its action; the state follows the decision."""
        src = self.cfg.source
        inventory = self.inventory
        delivery = self.progress.delivery
        assert delivery is not None
        if self.replay.run is not None:
            return self.replay.cont()
        self._drain_inbox()
        everything = inventory.usable()
        self.start_point.latest_incarnation(self.incarnations, everything)
        usable, until = self._incarnation(everything)
        self.start_point.report_below_origin(usable)
        now = self.clock()
        plan_from = self.start_point.plan_from(usable, now)
        if plan_from == PENDING:
            # No checkpoint, and egress has not recorded where this partition begins yet.
            self._drop_permit()
            self.states.enter(S.WAITING_FIRST if usable else S.REPLAYING, "first position")
            delivery.settle()
            self.start_point.log_pending(usable)
            self._m_waiting.set(len(usable))
            return self._wait(self.first.seconds_to_recheck())
        assert not isinstance(plan_from, str)
        action = next_action(plan_from, usable, now, src, late=self.gaps.late,
                             first_seen=self.start_point.first_seen,
                             floor=inventory.floor(), until=until)
        pos = -1 if self.position is None else self.position
        self._m_waiting.set(sum(1 for s in usable if s.end > pos))
        if isinstance(action, Produce):
            self.states.enter(S.REPLAYING, "a segment to replay")
            return self._produce(action, now)
        self._drop_permit()
        if isinstance(action, DeclareLost):
            self.states.enter(S.LOST, "lost_segment_timeout")
            self.gaps.declare_lost(action)
            return 0
        # Nothing to produce now: every checkpoint out before the worker waits.
        delivery.settle()
        if isinstance(action, WaitLate):
            self.states.enter(S.LATE, "a gap after the position")
            return self._wait_late(action)
        self.states.enter(S.REPLAYING, "waiting for segments")
        if isinstance(action, WaitFirst):
            if self.start_point.first_seen is None:
                log.info("%s: no checkpoint; waiting %s (first_segment_delay) for earlier "
                         "segments", self.where, src.first_segment_delay)
            self.start_point.first_seen = action.since
            return self._wait_until(action.until)
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
        self.inventory.known.difference_update(self.incarnations.left_behind(usable))
        if self.incarnations.label != label:
            assert position is not None
            progress = self.progress
            progress.position, progress.origin = position, position + 1
            progress.reported_below = None
            self.gaps.clear()
            self.start_point.first_seen = None
            # The listings so far covered only the incarnations reachable then: list the
            # one entered from its first position (one listing per move).
            self.inventory.reload(retry_gone=False)
            mine = {s for s in self.inventory.usable()
                    if s.incarnation == self.incarnations.label}
        return mine, until

    def _produce(self, action: Produce, now: datetime) -> float:
        """Replay the planner's segment once the worker holds a slot."""
        self.gaps.filled(now)
        self.start_point.first_seen = None
        if not self._has_permit():
            return WAIT
        assert self.progress.delivery is not None
        if self.progress.delivery.can_submit:
            return self.replay.begin(action.segment, action.skip_through)
        try:
            self.replay.replay_segment(action.segment, action.skip_through)
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

    def _wait_late(self, action: WaitLate) -> float:
        if self.inventory.partial:
            # The list started at the resume position: see every segment once before the
            # gap counts as late (one that starts earlier may cover it).
            self.inventory.reload(full=True)
            return 0
        return self._wait_until(action.until, self.gaps.wait(action))
