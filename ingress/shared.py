"""The process's one producer, shared by every replay worker (ingress/README.md, "Producer
and fencing").

* ``Ownership``: the destination partitions this process owns now; the revoke callback
  takes them away, and waits for a commit that contains one of them.
* ``TransactionLoop`` (exactly-once): one transactional producer and one thread. Workers
  hand it a batch (records + checkpoint) and park, holding no thread or replay slot, until
  the batch's callback wakes them; it puts every batch waiting into one transaction,
  fenced by the placement group's generation (``_transact``).
* ``SharedAcks`` (at-least-once): one idempotent producer, acknowledgements and failures
  counted per sink (per produce call), never per destination partition: in fan-in several
  sinks write one partition.
* ``SharedTxnSink`` / ``SharedAckSink``: a worker's ``ReplaySink`` over them.

Threads and producers no longer grow with the partition count: one producer (its
librdkafka threads and connections) and, in exactly-once mode, one transaction thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from ingress.limits import DestinationLimits, refused_record
from ingress.metrics import IngressMetrics
from ingress.offset_map import OffsetMapWriter
from ingress.rows import Rows
from ingress.sink import PURGE_WAIT, ReplaySink, transaction_timeout_ms
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
    DeliveryReport,
    GroupMetadata,
    Producer,
    TopicPartition,
    group_generation,
)
from replicator.core.retry import Backoff
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint

log = logging.getLogger(__name__)

TP = tuple[str, int]
"""A destination partition: ``(topic, partition)``."""

CHUNK_POLL = 0.005
"""Seconds of serving callbacks between checks for a partition's previous chunk."""

WAIT_SLICE = 0.1
"""Seconds a worker waits for its transaction before checking that the loop still runs."""


class PartitionRevoked(RetriableError):
    """The batch's destination partition was revoked before its transaction committed:
    nothing of it was committed (the next owner replays it).
    """


def producer_fenced_backoff() -> Backoff:
    """Delays before a fenced (or failed) shared producer is recreated: a transaction that
    outlived its timeout recovers at once; another live process with the same
    ``transactional.id`` is not fenced back in a hot loop.
    """
    return Backoff(initial=timedelta(milliseconds=500), multiplier=2.0,
                   maximum=timedelta(seconds=30), jitter=0.2)


