"""The egress poll thread: one ``turn`` fetches, hands runs to the partition writers, serves
commits, applies outcomes, and every ``tick_interval`` closes segments by age, applies flow
control (``egress.flow``), rewinds failed partitions and updates gauges.

Everything here runs on the poll thread, so it never blocks on S3: uploads, closes and
commits of segments run on the upload pool (``egress.partition_writer``).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Mapping, Sequence

from egress.commits import CommitService
from egress.encode_gate import EncodeGate
from egress.flow import (
    MEMORY_RESUME_RATIO,
    FlowLimits,
    PartitionLoad,
    flush_bytes,
    memory_pressure,
    paused_partitions,
    pick_memory_victims,
)
from egress.metrics import EgressMetrics
from egress.origin import OriginFilter
from egress.out_of_range import LogStartRead, OutOfRangePartitions
from egress.partition_writer import PartitionWriter
from egress.rotation import CloseReason, should_rotate
from egress.segment import SegmentOutcome
from replicator.core.clock import Monotonic
from replicator.core.errors import (
    GroupProtocolMismatch,
    KafkaRetriableError,
    NotAuthorized,
    ReplicatorError,
)
from replicator.core.kafka import OFFSET_BEGINNING, Consumer, Fetched, TopicPartition
from replicator.core.throttle import TokenBucket

log = logging.getLogger(__name__)

CONSUME_BATCH = 2000
"""Messages per ``fetch`` call: large enough to amortise the call, small enough that one
batch is a negligible addition to the memory budget."""
POLL_TIMEOUT = 0.1
"""Seconds a ``fetch`` call waits when idle; bounds how late an age rotation fires."""
TICK_INTERVAL = 0.02
"""Age, memory and pause decisions run at most this often (they walk every partition)."""
TICK_PER_WRITER = 0.0001
"""...and with many partitions at most every ``TICK_PER_WRITER`` seconds per assigned
partition: one tick costs about 7 µs per partition, so at 1,000 partitions a 20 ms tick
took a third of the poll thread (py-spy, bench/RESULTS.md); 100 ms keeps it under a tenth,
and an age rotation or a memory decision is then at most that late."""


def tick_interval(writers: int) -> float:
    """Seconds between ticks with ``writers`` assigned partitions."""
    return max(TICK_INTERVAL, writers * TICK_PER_WRITER)
GAUGE_INTERVAL = 1.0
LARGE_FETCH_SHARE = 16
"""A fetch that brings at least ``budget / LARGE_FETCH_SHARE`` bytes applies the memory
budget and the pauses at once, not at the next tick: with records of megabytes, the fetches
of one tick were past the budget before the pause took effect."""
FETCH_FLOOR_BYTES = 1024**2
"""A fetch may take this many bytes of records past the budget (one record when larger)."""
LARGE_RECORD_DECAY = 0.9
"""Per fetch, the remembered record size decays by this factor towards the recent ones."""
THROTTLED_POLL = 1.0
"""Seconds a throttled loop may go without asking the client for a record."""
MEAN_WEIGHT = 0.2
"""Weight of the newest fetch in the mean record size."""
PROTOCOL_ERROR_INTERVAL = 60.0
"""Seconds between two ERRORs of a group that refuses this member's assignor protocol."""
SKIP_COMMIT_INTERVAL = 5.0
"""Seconds between commits of a partition whose records are all skipped
(``[egress] skip_origins``): its position moves while no segment commits it."""

Writers = dict[tuple[str, int], PartitionWriter]


