"""Exactly-once: the process's shared transactional producer (ingress/README.md,
"Producer and fencing").

* ``TransactionLoop``: one transactional producer and one thread. Workers hand it a batch
  (records + checkpoint) and park, holding no thread or replay slot, until the batch's
  callback wakes them; it puts every batch waiting into one transaction, fenced by the
  placement group's generation and by ``Ownership`` (``ingress.ownership``) (``_transact``).
* ``SharedTxnSink`` (``ingress.txn_sink``): a worker's ``ReplaySink`` over it.

Threads and producers no longer grow with the partition count: one producer (its
librdkafka threads and connections) and one transaction thread per ``ingress.producers``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from datetime import timedelta
from typing import cast

from ingress.limits import DestinationLimits, client_refused, refused_record
from ingress.metrics import IngressMetrics
from ingress.offset_map import OffsetMapWriter
from ingress.offsets_deadline import OffsetsHung, StaleCoordinator, send_offsets_within
from ingress.ownership import TP, Ownership
from ingress.replica_stall import CHECK_AFTER, CHECK_EVERY, ReplicaStallWatch
from ingress.rows import Rows
from ingress.sink import transaction_timeout_ms
from ingress.throttle import ProduceThrottle, drain_all
from ingress.txn_batches import Batch, PartitionRevoked, Refused, Revoked, shifted
from ingress.txn_rounds import produce_rounds
from replicator.core.batch_limits import DEFAULT_CLIENT_MAX
from replicator.core.errors import (
    FatalError,
    GenerationFenced,
    KafkaFatalError,
    KafkaRetriableError,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
    RetriableError,
)
from replicator.core.kafka import (
    Admin,
    DeliveryReport,
    GroupMetadata,
    Producer,
    TopicPartition,
    group_generation,
    group_id_of,
)
from replicator.core.retry import Backoff
from replicator.core.settings import KafkaSettings

__all__ = ["Batch", "PartitionRevoked", "TransactionLoop"]

log = logging.getLogger(__name__)

WAIT_SLICE = 0.1
"""Seconds a worker waits for its transaction before checking that the loop still runs."""

FLUSH_SLICE = 0.2
"""Seconds of one wait of a transaction's flush before its delivery reports are looked at:
a record refused for good puts the transaction in an abortable state in which the rest is
never sent, so the flush would otherwise wait out its whole timeout (60 s) first."""

def producer_fenced_backoff() -> Backoff:
    """Delays before a fenced (or failed) shared producer is recreated: a transaction that
    outlived its timeout recovers at once; another live process with the same
    ``transactional.id`` is not fenced back in a hot loop.
    """
    return Backoff(initial=timedelta(milliseconds=500), multiplier=2.0,
                   maximum=timedelta(seconds=30), jitter=0.2)


class TransactionLoop:
    """Exactly-once: one transactional producer for every partition of the process.

    Args:
        kafka_settings: the destination cluster.
        transactional_id: unique per live process, the same across restarts of one
            instance (so a restarted process fences its own zombie at start).
        checkpoint_topic: where checkpoints go.
        ownership: the partitions this process owns.
        group: the placement consumer's group metadata, now (the fencing generation).
        metrics: ``transactions`` by outcome.
        timeout: seconds each flush / commit / abort / offsets call may take.
        make_producer: builds the producer (tests); default: the Kafka seam's.
        offset_map: writes each batch's offset-map entries into its transaction
            (``ingress.offset_map``); ``None``: no map.
        limits: the destination topics' ``max.message.bytes``: batches of a topic whose
            limit is below ``batch.size`` are produced in chunks that fit it
            (``ingress.limits``); ``None``: never cut.
        linger: seconds the loop waits, once a batch is waiting, for more batches before
            it begins a transaction (``ingress.transaction_linger``): the batches that
            workers hand over just after a commit go into one transaction instead of
            several; 0: begin at once.
        senders: how many workers may hand this loop a batch now (each has at most one
            waiting): the linger ends as soon as that many batches wait, since no other
            can come. ``None``: only the linger's time ends it.
        name: the thread's name.
        replica_watch: reports destination partitions below ``min.insync.replicas``
            while a transaction's records stay unacknowledged (``ingress.replica_stall``);
            default: one asking ``kafka_settings``'s cluster.
    """

    def __init__(self, kafka_settings: KafkaSettings, *, transactional_id: str,
                 checkpoint_topic: str, ownership: Ownership,
                 group: Callable[[], GroupMetadata], metrics: IngressMetrics,
                 timeout: float = 60.0,
                 make_producer: Callable[[], Producer] | None = None,
                 offset_map: OffsetMapWriter | None = None,
                 limits: DestinationLimits | None = None,
                 linger: float = 0.0,
                 senders: Callable[[], int] | None = None,
                 name: str = "transactions",
                 replica_watch: ReplicaStallWatch | None = None) -> None:
        self.name = name
        self.replica_watch = replica_watch or ReplicaStallWatch(
            lambda: Admin(kafka_settings, timeout=5.0), metrics.destination_stalled)
        self.kafka_settings = kafka_settings
        self.transactional_id = transactional_id
        self.checkpoint_topic = checkpoint_topic
        self.ownership = ownership
        self.group = group
        self.metrics = metrics
        self.timeout = timeout
        self._make = make_producer or self._new_producer
        self.offset_map = offset_map
        self.limits = limits
        self.linger = linger
        self.senders = senders
        self._producer: Producer | None = None
        self._pending: deque[Batch] = deque()
        self._apart: set[TP] = set()
        """Partitions whose batches go one per transaction (``_refused``)."""
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = producer_fenced_backoff()
        self._next_init = 0.0
        self._paused_until = 0.0
        """Monotonic time before which no transaction begins (``_failed_whole``)."""
        self.throttle: ProduceThrottle | None = None
        """``[ingress] max_bytes_per_second`` (``None``: unlimited; ``ingress.throttle``)."""

    def _new_producer(self) -> Producer:
        overrides = {}
        if "transaction.timeout.ms" not in self.kafka_settings.config:
            # Above the worst flush + commit (each may take ``timeout``), as for a
            # per-partition sink: a transaction that is merely slow is not aborted.
            overrides["transaction.timeout.ms"] = transaction_timeout_ms(self.timeout)
        return Producer(self.kafka_settings, transactional_id=self.transactional_id,
                        overrides=overrides,
                        # The offset map needs where each batch's ends landed.
                        report_successes=self.offset_map is not None)

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Create the producer and ``init_transactions`` (fails fast), start the thread.

        ``init_transactions`` fences a former run of this process (same id) and aborts its
        open transaction.

        Raises:
            ReplicatorError: the producer cannot be created or initialised.
        """
        self._ready_producer()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread; batches still waiting fail (``KafkaFatalError``); idempotent."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(3 * self.timeout)
        with self._cond:
            left, self._pending = list(self._pending), deque()
        for b in left:
            b.finish(KafkaFatalError(f"{b.topic}[{b.partition}]: ingress is closing"))
        self._producer = None

    @property
    def alive(self) -> bool:
        """True while the transaction thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """True once ``start`` started the thread (and until ``close``)."""
        return self._thread is not None and not self._stopping.is_set()

    # --- worker side ------------------------------------------------------------------

    def submit(self, batch: Batch) -> None:
        """Queue a batch for the next transaction (FIFO)."""
        with self._cond:
            self._pending.append(batch)
            self._cond.notify()

    def wait(self, batch: Batch) -> None:
        """Wait for the batch's transaction. A batch whose partition was revoked (or
        granted again since: another epoch) and is not being committed is given up at once:
        the loop can no longer commit it, and the revoke callback waits for this worker.

        Raises:
            PartitionRevoked / GenerationFenced / ProducerFenced / RetriableError /
            FatalError: the batch was not committed.
        """
        while not self.check(batch):
            batch.done.wait(WAIT_SLICE)

    def check(self, batch: Batch) -> bool:
        """``wait`` without waiting: True once the batch is committed, False while it may
        still be; raises as ``wait`` does.
        """
        if not batch.done.is_set():
            if self.ownership.abandoned(batch.tp, batch.epoch) and not batch.done.is_set():
                raise PartitionRevoked(f"{batch.topic}[{batch.partition}]: revoked while "
                                       "its batch waited for a transaction")
            if not self.alive and not batch.done.is_set():
                raise KafkaFatalError(f"{batch.topic}[{batch.partition}]: the transaction "
                                      "thread is not running")
            if not batch.done.is_set():
                return False
        if batch.error is not None:
            raise batch.error
        return True

    # --- the transaction thread -------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            batches: list[Batch] = []
            try:
                pause = self._paused_until - time.monotonic()
                if pause > 0:
                    self._stopping.wait(pause)
                    continue
                if self.throttle is not None:
                    self.throttle.hold(self._stopping)
                with self._cond:
                    if not self._pending:
                        self._cond.wait(0.2)
                    if self._pending and self.linger > 0:
                        self._gather()
                    batches = self._take()
                if batches:
                    self._transact(batches)
            except Exception as e:  # a bug or a client surprise must not end the loop
                log.exception("transaction of %d batch(es) failed unexpectedly; the "
                              "producer is recreated", len(batches))
                self._drop_producer(e)
                self._fail([b for b in batches if not b.done.is_set()],
                           KafkaFatalError(f"transaction failed unexpectedly: {e!r}"))

    def _gather(self) -> None:
        """(Under ``_cond``.) Wait up to ``linger`` for more batches: the lock is released
        while waiting, so workers keep handing theirs over; it ends early once every
        worker that can send one has (``senders``), or on a stop.
        """
        full = self.senders() if self.senders is not None else None

        def gathered() -> bool:
            return self._stopping.is_set() or (full is not None
                                               and len(self._pending) >= full)

        self._cond.wait_for(gathered, self.linger)

    def _take(self) -> list[Batch]:
        """The batches of the next transaction (under ``_cond``): a batch that goes
        ``alone`` (a record its destination may refuse) when it is first in line;
        otherwise every other one waiting, but one per partition set apart by a refusal
        (``_apart``), and no more than the throttle's tokens cover; the others wait, in
        order.
        """
        if self._pending and self._pending[0].alone:
            return drain_all(deque([self._pending.popleft()]), self.throttle)
        if not self._apart and not any(b.alone for b in self._pending):
            return drain_all(self._pending, self.throttle)
        candidates: deque[Batch] = deque()
        wait: deque[Batch] = deque()
        seen: set[TP] = set()
        for b in self._pending:
            if b.alone or (b.tp in self._apart and b.tp in seen):
                wait.append(b)
            else:
                seen.add(b.tp)
                candidates.append(b)
        take = drain_all(candidates, self.throttle)
        candidates.extend(wait)
        self._pending = candidates
        return take

    def _ready_producer(self) -> Producer:
        if self._producer is None:
            wait = self._next_init - time.monotonic()
            if wait > 0:
                self._stopping.wait(wait)
            p = self._make()
            p.init_transactions(self.timeout)
            self._producer = p
            log.info("shared transactional producer %s ready", self.transactional_id)
        return self._producer

    def _drop_producer(self, why: BaseException) -> None:
        self._producer = None
        delay = self._backoff.next()
        self._next_init = time.monotonic() + delay
        log.warning("shared producer %s is recreated in %.1fs: %s", self.transactional_id,
                    delay, why)

    def _transact(self, batches: list[Batch]) -> None:
        """Commit ``batches`` (several partitions) in one transaction (``_steps``); on
        failure, hand each batch its error (a revoked partition's batch fails, the others
        go into the next transaction).
        """
        keep: list[Batch] = []
        for b in batches:                                               # Step 0
            if self.ownership.owns(b.tp, b.epoch):
                keep.append(b)
            else:
                b.finish(PartitionRevoked(f"{b.topic}[{b.partition}]: revoked before its "
                                          "transaction"))
        if not keep:
            return
        try:
            p = self._ready_producer()
        except ReplicatorError as e:
            self._drop_producer(e)
            self._fail(keep, e)
            return
        try:
            self._steps(p, keep)
        except Revoked as r:
            self._revoked(p, keep, r)
            return
        except Refused as f:
            self._refused(p, keep, f)
            return
        except (RetriableError, FatalError) as e:
            self._failed(p, keep, e)
            return
        self._backoff.reset()
        self.replica_watch.clear(b.tp for b in keep)
        self.metrics.transactions.labels(outcome="committed").inc()
        with self._cond:
            self._apart -= {b.tp for b in keep}
        for b in keep:
            b.finish()

    def _steps(self, p: Producer, keep: list[Batch]) -> None:
        """One transaction for batches of several partitions.

        0. (``_transact``) A batch joins only if its partition is owned now.
        1. Begin the transaction.
        2. Produce the records of every batch to their destination partitions (a batch
           whose topic's ``max.message.bytes`` is below ``batch.size`` in chunks that fit
           it, one chunk per partition per round, the batches of one partition one after
           the other: steps 2-3 repeat until every chunk is in; ``_rounds``).
        3. Flush: the records are in the destination logs before any checkpoint is sent
           (``ExactlyOnce``'s reason: a broker that shows aborted records must never hold a
           checkpoint without its records). A record a destination refuses for good fails
           only its partition's batch (``Refused``): the others go into the next
           transaction at once. The flush looks at the delivery reports every
           ``FLUSH_SLICE``, so a refusal does not wait out its timeout.
        4. Produce every batch's checkpoint record, and its offset-map entries (where its
           records landed, learnt from the delivery reports of its first and last record),
           and wait for their delivery reports (acks=all): the checkpoints are in the log,
           below its high watermark, before the generation check. A member that passes
           step 5 and then stalls past ``revoke_timeout`` cannot let the next owner load an
           older checkpoint: the load sees this transaction's checkpoint record and waits
           for the transaction's end (ingress/README.md, "Producer and fencing", point 3).
        5. ``send_offsets_to_transaction`` with the placement consumer's group metadata:
           the group coordinator refuses a member of an older generation
           (``GenerationFenced``). A member in no generation at all is refused here
           (the broker would accept its metadata unchecked).
        6. Check ownership again, under the lock the revoke callback takes; a revoked
           partition aborts the transaction (``Revoked``).
        7. Commit, still marked "committing" under that lock: ``revoke`` waits for it.

        Raises:
            Revoked / Refused / ProducerFenced / GenerationFenced / RetriableError /
            FatalError.
        """
        p.begin_transaction()                                           # Step 1
        for chunks in produce_rounds(keep, self.limits, self.offset_map):
            for b, lo, rows, ends in chunks:                            # Step 2
                self._produce(p, b, rows, None if ends is None else shifted(ends, lo))
            self._flush(p, "record(s)", keep)                           # Step 3
        for b in keep:                                                  # Step 4
            p.produce(self.checkpoint_topic, b.checkpoint.encode(), b.key.encode())
        if self.offset_map is not None:
            self.offset_map.produce(keep, p.produce)
        self._flush(p, "checkpoint record(s)", keep)
        self._send_offsets(p, keep)                                     # Step 5
        with self.ownership.commit_guard((b.tp, b.epoch) for b in keep) as lost:  # Step 6
            if lost:
                raise Revoked(lost)
            p.commit_transaction(self.timeout)                          # Step 7

    def _flush(self, p: Producer, what: str, keep: list[Batch]) -> None:
        """Wait until everything produced is acknowledged, raising a failed delivery as
        soon as it is reported (``_check_deliveries``), within ``timeout``. While records
        stay unacknowledged (``CHECK_AFTER``, then every ``CHECK_EVERY``), the batches'
        destination partitions are checked for fewer in-sync replicas than
        ``min.insync.replicas`` (``replica_watch``: ERROR and gauge).
        """
        start = time.monotonic()
        deadline = start + self.timeout
        next_check = start + CHECK_AFTER
        while True:
            left = p.flush(max(0.0, min(FLUSH_SLICE, deadline - time.monotonic())))
            self._check_deliveries(p)
            if not left:
                return
            if time.monotonic() >= next_check:
                self.replica_watch.check([b.tp for b in keep])
                next_check = time.monotonic() + CHECK_EVERY
            if time.monotonic() >= deadline:
                raise KafkaRetriableError(f"{left} {what} not acknowledged within "
                                          f"{self.timeout:.0f}s")

    def _produce(self, p: Producer, b: Batch, r: Rows,
                 ends: Callable[[int, DeliveryReport], None] | None) -> None:
        """Enqueue one chunk of ``b``; ``ends``: the offset map's listener (indexes of the
        batch). A record the client itself refuses (larger than its own
        ``message.max.bytes``) refuses the batch's partition like the broker's refusal.
        """
        try:
            if ends is None:
                p.produce_many(b.topic, b.partition, r.timestamps, r.keys, r.values,
                               r.headers, r.offsets)
            else:
                p.produce_many(b.topic, b.partition, r.timestamps, r.keys, r.values,
                               r.headers, r.offsets, on_ends=ends)
        except RecordRefused as e:
            client_max = DEFAULT_CLIENT_MAX if self.limits is None else self.limits.client_max
            raise Refused({b.tp: client_refused(r, e, client_max,
                                                f"{b.topic}[{b.partition}]")}) from e

    def _check_deliveries(self, p: Producer) -> None:
        """Raise the failed deliveries: ``Refused`` naming each partition whose record the
        destination refused for good (the others' failures are the abort's collateral),
        else the first failure.
        """
        failures = p.take_failures()
        if not failures:
            return
        reports: dict[TP, DeliveryReport] = {}
        for r in failures:
            if isinstance(r.error, RecordRefused):
                reports.setdefault((r.topic, r.partition), r)
        if reports:
            raise Refused({tp: cast(RecordRefused, r.error) for tp, r in reports.items()},
                          reports)
        first = failures[0].error
        assert first is not None
        raise type(first)(f"{self.transactional_id}: {len(failures)} record(s) failed: "
                          f"{first}")

    def _revoked(self, p: Producer, keep: list[Batch], r: Revoked) -> None:
        """A partition of the transaction was revoked before the commit: abort; its batch
        fails, the others go into the next transaction.
        """
        self._abort(p, r)
        self.metrics.transactions.labels(outcome="revoked").inc()
        for b in keep:
            if b.tp in r.lost:
                b.finish(PartitionRevoked(f"{b.topic}[{b.partition}]: revoked before "
                                          "its transaction committed"))
        with self._cond:
            self._pending.extendleft(reversed([b for b in keep if b.tp not in r.lost]))

    def _refused(self, p: Producer, keep: list[Batch], r: Refused) -> None:
        """A destination refused records of some partitions for good: abort; those batches
        fail with ``RecordRefused`` naming the record (their workers stop at it), the
        others go into the next transaction at once. A refusing partition with batches of
        several sources (fan-in) cannot tell whose record it was: its batches are set
        apart, one per transaction, until one commits, so only the refused one fails. A
        refusal of a topic no batch writes (the checkpoint or offset-map topic) fails the
        transaction as a whole (``_refused_whole``).
        """
        self._abort(p, r)
        self.metrics.transactions.labels(outcome="refused").inc()
        if set(r.refused) - {b.tp for b in keep}:
            self._refused_whole(keep, r)
            return
        shared = {tp for tp, n in Counter(b.tp for b in keep).items() if n > 1}
        again = []
        for b in keep:
            err = r.refused.get(b.tp)
            if err is None or b.tp in shared:
                again.append(b)
                continue
            if err.offset is None:
                limit = None if self.limits is None else self.limits.limit(b.topic)
                err = refused_record(b.rows, err, limit, f"{b.topic}[{b.partition}]",
                                     r.reports.get(b.tp))
            b.finish(err)
        with self._cond:
            self._apart |= shared & set(r.refused)
            self._pending.extendleft(reversed(again))

    def _refused_whole(self, keep: list[Batch], r: Refused) -> None:
        """The checkpoint or offset-map topic refused a record (its write not allowed, its
        ``max.message.bytes`` below a checkpoint): no batch can commit until that changes.
        ERROR, every batch fails (its worker restarts on its backoff), and the loop waits
        its own backoff before the next transaction: never a hot loop of aborts.
        """
        delay = self._backoff.next()
        self._paused_until = time.monotonic() + delay
        others = sorted(set(r.refused) - {b.tp for b in keep})
        log.error("transactions of %s: %s refused a record of this transaction for good "
                  "(%s); %d batch(es) failed, next transaction in %.1fs", self.transactional_id,
                  ", ".join(f"{t}[{p}]" for t, p in others), r, len(keep), delay)
        self._fail(keep, KafkaRetriableError(
            f"the transaction was refused by {', '.join(t for t, _ in others)}: {r}"))

    def _failed(self, p: Producer, keep: list[Batch], e: ReplicatorError) -> None:
        if isinstance(e, OffsetsHung):
            # A stale coordinator is an expected step of a rolling restart: WARNING.
            log.log(logging.WARNING if isinstance(e, StaleCoordinator) else logging.ERROR,
                    "%s; %d batch(es) are redone from their checkpoints", e, len(keep))
            self.metrics.transactions.labels(outcome="aborted").inc()
            self._drop_producer(e)
        elif isinstance(e, ProducerFenced):
            # A transaction that outlived transaction.timeout.ms, or another live process
            # with this transactional.id: the producer cannot abort; recreate it.
            self.metrics.transactions.labels(outcome="fenced").inc()
            self._drop_producer(e)
        elif isinstance(e, GenerationFenced):
            log.warning("transaction of %s refused by the placement group: aborted, never "
                        "committed: %s", ", ".join(f"{b.topic}[{b.partition}]" for b in keep),
                        e)
            self.metrics.transactions.labels(outcome="generation").inc()
            self._abort(p, e)
        else:
            self.metrics.transactions.labels(outcome="aborted").inc()
            self._abort(p, e)
            if isinstance(e, FatalError):
                self._drop_producer(e)
        self._fail(keep, e)

    def _send_offsets(self, p: Producer, keep: list[Batch]) -> None:
        """Step 5. The offsets are harmless: the placement group never reads its
        partitions (they stay paused), so offset 0 of the first batch's destination
        partition is committed; what matters is the generation check that comes with it
        (an empty offset list would skip the request altogether).
        """
        meta = self.group()
        generation, member = group_generation(meta)
        if generation < 0 or not member:
            raise GenerationFenced(f"this process is in no generation of the placement "
                                   f"group (generation {generation}, member {member!r})")
        first = keep[0]
        offsets = [TopicPartition(first.topic, first.partition, 0)]
        # Waited for with a deadline: the call may never return (ingress.offsets_deadline).
        send_offsets_within(p, offsets, meta, self.timeout, name=self.name,
                            transactional_id=self.transactional_id,
                            coordinator_answers=lambda: self.coordinator_answers(meta))

    def coordinator_answers(self, meta: GroupMetadata) -> bool:
        """Whether the placement group's coordinator answers a fresh client now (one per
        question: a long-lived client may keep the same stale coordinator).
        """
        return Admin(self.kafka_settings, timeout=5.0).group_coordinator(
            group_id_of(meta)) is not None

    def _abort(self, p: Producer, why: BaseException) -> None:
        try:
            p.abort_transaction(self.timeout)
        except ReplicatorError as e:
            log.warning("aborting the transaction of %s failed (%s) after: %s",
                        self.transactional_id, e, why)
            self._drop_producer(e)

    @staticmethod
    def _fail(batches: list[Batch], e: BaseException) -> None:
        for b in batches:
            b.finish(e)
