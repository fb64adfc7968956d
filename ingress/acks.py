"""At-least-once: the process's shared idempotent producer (ingress/README.md, "Producer
and fencing").

* ``SharedAcks``: one idempotent producer, acknowledgements and failures counted per sink
  (per produce call), never per destination partition: in fan-in several sinks write one
  partition.
* ``SharedAckSink``: a worker's ``ReplaySink`` over it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ingress.limits import DestinationLimits, client_refused, refused_record
from ingress.ownership import TP
from ingress.replica_stall import UnacknowledgedWatch
from ingress.rows import Rows
from ingress.sink import PURGE_WAIT, Interrupted, ReplaySink
from ingress.throttle import ProduceThrottle, rows_bytes
from replicator.core.batch_limits import DEFAULT_CLIENT_MAX
from replicator.core.errors import (
    KafkaFatalError,
    KafkaRetriableError,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
)
from replicator.core.kafka import DeliveryReport, Producer
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint

log = logging.getLogger(__name__)

CHUNK_POLL = 0.005
"""Seconds of serving callbacks between checks for a partition's previous chunk."""


class SharedAcks:
    """At-least-once: one idempotent producer for every partition of the process, with
    acknowledgements and failures counted per sink, from each produce call's own delivery
    callbacks (``SharedAckSink.ended_by``, ``SharedAckSink.record_failed``).

    A worker that misses its revoke deadline, or closes a session, with records still
    unacknowledged gets the whole producer purged (librdkafka purges per producer, not per
    partition) and replaced: its queued records never reach the partition once it is
    released (a closed session's could otherwise arrive after a later revoke); the other
    workers' unacknowledged records are dropped too, so their sinks fail once and their
    sessions redo them from their checkpoints (duplicates, never interleaving).
    """

    def __init__(self, kafka_settings: KafkaSettings, *, timeout: float = 60.0,
                 make_producer: Callable[[], Producer] | None = None,
                 limits: DestinationLimits | None = None,
                 unacknowledged: UnacknowledgedWatch | None = None) -> None:
        self.kafka_settings = kafka_settings
        self.unacknowledged = unacknowledged
        """Reports partitions whose records stay unacknowledged because fewer of their
        replicas are in sync than ``min.insync.replicas`` (``ingress.replica_stall``);
        ``None``: not asked."""
        self.timeout = timeout
        self.limits = limits
        self._gates: dict[TP, threading.Lock] = {}
        self._tails: dict[TP, tuple[Producer, threading.Event]] = {}
        """Each cut partition's last chunk: its producer, and set once it ended."""
        self._make = make_producer or (
            lambda: Producer(kafka_settings, name="ingress producer", track_acks=True))
        self.lock = threading.RLock()
        self._producer: Producer | None = None
        self._sinks: set[SharedAckSink] = set()
        self.throttle: ProduceThrottle | None = None
        """``[ingress] max_bytes_per_second`` (``None``: unlimited; ``ingress.throttle``)."""

    def start(self) -> None:
        """Create the producer.

        Raises:
            ConfigError: librdkafka refuses the configuration.
        """
        self._producer = self._make()

    @property
    def producer(self) -> Producer:
        """The current producer (after ``start``)."""
        assert self._producer is not None, "start() first"
        return self._producer

    def register(self, sink: SharedAckSink) -> None:
        """A new worker session's sink."""
        with self.lock:
            self._sinks.add(sink)

    def unregister(self, sink: SharedAckSink) -> None:
        """The session ended."""
        with self.lock:
            self._sinks.discard(sink)
        if self.unacknowledged is not None:
            self.unacknowledged.forget(sink)

    def produce(self, sink: SharedAckSink, rows: Rows) -> None:
        """Enqueue ``rows`` for the sink's partition (refused once the sink is purged).

        The enqueue runs *outside* ``lock``: with the broker not answering it waits for
        room in the client's queue, and only ``release`` (which takes ``lock``) would
        empty that queue by purging it; the purge makes the waiting enqueue give up
        (``Producer.purge``), so a revoke never waits for queue space.

        A topic whose ``max.message.bytes`` is below ``batch.size`` gets its records in
        chunks that fit it (``ingress.limits``), each enqueued once the partition's
        previous chunk (of any sink: fan-in) has ended, so librdkafka never batches two
        together.

        A worker stopping while its call waits for the throttle ends the wait
        (``SharedAckSink.interrupt``): a revoke is never held up by the rate limit.

        Raises:
            KafkaFatalError: the sink was purged (its revoke deadline passed).
            KafkaRetriableError: the producer was purged for another sink, or a record of
                this sink failed; redo from the checkpoint (``RecordRefused``: the
                destination, or the client itself, refused one for good).
            Interrupted: the worker is stopping; nothing of ``rows`` was enqueued.
        """
        if self.throttle is not None and \
                not self.throttle.admit(rows_bytes(rows), sink.check, sink.interrupted):
            raise Interrupted(f"{sink.where}: stopping while the produce waited for "
                              "max_bytes_per_second")
        if self.limits is None or self.limits.room(sink.topic) is None:
            self._enqueue(sink, rows, None)
            return
        with self._gate(sink.tp):
            for part in self.limits.cut(sink.topic, rows):
                self._wait_tail(sink)
                ended = threading.Event()
                self._tails.pop(sink.tp, None)
                self._tails[sink.tp] = (self._enqueue(sink, part, ended), ended)

    def _gate(self, tp: TP) -> threading.Lock:
        """The lock a partition's cut records are enqueued under (one chunk at a time)."""
        with self.lock:
            return self._gates.setdefault(tp, threading.Lock())

    def _wait_tail(self, sink: SharedAckSink) -> None:
        """Wait until the partition's last chunk has ended (serving callbacks), unless the
        producer that sent it was replaced since.

        Raises:
            KafkaRetriableError: it did not end within ``timeout``, or ``sink`` failed.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            tail = self._tails.get(sink.tp)
            if tail is None or tail[1].is_set() or tail[0] is not self._producer:
                return
            sink.check()
            if time.monotonic() > deadline:
                raise KafkaRetriableError(f"{sink.where}: the partition's previous records "
                                          f"were not acknowledged within {self.timeout:.0f}s")
            tail[0].poll(CHUNK_POLL)

    def _enqueue(self, sink: SharedAckSink, rows: Rows, ended: threading.Event | None
                 ) -> Producer:
        """Enqueue ``rows`` as one call; returns the producer that took them.

        A record the client itself refuses (larger than its own ``message.max.bytes``;
        the worker sends such a record alone, ``ingress.limits``) is this sink's refusal:
        only what was enqueued stays counted.
        """
        with self.lock:
            sink.check()
            p = self.producer
            # Counted before the enqueue: records enqueued before a refusal stay
            # unanswered for this sink, so closing it purges them (never left queued).
            sink.add_sent(len(rows))
        try:
            p.produce_many(sink.topic, sink.partition, rows.timestamps, rows.keys,
                           rows.values, rows.headers, rows.offsets,
                           on_ends=sink.ended_by(len(rows), ended),
                           on_failure=sink.failed_in(rows))
        except KafkaFatalError:
            sink.check()     # purged under the enqueue: say why (ours, or another sink's)
            raise
        except RecordRefused as e:
            client_max = DEFAULT_CLIENT_MAX if self.limits is None else self.limits.client_max
            refused = client_refused(rows, e, client_max, sink.where)
            if not e.enqueued:
                sink.add_sent(-len(rows))   # nothing of the call is in the client
            # Otherwise the records before it stay counted: their call never ends (its
            # last record is not in the client), so closing the sink purges them.
            sink.refused_locally(refused)
            raise refused from e
        return p

    def produce_checkpoint(self, sink: SharedAckSink, topic: str, key: str,
                           value: bytes) -> None:
        """Enqueue a checkpoint; its acknowledgement is counted by the sink. Like
        ``produce``, the enqueue (which may wait for queue space) runs outside ``lock``.

        Raises:
            KafkaFatalError / KafkaRetriableError: as ``produce``.
        """
        with self.lock:
            sink.check()
            p = self.producer
            sink.cp_sent()
        try:
            p.produce(topic, value, key.encode(), on_delivery=sink.cp_delivered)
        except KafkaFatalError:
            sink.check()
            raise

    def outstanding(self, sink: SharedAckSink, timeout: float) -> int:
        """Records of the sink's partition not acknowledged yet (after serving callbacks
        for up to ``timeout``).

        How many ended is read *before* the sink's failures: a record counted as ended
        here either was acknowledged or its failure is already recorded (reports of one
        partition come in the order the records were produced, the batch's last one
        after every other), so a callback served by another thread between the two reads
        can only make the count understate, never hide a failure.

        Raises:
            KafkaRetriableError: a record of this sink failed.
        """
        p = self.producer
        p.poll(timeout)
        n = self.unanswered(sink, p)
        if self.unacknowledged is not None:
            # NOT_ENOUGH_REPLICAS is retried by librdkafka unseen: ask while they wait.
            self.unacknowledged.note(sink, sink.tp, n, sink.ended)
        sink.raise_failures()
        return n

    def unanswered(self, sink: SharedAckSink, p: Producer | None = None) -> int:
        """Records of the sink (its produce calls, not its partition: in fan-in other
        sinks write the partition too) whose delivery has not ended (acknowledged or
        failed), without taking failures: a failed record does not hide those queued
        behind it (revoke).
        """
        p = p or self.producer
        with self.lock:
            if p is not self._producer:
                return 0
        return sink.unanswered()

    def release(self, sink: SharedAckSink, why: str = "at the revoke deadline") -> None:
        """``sink``'s worker missed its revoke deadline (or its session closed with
        records unacknowledged): refuse its later records; if some of its records are
        still unacknowledged, purge the whole producer (see the class).
        """
        sink.purged = True
        left = sink.outstanding_now()
        if not left:
            return
        with self.lock:
            old = self.producer
            for s in self._sinks:
                if s is not sink:
                    s.broken = True
            old.purge()
            unanswered = old.flush(min(self.timeout, PURGE_WAIT))
            if unanswered:
                old.purge(in_flight=True)
                log.error("%s: %d record(s) already sent were not acknowledged within %.0fs "
                          "of the purge; they may still reach the partition beside its new "
                          "owner", sink.where, unanswered, min(self.timeout, PURGE_WAIT))
            self._producer = self._make()
        log.warning("%s: %d record(s) unacknowledged %s: the shared producer was purged "
                    "and replaced; other partitions redo their unacknowledged batches from "
                    "their checkpoints", sink.where, left, why)


class SharedAckSink(ReplaySink):
    """A worker's at-least-once sink over the process's ``SharedAcks``."""

    transactional = False

    def __init__(self, shared: SharedAcks, *, topic: str, partition: int,
                 checkpoint_topic: str) -> None:
        self.shared = shared
        self.topic = topic
        self.partition = partition
        self.checkpoint_topic = checkpoint_topic
        self.tp: TP = (topic, partition)
        self.where = f"{topic}[{partition}]"
        self.purged = False
        self.broken = False
        self.checkpoints_in_flight = 0
        self._cp_error: str | None = None
        self._failed = 0
        self._first_failure: DeliveryReport | None = None
        self._failed_rows: Rows | None = None
        self._sent = 0
        self._ended = 0
        self._lock = threading.Lock()
        self.interrupted = threading.Event()
        """Set when the worker stops: a produce waiting for the throttle gives up."""

    def interrupt(self) -> None:
        self.interrupted.set()

    def refused_locally(self, error: RecordRefused) -> None:
        """The client refused a record of this sink when it was enqueued: the sink's
        failure, like a refused delivery (no checkpoint follows it).
        """
        with self._lock:
            self._failed += 1
            if self._first_failure is None:
                self._first_failure = DeliveryReport(self.topic, self.partition, -1, error,
                                                     error.reason)
                self._failed_rows = None

    def check(self) -> None:
        """Raise if this sink may not produce (purged, or its records were purged, or one
        of its records failed: no checkpoint may follow a failed record).
        """
        if self.purged:
            raise KafkaFatalError(f"{self.where}: producer purged after the revoke deadline")
        if self.broken:
            raise KafkaRetriableError(f"{self.where}: the shared producer was purged for "
                                      "another partition; redo from the checkpoint")
        if self._cp_error is not None:
            raise KafkaRetriableError(f"{self.where}: a checkpoint was not delivered: "
                                      f"{self._cp_error}")
        self.raise_failures()

    def ended_by(self, n: int, ended: threading.Event | None = None
                 ) -> Callable[[int, DeliveryReport], None]:
        """The listener of a produce call of ``n`` records: its last record's report (any
        outcome) ends the whole call, as one partition's records are reported in the
        order they were produced (and sets ``ended``).
        """
        def ends(i: int, report: DeliveryReport) -> None:
            if i == n - 1:
                with self._lock:
                    self._ended += n
                if ended is not None:
                    ended.set()
        return ends

    def failed_in(self, rows: Rows) -> Callable[[DeliveryReport], None]:
        """The failure listener of a produce call of ``rows`` (``record_failed``; a
        refusal names its record from them).
        """
        def failed(report: DeliveryReport) -> None:
            self.record_failed(report, rows)
        return failed

    def add_sent(self, n: int) -> None:
        """``n`` more records of this sink are being enqueued."""
        with self._lock:
            self._sent += n

    @property
    def ended(self) -> int:
        """Records of this sink whose delivery ended (acknowledged or failed)."""
        with self._lock:
            return self._ended

    def unanswered(self) -> int:
        """Records of this sink whose delivery has not ended."""
        with self._lock:
            return self._sent - self._ended

    def record_failed(self, report: DeliveryReport, rows: Rows | None = None) -> None:
        """A record of this sink's produce calls failed (the producer's polling thread).
        Kept by the sink, never by the destination partition: in fan-in, several sinks
        write one partition, and only the sink whose record failed may not checkpoint.
        The first report and a count are kept (a whole batch may fail).
        """
        with self._lock:
            self._failed += 1
            if self._first_failure is None:
                self._first_failure = report
                self._failed_rows = rows

    def raise_failures(self) -> None:
        """Raise if a record of this sink failed; the failure stays (the session is over:
        every later call raises too, and ``outstanding_now`` still counts what is queued).

        Raises:
            KafkaRetriableError / KafkaFatalError / ProducerFenced: the first failure.
        """
        with self._lock:
            failed, first, rows = self._failed, self._first_failure, self._failed_rows
        if first is not None:
            if isinstance(first.error, (KafkaFatalError, ProducerFenced)):
                raise first.error
            if isinstance(first.error, RecordRefused):
                if first.error.offset is not None:
                    raise first.error           # names its record already
                limits = self.shared.limits
                raise refused_record(rows, first.error,
                                     None if limits is None else limits.limit(self.topic),
                                     self.where, first)
            raise KafkaRetriableError(f"{self.where}: {failed} record(s) failed: "
                                      f"{first.reason}")

    def cp_sent(self) -> None:
        """A checkpoint is being enqueued."""
        with self._lock:
            self.checkpoints_in_flight += 1

    def cp_delivered(self, report: DeliveryReport) -> None:
        """A checkpoint's delivery report (the producer's polling thread)."""
        with self._lock:
            self.checkpoints_in_flight -= 1
            if report.error is not None:
                self._cp_error = report.reason or str(report.error)

    def start(self) -> None:
        self.check()
        self.shared.register(self)

    def begin(self) -> None:
        raise NotImplementedError("at-least-once: no transactions")

    def produce(self, rows: Rows) -> None:
        self.shared.produce(self, rows)

    def produce_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        self.shared.produce_checkpoint(self, self.checkpoint_topic, key, checkpoint.encode())

    def commit(self) -> None:
        raise NotImplementedError("at-least-once: no transactions")

    def outstanding(self, timeout: float = 0.0) -> int:
        self.check()
        n = self.shared.outstanding(self, timeout) + self.checkpoints_in_flight
        self.check()
        return n

    def outstanding_now(self) -> int:
        """Unacknowledged records and checkpoints, without raising (revoke); a pending
        failure is not taken for "nothing unacknowledged" (the records queued behind the
        failed one would be delivered after the release).
        """
        self.shared.producer.poll(0.0)
        return self.shared.unanswered(self) + self.checkpoints_in_flight

    def flush(self) -> None:
        deadline = time.monotonic() + self.shared.timeout
        while (left := self.outstanding(0.05)) > 0:
            if time.monotonic() > deadline:
                raise KafkaRetriableError(f"{self.where}: {left} record(s) not acknowledged "
                                          f"within {self.shared.timeout:.0f}s")

    def abort(self) -> None:
        """Nothing to abort (idempotent producer)."""

    def close(self) -> None:
        try:
            if not self.purged and not self.broken:
                deadline = time.monotonic() + min(self.shared.timeout, PURGE_WAIT)
                # Nothing outstanding (the usual case) costs no wait: many partitions
                # stopped at once close one after another on the replay pool.
                wait = 0.0
                while self._unsettled(wait) and time.monotonic() < deadline:
                    wait = 0.05
        except ReplicatorError as e:
            log.warning("%s: closing the sink: %s", self.where, e)
        finally:
            try:
                if not self.purged and not self.broken and self.outstanding_now():
                    # Left queued, they would belong to no session: a revoke could not
                    # purge them, and they would reach the partition after its release.
                    self.shared.release(self, "when its session closed")
            finally:
                self.shared.unregister(self)

    def _unsettled(self, wait: float) -> int:
        """``outstanding``, except after a refused record: the records queued behind it
        end by themselves (delivered or failed), and are waited for rather than purged
        with every other partition's.
        """
        try:
            return self.outstanding(wait)
        except RecordRefused:
            self.shared.producer.poll(wait)
            return self.outstanding_now()

    def purge(self) -> None:
        self.shared.release(self)
