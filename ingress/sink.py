"""Where a replay worker writes: the destination partition and the checkpoint topic.

``ReplaySink`` is the seam between the worker's durability method and Kafka. The Kafka
implementation wraps one producer per worker: transactional in exactly-once mode
(``transactional.id`` per source partition, so a new owner fences the old one),
idempotent in at-least-once mode. ``MemorySink`` is its in-memory twin for unit tests.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ingress.checkpoints import MemoryCheckpointStore
from ingress.rows import Header, Rows
from replicator.core.errors import (
    KafkaFatalError,
    KafkaRetriableError,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
    RetriableError,
    TransactionAbortable,
)
from replicator.core.kafka import Producer
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint

log = logging.getLogger(__name__)

PURGE_WAIT = 10.0
"""Seconds a purged sink waits for requests already sent (acknowledged or failed) before it
stops waiting (``ReplaySink.purge``)."""


class Interrupted(RetriableError):
    """A produce call gave up waiting (for the throttle) because its worker is stopping:
    nothing of the call was enqueued.
    """


def transaction_timeout_ms(timeout: float) -> int:
    """``transaction.timeout.ms`` for a sink whose flush and commit may each take
    ``timeout`` seconds: both, plus 30 s for producing the batch and the checkpoint
    (150 s for the default 60 s; the broker allows up to ``transaction.max.timeout.ms``,
    15 min by default).
    """
    return int((2 * timeout + 30) * 1000)


class ReplaySink(ABC):
    """Produces records to one destination partition and checkpoints to the checkpoint topic.

    Every method may raise ``ProducerFenced`` (another owner took over: stop),
    ``KafkaRetriableError`` (abort and redo from the last checkpoint) or
    ``KafkaFatalError``.
    """

    transactional: bool

    @abstractmethod
    def start(self) -> None:
        """Connect; in transactional mode ``init_transactions`` (fences older owners)."""

    @abstractmethod
    def begin(self) -> None:
        """Begin a transaction (transactional mode only)."""

    @abstractmethod
    def produce(self, rows: Rows) -> None:
        """Enqueue records for the destination partition (original key/value/headers/ts)."""

    @abstractmethod
    def produce_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        """Enqueue a checkpoint record."""

    @abstractmethod
    def commit(self) -> None:
        """Commit the transaction: records and checkpoint become visible together."""

    @abstractmethod
    def flush(self) -> None:
        """Wait until everything enqueued is acknowledged.

        Raises:
            KafkaRetriableError: a record was not delivered (or not within the timeout).
        """

    @abstractmethod
    def outstanding(self, timeout: float = 0.0) -> int:
        """Records and checkpoints enqueued and not yet acknowledged.

        Serves acknowledgements for up to ``timeout`` seconds first (returning early once
        one arrives). Records of the destination partition are acknowledged in the order
        they were produced (idempotent producer).

        Raises:
            KafkaRetriableError: a record was not delivered.
        """

    @abstractmethod
    def abort(self) -> None:
        """Abort the open transaction, if any; never raises for a fenced producer."""

    @abstractmethod
    def close(self) -> None:
        """Release the producer; idempotent."""

    @abstractmethod
    def purge(self) -> None:
        """For a worker that missed its revoke deadline, from another thread: drop every
        record not yet sent, wait for the requests already sent (bounded), and close, so
        nothing of this sink reaches the broker once the partition is released; every
        later call raises ``KafkaFatalError``.
        """

    def interrupt(self) -> None:  # noqa: B027 - nothing waits in most sinks
        """The worker is stopping (any thread): a produce call waiting for the throttle
        gives up (``Interrupted``) instead of waiting out its debt.
        """

    can_submit: bool = False
    """True if ``submit``/``collect`` hand a batch over without waiting for its commit
    (the process's shared transaction loop, ``ingress.transactions``)."""

    def submit(self, rows: Rows | None, key: str, checkpoint: Checkpoint,
               on_done: Callable[[], None], *, alone: bool = False) -> object:
        """Exactly-once without waiting: hand ``rows`` and their checkpoint to a
        transaction; ``on_done`` is called (any thread) once it committed or failed. The
        handle returned is given to ``collect``. Only when ``can_submit``. ``alone``: a
        record its destination may refuse, committed in a transaction of its own.
        """
        raise NotImplementedError("this sink commits one batch at a time (commit)")

    def collect(self, handle: object) -> bool:
        """The outcome of a ``submit``: True once committed, False while it waits.

        Raises:
            ProducerFenced / RetriableError / FatalError: it was not committed.
        """
        raise NotImplementedError("this sink commits one batch at a time (commit)")


class KafkaSink(ReplaySink):
    """A ``ReplaySink`` over one ``Producer`` of the Kafka seam."""

    def __init__(self, kafka_settings: KafkaSettings, *, topic: str, partition: int,
                 checkpoint_topic: str, transactional_id: str | None,
                 timeout: float = 60.0) -> None:
        self.kafka_settings = kafka_settings
        self.topic = topic
        self.partition = partition
        self.checkpoint_topic = checkpoint_topic
        self.transactional_id = transactional_id
        self.transactional = transactional_id is not None
        self.timeout = timeout
        self._producer: Producer | None = None
        self._purged = False
        self._in_txn = False
        self.where = f"{topic}[{partition}]"

    @property
    def producer(self) -> Producer:
        """The producer (after ``start``).

        Raises:
            KafkaFatalError: the sink was purged.
        """
        if self._purged:
            raise KafkaFatalError(f"{self.where}: producer purged after the revoke deadline")
        assert self._producer is not None, "start() first"
        return self._producer

    def purge(self) -> None:
        self._purged = True
        p, self._producer = self._producer, None
        if p is None:
            return
        p.purge()
        left = p.flush(min(self.timeout, PURGE_WAIT))
        if left:
            p.purge(in_flight=True)
            log.error("%s: %d record(s) already sent were not acknowledged within %.0fs of "
                      "the purge; they may still reach the partition beside its new owner",
                      self.where, left, min(self.timeout, PURGE_WAIT))

    def start(self) -> None:
        if self._purged:
            raise KafkaFatalError(f"{self.where}: producer purged after the revoke deadline")
        overrides = {}
        if self.transactional and "transaction.timeout.ms" not in self.kafka_settings.config:
            # Above the worst flush + commit (each may take ``timeout``): a transaction
            # that is merely slow is not aborted by the coordinator (librdkafka's default
            # is 60 s, below one flush + one commit).
            overrides["transaction.timeout.ms"] = transaction_timeout_ms(self.timeout)
        self._producer = Producer(self.kafka_settings, transactional_id=self.transactional_id,
                                  name=self.where, overrides=overrides)
        if self.transactional:
            self._producer.init_transactions(self.timeout)

    def begin(self) -> None:
        self.producer.begin_transaction()
        self._in_txn = True

    def produce(self, rows: Rows) -> None:
        p = self.producer
        p.produce_many(self.topic, self.partition, rows.timestamps, rows.keys, rows.values,
                       rows.headers, rows.offsets)
        p.check_deliveries(self.where)

    def produce_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        self.producer.produce(self.checkpoint_topic, checkpoint.encode(), key.encode())

    def commit(self) -> None:
        try:
            self.producer.commit_transaction(self.timeout)
            self._in_txn = False
        except ProducerFenced:
            self._in_txn = False  # a fenced producer cannot abort; the new owner did
            raise
        except TransactionAbortable:
            self.abort()
            raise
        self.producer.check_deliveries(self.where)

    def outstanding(self, timeout: float = 0.0) -> int:
        p = self.producer
        n = p.outstanding(timeout)
        p.check_deliveries(self.where)
        return n

    def flush(self) -> None:
        left = self.producer.flush(self.timeout)
        if left:
            raise KafkaRetriableError(f"{self.where}: {left} record(s) not acknowledged within "
                                      f"{self.timeout:.0f}s")
        self.producer.check_deliveries(self.where)

    def abort(self) -> None:
        if not (self.transactional and self._in_txn and self._producer is not None):
            return
        try:
            self._producer.abort_transaction(self.timeout)
        except ReplicatorError as e:
            # A fenced or fatally failed producer cannot abort; the broker aborts its
            # transaction when the next owner initialises (or on transaction timeout).
            log.warning("abort transaction on %s failed: %s", self.where, e)
        finally:
            self._in_txn = False

    def close(self) -> None:
        p, self._producer = self._producer, None
        if p is None:
            return
        if not self.transactional:
            p.flush(min(self.timeout, 10.0))


@dataclass
class MemorySink(ReplaySink):
    """Records what would be produced; commits feed a ``MemoryCheckpointStore``.

    ``fail_on_commit`` makes the next N commits (or acknowledgements) raise a retriable
    error, to exercise the redo path; ``refuse`` names records the destination refuses;
    ``fence_on_commit`` makes the next N commits raise ``ProducerFenced`` (what a
    transaction that outlived its timeout gets). Without transactions, records wait in
    ``in_flight`` until acknowledged: ``ack_per_poll`` records per ``outstanding`` call (all
    by default), everything on ``flush``. A checkpoint produced while a record at or below
    its offset is still in flight is recorded in ``early_checkpoints`` (the durability
    method must never do that).
    """

    checkpoints: MemoryCheckpointStore
    transactional: bool = True
    committed: list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]] = \
        field(default_factory=list)
    fail_on_commit: int = 0
    fence_on_commit: int = 0
    ack_per_poll: int | None = None
    in_flight: list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]] = \
        field(default_factory=list)
    early_checkpoints: list[Checkpoint] = field(default_factory=list)
    refuse: set[int] = field(default_factory=set)
    """Source offsets the destination refuses for good (``RecordRefused`` when produced)."""
    started: int = 0
    aborted: int = 0
    purged: bool = False
    _pending: list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]] = \
        field(default_factory=list)
    _pending_cp: list[tuple[str, Checkpoint]] = field(default_factory=list)

    def start(self) -> None:
        self.started += 1

    def begin(self) -> None:
        self._pending.clear()
        self._pending_cp.clear()

    def produce(self, rows: Rows) -> None:
        self._check_purged()
        refused = sorted(self.refuse.intersection(rows.offsets))
        if refused:
            raise RecordRefused(f"memory sink: record {refused[0]} refused", offset=refused[0],
                                size=1, setting="max.message.bytes=1", reason="too large")
        if self.transactional:
            self._pending.extend(rows.records())
        else:
            self.in_flight.extend(rows.records())

    def produce_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        self._check_purged()
        if self.transactional:
            self._pending_cp.append((key, checkpoint))
            return
        if any(r[0] <= checkpoint.offset for r in self.in_flight):
            self.early_checkpoints.append(checkpoint)
        self.checkpoints.append(key, checkpoint.encode())

    def _ack(self, n: int | None) -> None:
        n = len(self.in_flight) if n is None else n
        self.committed.extend(self.in_flight[:n])
        del self.in_flight[:n]

    def outstanding(self, timeout: float = 0.0) -> int:
        if self.in_flight:
            self._fail_in_flight()
        self._ack(self.ack_per_poll)
        return len(self.in_flight)

    def _fail_in_flight(self) -> None:
        if self.fail_on_commit > 0:
            self.in_flight.clear()  # not delivered
            self._fail()

    def _fail(self) -> None:
        if self.fail_on_commit > 0:
            self.fail_on_commit -= 1
            raise KafkaRetriableError("injected commit failure")

    def commit(self) -> None:
        if self.fence_on_commit > 0:
            self.fence_on_commit -= 1
            self.begin()       # the coordinator aborted the transaction
            raise ProducerFenced("injected: fenced (transaction timed out)")
        self._fail()
        self.committed.extend(self._pending)
        for k, cp in self._pending_cp:
            self.checkpoints.append(k, cp.encode())
        self.begin()

    def flush(self) -> None:
        if self.transactional:
            return  # records wait for the commit
        self._fail_in_flight()
        self._ack(None)

    def abort(self) -> None:
        if not self.transactional:
            return  # nothing to abort: like the Kafka sink's idempotent producer
        self.aborted += 1
        self.begin()

    def close(self) -> None:
        if not self.transactional and not self.purged:
            self._ack(None)  # the Kafka sink flushes on close

    def purge(self) -> None:
        self.purged = True
        self.in_flight.clear()
        self._pending.clear()
        self._pending_cp.clear()

    def _check_purged(self) -> None:
        if self.purged:
            raise KafkaFatalError("memory sink purged after the revoke deadline")