class Ownership:
    """The destination partitions this process owns, each with the number of its grant; the
    epochs of the workers started under each grant; and the commits in progress (counted
    per partition and per epoch: several transaction loops commit at once with
    ``ingress.producers > 1``).

    ``grant`` and ``revoke`` run in the placement consumer's rebalance callbacks. Every
    worker gets its own epoch (``epoch``), valid while it runs and its partition's grant
    lasts; its batches carry it. A batch of a former worker of the same partition (one that
    missed its revoke deadline, still waiting when the partition came back, or one stopped
    while the partition stayed owned: ``retire``) is never committed beside the new
    worker's. The transaction loop checks ownership when a batch joins a transaction and
    again, under the same lock, right before the commit (``commit_guard``). ``revoke`` and
    ``retire`` return only when no commit containing a batch they took away is running
    (or after their timeout), so once they return, no transaction of this process with
    such a batch commits any more.
    """

    def __init__(self) -> None:
        self._owned: dict[TP, int] = {}
        self._grants = 0
        self._epochs = 0
        self._workers: dict[int, tuple[TP, int]] = {}
        """A worker's epoch -> its partition and the grant it was started under."""
        self._committing: Counter[TP] = Counter()
        self._committing_epochs: Counter[int] = Counter()
        self._cond = threading.Condition()

    def grant(self, parts: Iterable[TP]) -> None:
        """The partitions were assigned to this process (a new grant each: epochs of
        workers started under an earlier one are no longer valid).
        """
        with self._cond:
            for tp in parts:
                self._grants += 1
                self._owned[tp] = self._grants

    def epoch(self, tp: TP) -> int | None:
        """A new epoch for a worker of ``tp`` starting now, valid until ``retire`` or the
        revoke of the current grant (``None`` while ``tp`` is not owned).
        """
        with self._cond:
            grant = self._owned.get(tp)
            if grant is None:
                return None
            self._epochs += 1
            self._workers[self._epochs] = (tp, grant)
            return self._epochs

    def _valid(self, tp: TP, epoch: int) -> bool:
        w = self._workers.get(epoch)
        return w is not None and w[0] == tp and self._owned.get(tp) == w[1]

    def owns(self, tp: TP, epoch: int) -> bool:
        """True while the worker of ``epoch`` may commit to ``tp``."""
        with self._cond:
            return self._valid(tp, epoch)

    def abandoned(self, tp: TP, epoch: int) -> bool:
        """True once ``epoch`` may no longer commit to ``tp`` and no commit containing its
        batch runs: a batch of that epoch can never commit any more.
        """
        with self._cond:
            return not self._valid(tp, epoch) and epoch not in self._committing_epochs

    def revoke(self, parts: Iterable[TP], timeout: float) -> bool:
        """Take ``parts`` away; wait (up to ``timeout`` seconds) for a commit that contains
        one of them. False if that commit was still running at the deadline (its
        checkpoint records are in the log already, so the next owner's checkpoint load
        waits for the transaction's end: ingress/README.md, point 3).
        """
        gone = frozenset(parts)
        deadline = time.monotonic() + timeout
        with self._cond:
            for tp in gone:
                self._owned.pop(tp, None)
            for e in [e for e, (tp, _) in self._workers.items() if tp in gone]:
                del self._workers[e]
            while any(self._committing[tp] for tp in gone):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def retire(self, epoch: int, timeout: float) -> bool:
        """The worker of ``epoch`` stopped (any reason, the partition may stay owned): its
        batches no longer commit; wait (up to ``timeout`` seconds) for a commit that
        contains one. False if that commit still ran at the deadline.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._workers.pop(epoch, None)
            while self._committing_epochs[epoch]:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    @contextmanager
    def commit_guard(self, batches: Iterable[tuple[TP, int]]) -> Iterator[frozenset[TP]]:
        """Yields the partitions of ``batches`` (partition, epoch) no longer owned under
        that epoch; when none, the body (the commit) runs with them marked as committing,
        and ``revoke`` / ``retire`` wait for it.
        """
        with self._cond:
            wanted = list(batches)
            lost = frozenset(tp for tp, e in wanted if not self._valid(tp, e))
            parts = Counter(tp for tp, _ in wanted)
            epochs = Counter(e for _, e in wanted)
            if not lost:
                self._committing.update(parts)
                self._committing_epochs.update(epochs)
        try:
            yield lost
        finally:
            if not lost:
                with self._cond:
                    self._committing.subtract(parts)
                    self._committing = +self._committing   # drop the zeros
                    self._committing_epochs.subtract(epochs)
                    self._committing_epochs = +self._committing_epochs
                    self._cond.notify_all()


@dataclass(eq=False)
class Batch:
    """One worker's batch: records of one destination partition and their checkpoint."""

    topic: str
    partition: int
    epoch: int
    rows: Rows | None
    key: str
    checkpoint: Checkpoint
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    on_done: Callable[[], None] | None = None
    """Called once the outcome is known (wakes the worker parked on it)."""

    @property
    def tp(self) -> TP:
        """The destination partition."""
        return (self.topic, self.partition)

    def finish(self, error: BaseException | None = None) -> None:
        """Hand the outcome to the waiting worker."""
        self.error = error
        self.done.set()
        if self.on_done is not None:
            self.on_done()


class _Revoked(Exception):
    """A partition of the transaction was revoked before the commit (internal)."""

    def __init__(self, lost: frozenset[TP]) -> None:
        super().__init__(", ".join(f"{t}[{p}]" for t, p in sorted(lost)))
        self.lost = lost


def _shifted(ends: Callable[[int, DeliveryReport], None], lo: int
             ) -> Callable[[int, DeliveryReport], None]:
    """``ends`` for a chunk starting at index ``lo`` of its batch."""
    return lambda i, report: ends(lo + i, report)


