"""Where a replay worker writes: the destination partition and the checkpoint topic.

``ReplaySink`` is the seam between the worker's durability method and Kafka. The Kafka
implementation wraps one producer per worker: transactional in exactly-once mode
(``transactional.id`` per source partition, so a new owner fences the old one),
idempotent in at-least-once mode. ``MemorySink`` is its in-memory twin for unit tests.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ingress.checkpoints import Checkpoint, MemoryCheckpointStore
from replicator.core import kafka
from replicator.core.errors import KafkaFatalError, KafkaRetriableError, ProducerFenced
from replicator.core.settings import KafkaSettings

log = logging.getLogger(__name__)

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Rows:
    """Records to produce, column by column (no per-record objects on the hot path).

    ``timestamps`` are milliseconds (``0`` lets the producer stamp the current time, for
    sources without timestamps); ``headers`` entries are ``None`` for records without.
    """

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[Header] | None]

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def last_offset(self) -> int:
        """Source offset of the last record."""
        return self.offsets[-1]

    def records(self) -> list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]]:
        """``(offset, timestamp, key, value, headers)`` tuples (tests, fakes)."""
        return list(zip(self.offsets, self.timestamps, self.keys, self.values, self.headers,
                        strict=True))


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


class KafkaSink(ReplaySink):
    """A ``ReplaySink`` over one confluent-kafka producer."""

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
        self._producer: Any = None
        self._errors: list[Any] = []
        self._lock = threading.Lock()
        self._in_txn = False
        self.where = f"{topic}[{partition}]"

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            with self._lock:
                self._errors.append(err)

    def start(self) -> None:
        overrides: dict[str, Any] = {"on_delivery": self._on_delivery,
                                     "delivery.report.only.error": True}
        self._producer = kafka.make_producer(self.kafka_settings,
                                             transactional_id=self.transactional_id,
                                             overrides=overrides)
        if self.transactional:
            try:
                self._producer.init_transactions(self.timeout)
            except kafka.KafkaException as e:
                raise kafka.translate(e, f"init transactions of {self.transactional_id}") from e

    def begin(self) -> None:
        try:
            self._producer.begin_transaction()
            self._in_txn = True
        except kafka.KafkaException as e:
            raise kafka.translate(e, f"begin transaction on {self.where}") from e

    def _produce(self, topic: str, partition: int | None, key: bytes | None,
                 value: bytes | None, headers: list[Header] | None, ts: int) -> None:
        p = self._producer
        while True:
            try:
                if partition is None:
                    p.produce(topic, value, key, timestamp=ts, headers=headers)
                else:
                    p.produce(topic, value, key, partition, timestamp=ts, headers=headers)
                return
            except BufferError:
                # The local queue is full: serve delivery reports until there is room.
                p.poll(0.05)
            except kafka.KafkaException as e:
                raise kafka.translate(e, f"produce to {topic}") from e

    def produce(self, rows: Rows) -> None:
        p = self._producer
        produce = p.produce
        topic, part = self.topic, self.partition
        for i, (ts, k, v, h) in enumerate(zip(rows.timestamps, rows.keys, rows.values,
                                              rows.headers, strict=True)):
            try:
                produce(topic, v, k, part, timestamp=ts, headers=h)
            except BufferError:
                p.poll(0.05)
                self._produce(topic, part, k, v, h, ts)
            except kafka.KafkaException as e:
                raise kafka.translate(e, f"produce to {self.where}@{rows.offsets[i]}") from e
        p.poll(0)
        self._raise_delivery_errors()

    def produce_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        self._produce(self.checkpoint_topic, None, key.encode(), checkpoint.encode(), None, 0)

    def commit(self) -> None:
        try:
            self._producer.commit_transaction(self.timeout)
            self._in_txn = False
        except kafka.KafkaException as e:
            err = kafka.translate(e, f"commit transaction on {self.where}")
            if isinstance(err, ProducerFenced):
                self._in_txn = False  # a fenced producer cannot abort; the new owner did
            elif kafka.is_transaction_abortable(e):
                self.abort()
                raise KafkaRetriableError(str(err)) from e
            raise err from e
        self._raise_delivery_errors()

    def outstanding(self, timeout: float = 0.0) -> int:
        p = self._producer
        p.poll(timeout)
        self._raise_delivery_errors()
        return len(p)

    def flush(self) -> None:
        left = self._producer.flush(self.timeout)
        if left:
            raise KafkaRetriableError(f"{self.where}: {left} record(s) not acknowledged within "
                                      f"{self.timeout:.0f}s")
        self._raise_delivery_errors()

    def _raise_delivery_errors(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        if not errors:
            return
        first = errors[0]
        msg = f"{self.where}: {len(errors)} record(s) failed: {first.str()}"
        if first.code() in (kafka.ERR_FENCED, kafka.ERR_PRODUCER_FENCED):
            raise ProducerFenced(msg)
        if first.fatal():
            raise KafkaFatalError(msg)
        raise KafkaRetriableError(msg)

    def abort(self) -> None:
        if not (self.transactional and self._in_txn and self._producer is not None):
            return
        try:
            self._producer.abort_transaction(self.timeout)
        except kafka.KafkaException as e:
            # A fenced or fatally failed producer cannot abort; the broker aborts its
            # transaction when the next owner initialises (or on transaction timeout).
            log.warning("abort transaction on %s failed: %s", self.where,
                        kafka.translate(e, "abort"))
        finally:
            self._in_txn = False
            with self._lock:
                self._errors.clear()

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
    error, to exercise the redo path. Without transactions, records wait in ``in_flight``
    until acknowledged: ``ack_per_poll`` records per ``outstanding`` call (all by default),
    everything on ``flush``. A checkpoint produced while a record at or below its offset
    is still in flight is recorded in ``early_checkpoints`` (the durability method must
    never do that).
    """

    checkpoints: MemoryCheckpointStore
    transactional: bool = True
    committed: list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]] = \
        field(default_factory=list)
    fail_on_commit: int = 0
    ack_per_poll: int | None = None
    in_flight: list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]] = \
        field(default_factory=list)
    early_checkpoints: list[Checkpoint] = field(default_factory=list)
    started: int = 0
    aborted: int = 0
    _pending: list[tuple[int, int, bytes | None, bytes | None, list[Header] | None]] = \
        field(default_factory=list)
    _pending_cp: list[tuple[str, Checkpoint]] = field(default_factory=list)

    def start(self) -> None:
        self.started += 1

    def begin(self) -> None:
        self._pending.clear()
        self._pending_cp.clear()

    def produce(self, rows: Rows) -> None:
        if self.transactional:
            self._pending.extend(rows.records())
        else:
            self.in_flight.extend(rows.records())

    def produce_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
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
        if not self.transactional:
            self._ack(None)  # the Kafka sink flushes on close