class PollLoop:
    """The poll thread's work for one consumer.

    Args:
        consumer: the group consumer.
        writers: the writers of the assigned partitions (kept by the controller; the
            rebalance callbacks add and remove them during ``fetch``).
        commits: the commit service the writers wait on.
        outcomes: where workers report segment outcomes.
        metrics: the egress metrics.
        region: this process's region (metric label).
        limits: flow-control thresholds.
        clock: monotonic seconds (segment ages, backoff).
        periodic: called at every tick with ``now`` (topic metadata checks).
        log_start: starts a read of a partition's log start offset and returns its future
            at once (``Admin.log_start``: never the group consumer, never a pool thread).
        native_bytes: memory the segments do not hold but the budget charges (Arrow's
            allocations: the Parquet encoders' pages; ``egress.allocators``).
        gate: admits encodes within the budget (``egress.encode_gate``); its reservations
            count against the budget like Arrow's allocations (the larger of the two), and
            it learns at each tick what segments hold.
    """

    def __init__(self, consumer: Consumer, writers: Writers, commits: CommitService,
                 outcomes: queue.SimpleQueue[SegmentOutcome], metrics: EgressMetrics,
                 region: str, limits: FlowLimits, clock: Monotonic,
                 periodic: Callable[[float], None], log_start: LogStartRead,
                 native_bytes: Callable[[], int] = lambda: 0,
                 gate: EncodeGate | None = None) -> None:
        self.consumer = consumer
        self.writers = writers
        self.commits = commits
        self.outcomes = outcomes
        self.m = metrics
        self.region = region
        self.limits = limits
        self.clock = clock
        self.periodic = periodic
        self.native_bytes = native_bytes
        self.gate = gate
        self.peak_held = 0
        """The most bytes the budget has charged at once (a high-water mark)."""
        self.out_of_range = OutOfRangePartitions(
            log_start, metrics.log_start_stalled.labels(region),
            metrics.log_start_failures.labels(region))
        self.paused: set[tuple[str, int]] = set()
        self.memory_paused = False
        self.last_poll = 0.0
        """``time.monotonic()`` of the last fetch (health), 0 before the first."""
        self._last_tick = 0.0
        self._last_gauges = 0.0
        self._protocol_error_at = 0.0
        self.throttle: TokenBucket | None = None
        """``[egress] max_bytes_per_second`` (``None``: unlimited)."""
        self.sleep: Callable[[float], None] = time.sleep
        self._last_fetch = 0.0
        self._mean_record = 1024.0
        """Mean raw bytes of a record read lately (sizes throttled fetches)."""
        self._large_record = 0.0
        """The mean record size of recent fetches, decaying from the largest (sizes the
        next fetch to the room left in the budget)."""
        self._held = 0
        """What the budget charged at the last count (``_apply_memory_budget``)."""
        self.skip: OriginFilter | None = None
        """Leaves out records replicated from ``[egress] skip_origins`` (``None``: none)."""
        self.tails: Mapping[tuple[str, int], tuple[int, int]] = {}
        """Per assigned partition, ``(next offset, consumer position)`` at the last gauge
        update: no source position between them holds a record (transaction markers, skipped
        records). Replaced whole, so other threads (the group export) read it as is."""

    def turn(self) -> None:
        """One fetch and what follows it (or, while throttled, a short wait instead)."""
        # Nothing read yet: the size of a record is unknown, so the first fetch takes one.
        # A fetch of CONSUME_BATCH records gathers them for all of POLL_TIMEOUT, librdkafka
        # fetching more as its queue empties: with records of 8 MiB a starved loop's first
        # fetch brought up to 4 of them at once, 32 MiB against a 19 MiB share.
        batch = CONSUME_BATCH if self._large_record > 0 else 1
        if self._large_record > 0:
            # Records of megabytes: no more than the room left in the budget (one at
            # least), so what a fetch brings past it is one record, not a batch of them.
            # Small records: at least FETCH_FLOOR_BYTES of them, or a loop near its budget
            # would fetch them one by one.
            room = max(self.limits.budget - self._held, FETCH_FLOOR_BYTES)
            batch = min(batch, max(1, int(room // self._large_record)))
        if self.throttle is not None:
            batch = min(batch, self._throttled_batch())
        if batch:
            fetched = self.consumer.fetch(batch, POLL_TIMEOUT)
            self.last_poll = time.monotonic()
            self._last_fetch = self.clock()
        else:
            fetched = Fetched()
        now = self.clock()
        if fetched:
            read = self._dispatch(fetched, now)
            if read >= self.limits.budget // LARGE_FETCH_SHARE:
                writers = list(self.writers.values())
                self._apply_memory_budget(writers)
                self._apply_pauses(writers)
        self.commits.serve(self.consumer)
        self.drain_outcomes(now)
        if now - self._last_tick >= tick_interval(len(self.writers)):
            self._last_tick = now
            self._tick(now)

    def _throttled_batch(self) -> int:
        """Records the next fetch may take under ``[egress] max_bytes_per_second``; 0 to
        skip it (the loop waits a slice instead, still serving commits and ticks).

        Out of bytes, the client is still asked for one record at least every
        ``THROTTLED_POLL`` seconds: rebalance callbacks run only inside a fetch, and a
        member that fetches nothing for ``max.poll.interval.ms`` leaves the group.
        """
        throttle = self.throttle
        assert throttle is not None
        now = self.clock()
        wait = throttle.delay(now)
        if wait <= 0:
            return throttle.allowance(now, self._mean_record, CONSUME_BATCH)
        pause = min(wait, POLL_TIMEOUT)
        self.sleep(pause)
        self.m.throttled.labels(self.region).inc(pause)
        return 1 if self.clock() - self._last_fetch >= THROTTLED_POLL else 0

    # --- records ----------------------------------------------------------------------

    def _dispatch(self, fetched: Fetched, now: float) -> int:
        read = self._append_runs(fetched, now)
        if fetched.records:
            self._large_record = max(read / fetched.records,
                                     self._large_record * LARGE_RECORD_DECAY)
        if self.throttle is not None and read:
            self.throttle.take(read, now)
            records = fetched.records
            if records:
                self._mean_record += (read / records - self._mean_record) * MEAN_WEIGHT
        return read

    def _append_runs(self, fetched: Fetched, now: float) -> int:
        """Hand each run to its writer; returns the raw bytes read (for the throttle)."""
        read = 0
        for err in fetched.errors:
            self._consume_error(err)
        for key, position in fetched.out_of_range.items():
            self._position_left_the_log(key, position)
        for (topic, partition), run in fetched.runs.items():
            w = self.writers.get((topic, partition))
            if w is None:
                # Delivered just before a revoke took effect: the next owner reads them.
                log.debug("%s[%s]: %d messages of a partition not assigned here dropped",
                          topic, partition, len(run))
                self.m.dropped.labels(self.region, str(topic), str(partition)).inc(len(run))
                continue
            if self.skip is None:
                read += w.append(run, now)
                self._note_source_end(w)
                continue
            msgs = self.skip.keep(topic, run)
            if msgs:
                read += w.append(msgs, now)
            if msgs is not run:
                if self.throttle is not None:
                    # Skipped records were read from the source too (values only: cheap).
                    read += sum(len(m) for m in run) - sum(len(m) for m in msgs)
                # The run ended with skipped records: the position moves past them.
                last = run[-1].offset()
                if last is not None:
                    w.skipped_to(last + 1)
            self._note_source_end(w)
        return read

    def _note_source_end(self, w: PartitionWriter) -> None:
        """The high watermark the last fetch response gave (cached: no request), which
        bounds what a topic recreated under the fetch can have lost
        (``egress.recreate_loss``).
        """
        tp = TopicPartition(w.ref.topic, w.ref.partition)
        try:
            _, high = self.consumer.watermarks(tp, cached=True)
            positions = self.consumer.position([tp])
        except ReplicatorError as e:
            log.debug("%s: no cached watermark: %s", w.name, e)
            return
        position = positions[0].offset if positions else None
        w.note_source_end(high, position if position is not None and position >= 0 else None)

    # --- positions deleted under the consumer -----------------------------------------

    def _position_left_the_log(self, key: tuple[str, int], position: int) -> None:
        """The broker no longer has the partition's fetch position (``auto.offset.reset``
        is ``error``, so the client stopped instead of jumping silently to the log start).

        The log start is read without blocking (``egress.out_of_range``); the partition is
        not fetched until ``_settle_out_of_range`` reports the lost range and restarts it
        at the log start.
        """
        w = self.writers.get(key)
        if w is None:
            return
        if self.out_of_range.report(key, w, position, self.clock()):
            log.warning("%s: fetch position %d is no longer in the source log; reading its "
                        "log start", w.name, position)

    def _settle_out_of_range(self, now: float) -> None:
        for key, o in self.out_of_range.settle(now, self.writers):
            w = o.writer
            if w.failed is not None:
                continue    # rewinding: the rewind restarts the partition (``_rewind``)
            assert o.low is not None
            try:
                # The client stopped the partition: a seek is refused, it is assigned again.
                self._restart(TopicPartition(key[0], key[1], o.low))
            except ReplicatorError as e:
                log.warning("%s: cannot move to the log start yet, retrying: %s", w.name, e)
                self.out_of_range.retry(key, now, str(e))
                continue
            self.out_of_range.done(key)
            w.position_left_the_log(o.position, o.low)

    def forget(self, keys: Sequence[tuple[str, int]]) -> None:
        """The partitions are being released or were lost (poll thread): resume them and
        drop what the loop keeps for them.
        """
        self.out_of_range.forget(keys)
        self.forget_pauses(keys)

    def _restart(self, tp: TopicPartition) -> None:
        key = (tp.topic, tp.partition)
        self.consumer.restart(tp, self._others(key))
        # An eager restart assigns every partition again: keep the paused ones paused.
        if self.paused:
            self.consumer.pause([TopicPartition(t, p) for t, p in sorted(self.paused)])

    def _others(self, key: tuple[str, int]) -> list[TopicPartition]:
        """Every other assigned partition at the offset it reads next (eager restarts)."""
        return [TopicPartition(t, p, OFFSET_BEGINNING if v.position is None
                               else v.position)
                for (t, p), v in self.writers.items() if (t, p) != key]

    def _consume_error(self, err: ReplicatorError) -> None:
        self.m.consume_errors.labels(self.region).inc()
        if isinstance(err, GroupProtocolMismatch | NotAuthorized):
            # Repeated at every join attempt: an ERROR the operator must act on, at a rate
            # a log can carry.
            now = time.monotonic()
            if now >= self._protocol_error_at:
                self._protocol_error_at = now + PROTOCOL_ERROR_INTERVAL
                log.error("consumer: %s", err)
            return
        if isinstance(err, KafkaRetriableError):
            log.warning("consumer: %s", err)
            return
        raise err

    def drain_outcomes(self, now: float) -> None:
        """Apply the workers' segment outcomes to their writers."""
        while True:
            try:
                o = self.outcomes.get_nowait()
            except queue.Empty:
                return
            o.writer.outcome(o, now)

    def wait_idle(self, writers: Sequence[PartitionWriter], deadline: float) -> None:
        """Wait for the writers' queues while serving their commits."""
        while time.monotonic() < deadline:
            self.commits.serve(self.consumer)
            if all(w.queue.idle for w in writers):
                break
            time.sleep(0.005)
        self.commits.serve(self.consumer)

    # --- the tick ---------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        writers = list(self.writers.values())
        flush = flush_bytes(self.limits.budget, len(writers))
        for w in writers:
            w.flush_bytes = flush
            seg = w.segment
            if seg is not None:
                reason = should_rotate(seg.stats(), w.limits, now)
                if reason is not None:
                    w.close(reason)
        self._apply_memory_budget(writers)
        for w in writers:
            if w.ready_to_rewind(now):
                self._rewind(w, now)
        if self.skip is not None:
            for w in writers:
                w.commit_skipped(now, SKIP_COMMIT_INTERVAL)
        if self.out_of_range:
            self._settle_out_of_range(now)
        self._apply_pauses(writers)
        if now - self._last_gauges >= GAUGE_INTERVAL:
            self._last_gauges = now
            self._update_gauges(writers)
        self.periodic(now)

    def _apply_memory_budget(self, writers: Sequence[PartitionWriter]) -> None:
        budget = self.limits.budget
        open_held: dict[PartitionWriter, int] = {}
        # The encoders' working memory counts against the budget: what running encodes
        # reserved (egress.encode_gate), or Arrow's allocations when they are more (other
        # Arrow users of the process). No segment holds it, so none can be picked for it.
        reserved = self.gate.reserved if self.gate is not None else 0
        native = max(self.native_bytes(), reserved)
        in_flight = 0
        for w in writers:
            o, c = w.held_bytes()
            if w.segment is not None:
                open_held[w] = o
            in_flight += c
        segments = sum(open_held.values()) + in_flight
        if self.gate is not None:
            self.gate.set_held(segments)
        # While paused for memory, close down to the resume level, or the pause (which
        # stops the growth that would otherwise trigger closes) could never end.
        target = int(budget * MEMORY_RESUME_RATIO) if self.memory_paused else budget
        victims = pick_memory_victims(open_held, target, in_flight=in_flight,
                                      min_victim_bytes=self.limits.min_victim,
                                      unpickable=native)
        held = segments + native
        self._held = held
        for w in victims:
            log.info("%s: closing the open segment early (holds %d bytes; %d held in all, "
                     "%d of it by the encoders; budget %d)", w.name, open_held[w], held,
                     native, budget)
            w.close(CloseReason.MEMORY)
        # Only segments can be closed to free memory: with none holding anything, Arrow's
        # bytes alone must not keep the process paused for good.
        self.memory_paused = memory_pressure(held, budget, self.memory_paused) and segments > 0
        self.peak_held = max(self.peak_held, held,
                             self.gate.peak if self.gate is not None else 0)
        self.m.buffered.labels(self.region).set(held)
        self.m.buffered_peak.labels(self.region).set(self.peak_held)
        self.m.encode_reserved.labels(self.region).set(reserved)

    def _apply_pauses(self, writers: Sequence[PartitionWriter]) -> None:
        want = paused_partitions(
            {(w.ref.topic, w.ref.partition): PartitionLoad(
                len(w.closing), w.backlog_bytes(), w.failed is not None or w.broken.is_set())
             for w in writers}, self.limits, memory_paused=self.memory_paused)
        pause, resume = want - self.paused, self.paused - want
        if pause:
            self.consumer.pause([TopicPartition(t, p) for t, p in sorted(pause)])
            log.debug("paused %s", sorted(pause))
        if resume:
            self.consumer.resume([TopicPartition(t, p) for t, p in sorted(resume)])
            log.debug("resumed %s", sorted(resume))
        self.paused = want
        self.m.paused.labels(self.region).set(len(want))

    def forget_pauses(self, keys: Sequence[tuple[str, int]]) -> None:
        """Resume partitions that are being released.

        A pause survives a reassignment in librdkafka: resume while still assigned, or a
        partition coming back to this member would never be fetched again.
        """
        paused = [k for k in keys if k in self.paused]
        if not paused:
            return
        self.paused.difference_update(paused)
        try:
            self.consumer.resume([TopicPartition(t, p) for t, p in paused])
        except ReplicatorError as e:
            log.warning("resuming %s before release failed: %s", paused, e)

    def _rewind(self, w: PartitionWriter, now: float) -> None:
        # Seek first: clearing the failure before a seek that then fails would let the
        # partition resume where it stands while its next segment is named from the failed
        # segment's start, a key claiming records it does not hold.
        offset = w.rewind_offset()
        key = (w.ref.topic, w.ref.partition)
        tp = TopicPartition(w.ref.topic, w.ref.partition, offset)
        try:
            if key in self.out_of_range:
                # The client stopped the partition (its position left the log) and refuses
                # seeks: assign it again at the failed start instead (below the log start,
                # it leaves the log again and the loss is reported then).
                self._restart(tp)
                self.out_of_range.done(key)
            else:
                self.consumer.seek(tp)
        except ReplicatorError as e:
            # Not fatal: the partition stays failed (its records are dropped) and the
            # seek is retried after the next backoff.
            delay = w.seek_failed(now)
            log.warning("%s: seek to offset %d failed, retrying in %.1fs: %s", w.name,
                        offset, delay, e)
            self.m.seek_failures.labels(self.region).inc()
            return
        w.rewind()
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
            positions = {(tp.topic, tp.partition): tp.offset for tp in self.consumer.position(
                [TopicPartition(w.ref.topic, w.ref.partition) for w in writers])}
        except ReplicatorError as e:
            log.debug("no consumer positions: %s", e)
            positions = {}
        tails: dict[tuple[str, int], tuple[int, int]] = {}
        for w in writers:
            if w.next_offset is None:
                continue
            key = (w.ref.topic, w.ref.partition)
            if w.failed is None and key not in self.out_of_range \
                    and positions.get(key, -1) >= w.next_offset:
                # Every record returned by the poll up to the position was appended (same
                # thread), unless a failed segment drops them until its rewind.
                tails[key] = (w.next_offset, positions[key])
            try:
                # The cached watermark comes from the last fetch response: no request, and
                # for a read_committed consumer it is the last stable offset. (It is also
                # right on brokers whose ListOffsets "latest" is not, like Tansu.)
                _, high = self.consumer.watermarks(
                    TopicPartition(w.ref.topic, w.ref.partition), cached=True)
            except ReplicatorError as e:
                log.debug("%s: no cached watermark: %s", w.name, e)
                continue
            if high >= 0:
                position = max(w.next_offset,
                               positions.get((w.ref.topic, w.ref.partition), -1))
                w.metrics.lag.set(max(0, high - position))
                # An idle partition's fetches give its end too (egress.recreate_loss).
                at = positions.get((w.ref.topic, w.ref.partition), -1)
                w.note_source_end(high, at if at >= 0 else None)
        self.tails = tails