class _Refused(Exception):
    """The destination refused records of these partitions for good (internal)."""

    def __init__(self, refused: dict[TP, RecordRefused]) -> None:
        super().__init__("; ".join(str(e) for e in refused.values()))
        self.refused = refused


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
        name: the thread's name.
    """

    def __init__(self, kafka_settings: KafkaSettings, *, transactional_id: str,
                 checkpoint_topic: str, ownership: Ownership,
                 group: Callable[[], GroupMetadata], metrics: IngressMetrics,
                 timeout: float = 60.0,
                 make_producer: Callable[[], Producer] | None = None,
                 offset_map: OffsetMapWriter | None = None,
                 limits: DestinationLimits | None = None,
                 name: str = "transactions") -> None:
        self.name = name
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
        self._producer: Producer | None = None
        self._pending: deque[Batch] = deque()
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = producer_fenced_backoff()
        self._next_init = 0.0

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
            with self._cond:
                if not self._pending:
                    self._cond.wait(0.2)
                batches, self._pending = list(self._pending), deque()
            if not batches:
                continue
            try:
                self._transact(batches)
            except Exception as e:  # a bug or a client surprise must not end the loop
                log.exception("transaction of %d batch(es) failed unexpectedly; the "
                              "producer is recreated", len(batches))
                self._drop_producer(e)
                self._fail([b for b in batches if not b.done.is_set()],
                           KafkaFatalError(f"transaction failed unexpectedly: {e!r}"))

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
        except _Revoked as r:
            self._revoked(p, keep, r)
            return
        except _Refused as f:
            self._refused(p, keep, f)
            return
        except (RetriableError, FatalError) as e:
            self._failed(p, keep, e)
            return
        self._backoff.reset()
        self.metrics.transactions.labels(outcome="committed").inc()
        for b in keep:
            b.finish()

    def _steps(self, p: Producer, keep: list[Batch]) -> None:
        """One transaction for batches of several partitions.

        0. (``_transact``) A batch joins only if its partition is owned now.
        1. Begin the transaction.
        2. Produce the records of every batch to their destination partitions (a batch
           whose topic's ``max.message.bytes`` is below ``batch.size`` in chunks that fit
           it, one chunk per round: steps 2-3 repeat until every chunk is in).
        3. Flush: the records are in the destination logs before any checkpoint is sent
           (``ExactlyOnce``'s reason: a broker that shows aborted records must never hold a
           checkpoint without its records). A record a destination refuses for good fails
           only its partition's batch (``_Refused``): the others go into the next
           transaction at once.
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
           partition aborts the transaction (``_Revoked``).
        7. Commit, still marked "committing" under that lock: ``revoke`` waits for it.

        Raises:
            _Revoked / ProducerFenced / GenerationFenced / RetriableError / FatalError.
        """
        p.begin_transaction()                                           # Step 1
        # Steps 2-3, in rounds: each batch's first chunk (the whole batch unless its topic's
        # max.message.bytes is below batch.size) in the first round, then the next chunks
        # of the cut ones, each round flushed before the next one is enqueued.
        om = self.offset_map
        cut = [(b, self._chunks(b), None if om is None else om.on_ends(b))
               for b in keep if b.rows is not None]
        rounds = max((len(parts) for _, parts, _ in cut), default=1)
        for n in range(rounds):
            for b, parts, ends in cut:                                  # Step 2
                if n < len(parts):
                    lo, rows = parts[n]
                    self._produce(p, b, rows, None if ends is None else _shifted(ends, lo))
            left = p.flush(self.timeout)                                # Step 3
            if left:
                raise KafkaRetriableError(f"{left} record(s) not acknowledged within "
                                          f"{self.timeout:.0f}s")
            self._check_deliveries(p)
        for b in keep:                                                  # Step 4
            p.produce(self.checkpoint_topic, b.checkpoint.encode(), b.key.encode())
        if om is not None:
            om.produce(keep, p.produce)
        left = p.flush(self.timeout)
        if left:
            raise KafkaRetriableError(f"{left} checkpoint record(s) not acknowledged within "
                                      f"{self.timeout:.0f}s")
        self._check_deliveries(p)
        self._send_offsets(p, keep)                                     # Step 5
        with self.ownership.commit_guard((b.tp, b.epoch) for b in keep) as lost:  # Step 6
            if lost:
                raise _Revoked(lost)
            p.commit_transaction(self.timeout)                          # Step 7

    def _chunks(self, b: Batch) -> list[tuple[int, Rows]]:
        """``b``'s records as the chunks one produce request each may carry for its topic
        (``ingress.limits``), each with the index of its first record in the batch.
        """
        assert b.rows is not None
        if self.limits is None or self.limits.room(b.topic) is None:
            return [(0, b.rows)]
        out, lo = [], 0
        for part in self.limits.cut(b.topic, b.rows):
            out.append((lo, part))
            lo += len(part)
        return out

    @staticmethod
    def _produce(p: Producer, b: Batch, r: Rows,
                 ends: Callable[[int, DeliveryReport], None] | None) -> None:
        """Enqueue one chunk of ``b``; ``ends``: the offset map's listener (indexes of the
        batch).
        """
        if ends is None:
            p.produce_many(b.topic, b.partition, r.timestamps, r.keys, r.values, r.headers,
                           r.offsets)
        else:
            p.produce_many(b.topic, b.partition, r.timestamps, r.keys, r.values, r.headers,
                           r.offsets, on_ends=ends)

    def _check_deliveries(self, p: Producer) -> None:
        """Raise the failed deliveries: ``_Refused`` naming each partition whose record the
        destination refused for good (the others' failures are the abort's collateral),
        else the first failure.
        """
        failures = p.take_failures()
        if not failures:
            return
        refused = {(r.topic, r.partition): r.error for r in failures
                   if isinstance(r.error, RecordRefused)}
        if refused:
            raise _Refused(refused)
        first = failures[0].error
        assert first is not None
        raise type(first)(f"{self.transactional_id}: {len(failures)} record(s) failed: "
                          f"{first}")

    def _revoked(self, p: Producer, keep: list[Batch], r: _Revoked) -> None:
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

    def _refused(self, p: Producer, keep: list[Batch], r: _Refused) -> None:
        """A destination refused records of some partitions for good: abort; those batches
        fail with ``RecordRefused`` naming the record (their workers stop at it), the
        others go into the next transaction at once.
        """
        self._abort(p, r)
        self.metrics.transactions.labels(outcome="refused").inc()
        again = []
        for b in keep:
            err = r.refused.get(b.tp)
            if err is None:
                again.append(b)
                continue
            limit = None if self.limits is None else self.limits.limit(b.topic)
            b.finish(refused_record(b.rows, err, limit, f"{b.topic}[{b.partition}]"))
        with self._cond:
            self._pending.extendleft(reversed(again))

    def _failed(self, p: Producer, keep: list[Batch], e: ReplicatorError) -> None:
        if isinstance(e, ProducerFenced):
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
        p.send_offsets_to_transaction([TopicPartition(first.topic, first.partition, 0)],
                                      meta, self.timeout)

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


class SharedTxnSink(ReplaySink):
    """A worker's exactly-once sink: ``submit`` hands records + checkpoint to the
    process's ``TransactionLoop`` (``collect`` tells the outcome once its callback ran);
    ``commit`` does both and waits (checkpoints without records).
    """

    transactional = True

    def __init__(self, loop: TransactionLoop, *, topic: str, partition: int,
                 epoch: int) -> None:
        self.loop = loop
        self.topic = topic
        self.partition = partition
        self.epoch = epoch
        self._rows: Rows | None = None
        self._cp: tuple[str, Checkpoint] | None = None
        self._purged = False

    def _check(self) -> None:
        if self._purged:
            raise KafkaFatalError(f"{self.topic}[{self.partition}]: sink purged after the "
                                  "revoke deadline")

    def start(self) -> None:
        self._check()  # the shared producer was initialised when the process started

    def begin(self) -> None:
        self._rows, self._cp = None, None

    def produce(self, rows: Rows) -> None:
        self._check()
        self._rows = rows

    def produce_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        self._check()
        self._cp = (key, checkpoint)

    def commit(self) -> None:
        self._check()
        assert self._cp is not None, "produce_checkpoint first"
        key, cp = self._cp
        batch = Batch(self.topic, self.partition, self.epoch, self._rows, key, cp)
        self._rows, self._cp = None, None
        self.loop.submit(batch)
        self.loop.wait(batch)

    can_submit = True

    def submit(self, rows: Rows | None, key: str, checkpoint: Checkpoint,
               on_done: Callable[[], None]) -> Batch:
        self._check()
        batch = Batch(self.topic, self.partition, self.epoch, rows, key, checkpoint,
                      on_done=on_done)
        self.loop.submit(batch)
        return batch

    def collect(self, handle: object) -> bool:
        assert isinstance(handle, Batch)
        return self.loop.check(handle)

    def flush(self) -> None:
        """Nothing to do: the transaction flushes records before checkpoints."""

    def outstanding(self, timeout: float = 0.0) -> int:
        return 0

    def abort(self) -> None:
        self._rows, self._cp = None, None

    def close(self) -> None:
        self._rows, self._cp = None, None

    def purge(self) -> None:
        # The revoke callback took the partition from ``Ownership`` already: no
        # transaction with its batch commits any more. Later calls are refused.
        self._purged = True


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
                 limits: DestinationLimits | None = None) -> None:
        self.kafka_settings = kafka_settings
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

        Raises:
            KafkaFatalError: the sink was purged (its revoke deadline passed).
            KafkaRetriableError: the producer was purged for another sink, or a record of
                this sink failed; redo from the checkpoint (``RecordRefused``: the
                destination refused one for good).
        """
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
        """Enqueue ``rows`` as one call; returns the producer that took them."""
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
                limits = self.shared.limits
                raise refused_record(rows, first.error,
                                     None if limits is None else limits.limit(self.topic),
                                     self.where)
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
