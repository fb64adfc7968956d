"""The two ways a replay makes records and their checkpoint durable (``ingress.delivery``).

The controller chooses one for the process from ``ingress.delivery`` (``delivery_for``);
each worker session builds one over its sink. ``deliver`` runs the numbered steps of its
class and nothing else in ingress produces checkpoints. The worker then moves its position
(``Progress.deliver``); a failure raises, and the session restarts from the last
committed checkpoint.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from ingress.rows import Rows
from ingress.sink import ReplaySink
from replicator.core.errors import FatalError, KafkaRetriableError, ProducerFenced, RetriableError
from replicator.core.wire import Checkpoint

PIPELINE_DEPTH = 2
"""At-least-once: batches produced and not yet acknowledged while the next one is produced
(memory: about ``(PIPELINE_DEPTH + 1) * batch_size`` records in the producer)."""
ACK_POLL = 0.005
"""Seconds one wait for acknowledgements lasts before the worker counts again (successful
deliveries raise no event that would end the wait early: keep it short)."""
ACK_TIMEOUT = 120.0
"""Seconds a batch may stay unacknowledged (librdkafka's delivery timeout is 300 s, but a
worker this far behind restarts from its checkpoint instead)."""


class Delivery(ABC):
    """Makes a batch and its checkpoint durable in the destination cluster.

    Args:
        sink: the session's producer seam (destination partition + checkpoint topic).
        key: the checkpoint key of the source partition.
        where: names the partition in errors.
        on_checkpointed: called with each checkpoint once it is durable (sent after its
            records were acknowledged, or committed with them).
        on_aborted: called when a transaction is aborted (a metric).
    """

    def __init__(self, sink: ReplaySink, key: str, where: str, *,
                 on_checkpointed: Callable[[Checkpoint], None],
                 on_aborted: Callable[[], None]) -> None:
        self.sink = sink
        self.key = key
        self.where = where
        self.on_checkpointed = on_checkpointed
        self.on_aborted = on_aborted

    @abstractmethod
    def deliver(self, rows: Rows | None, cp: Checkpoint, *, alone: bool = False) -> None:
        """Produce ``rows`` (if any) and, once they are durable, the checkpoint ``cp``.

        ``alone``: ``rows`` is one record its destination may refuse (``ingress.limits``,
        ``isolate``): it is produced only once everything before it is durable, and
        returns only once it is durable itself, so a refusal raises with nothing after it
        produced.

        Raises:
            ProducerFenced: another owner took the partition over.
            RetriableError / FatalError: redo from the last committed checkpoint.
        """

    def settle(self) -> None:  # noqa: B027 - nothing to do unless pipelined
        """Make every checkpoint of delivered batches durable (before waiting or stopping)."""

    @property
    def can_submit(self) -> bool:
        """True if ``submit``/``collect`` are available: a batch is handed over and its
        worker waits for the outcome without holding a thread (``ExactlyOnce`` over the
        process's shared transaction loop).
        """
        return False

    def submit(self, rows: Rows | None, cp: Checkpoint, on_done: Callable[[], None], *,
               alone: bool = False) -> object:
        """``deliver`` without waiting: the steps run in a transaction of the process's
        transaction loop with other partitions' batches (``alone``: in one of its own);
        ``on_done`` is called once it committed or failed, and ``collect`` tells which.
        """
        raise NotImplementedError

    def collect(self, handle: object, cp: Checkpoint) -> bool:
        """True once the batch of ``submit`` (checkpoint ``cp``) is committed, False while
        it waits; raises as ``deliver`` does.
        """
        raise NotImplementedError


class ExactlyOnce(Delivery):
    """One Kafka transaction per batch, records and checkpoint together.

    1. Begin a transaction.
    2. Produce the records to the destination partition.
    3. Flush: the records are in the destination log before the checkpoint is sent, so no
       broker ever holds this checkpoint without its records (a broker that shows aborted
       records to read_committed readers, like the embedded Tansu, would otherwise let a
       successor skip records that were never written). Kept on Apache Kafka, which hides
       aborted records: commit flushes anyway, so this only moves that wait before the
       checkpoint's send.
    4. Produce the checkpoint record to the checkpoint topic in the same transaction, and
       commit: records and checkpoint become visible together or not at all.

    A failure before step 4 completes aborts the transaction and raises. The worker fences
    older owners before it reads its checkpoint (``ReplaySink.start``), so an older owner's
    open transaction is already aborted then.

    Over the process's shared transaction loop (``ingress.transactions``) a worker uses
    ``submit``/``collect`` instead: the loop runs these steps for the batches of many
    partitions in one transaction, and the worker holds no thread while it waits.
    """

    @contextmanager
    def _aborting(self) -> Iterator[None]:
        """A failure aborts the transaction and raises; a fenced producer raises as is
        (a newer owner holds the partition: there is nothing of ours to abort).
        """
        try:
            yield
        except ProducerFenced:
            raise
        except (RetriableError, FatalError):
            self.on_aborted()
            self.sink.abort()
            raise

    def deliver(self, rows: Rows | None, cp: Checkpoint, *, alone: bool = False) -> None:
        # One batch per transaction: ``alone`` changes nothing here.
        sink = self.sink
        with self._aborting():
            sink.begin()                            # Step 1
            if rows is not None:
                sink.produce(rows)                  # Step 2
                sink.flush()                        # Step 3
            sink.produce_checkpoint(self.key, cp)   # Step 4
            sink.commit()
        self.on_checkpointed(cp)

    @property
    def can_submit(self) -> bool:
        return self.sink.can_submit

    def submit(self, rows: Rows | None, cp: Checkpoint, on_done: Callable[[], None], *,
               alone: bool = False) -> object:
        with self._aborting():                      # Steps 1-4, in the loop
            return self.sink.submit(rows, self.key, cp, on_done, alone=alone)

    def collect(self, handle: object, cp: Checkpoint) -> bool:
        with self._aborting():
            done = self.sink.collect(handle)
        if done:
            self.on_checkpointed(cp)
        return done


class AtLeastOnce(Delivery):
    """An idempotent producer, pipelined: up to ``PIPELINE_DEPTH`` batches are
    unacknowledged while the next one is produced.

    1. No transaction.
    2. Produce the records.
    3. Once every record of the batch is acknowledged (acks=all; ``_settle``),
    4. produce its checkpoint. A checkpoint is never sent before its records are
       acknowledged; it is flushed itself before the worker waits or stops (``settle``).

    A crash therefore repeats at most ``PIPELINE_DEPTH + 2`` batches: the pipelined ones, the
    one being produced, and one whose checkpoint was in flight. A record delivered
    ``alone`` (one its destination may refuse) waits for every batch before it and for
    its own acknowledgement: when it is refused, nothing after it was produced.
    """

    def __init__(self, sink: ReplaySink, key: str, where: str, *,
                 on_checkpointed: Callable[[Checkpoint], None],
                 on_aborted: Callable[[], None]) -> None:
        super().__init__(sink, key, where, on_checkpointed=on_checkpointed,
                         on_aborted=on_aborted)
        self._sent = 0
        self._unsettled: deque[tuple[int, Checkpoint]] = deque()

    def deliver(self, rows: Rows | None, cp: Checkpoint, *, alone: bool = False) -> None:
        if alone:
            self._settle(depth=0)                   # everything before it durable first
        if rows is not None:
            self.sink.produce(rows)                 # Step 2
            self._sent += len(rows)
        self._unsettled.append((self._sent, cp))
        self._settle(depth=0 if alone else PIPELINE_DEPTH)   # Steps 3-4

    def settle(self) -> None:
        self._settle(depth=0)
        if self.sink.outstanding():  # the checkpoints just sent (the records are acknowledged)
            self.sink.flush()

    def _settle(self, *, depth: int) -> None:
        """Steps 3-4: checkpoint the newest batch whose records are all acknowledged; wait
        until at most ``depth`` batches are not.

        The sink's outstanding count covers records and checkpoints, and one partition's
        records are acknowledged in the order they were produced: so every record but the
        last ``outstanding`` ones is acknowledged (a bound that can only understate).

        Raises:
            KafkaRetriableError: a record failed, or was not acknowledged within
                ``ACK_TIMEOUT`` seconds.
        """
        sink = self.sink
        deadline = time.monotonic() + ACK_TIMEOUT
        while True:
            wait = 0.0 if len(self._unsettled) <= depth else ACK_POLL
            acknowledged = self._sent - sink.outstanding(wait)
            ready: Checkpoint | None = None
            while self._unsettled and self._unsettled[0][0] <= acknowledged:
                ready = self._unsettled.popleft()[1]
            if ready is not None:
                sink.produce_checkpoint(self.key, ready)
                self.on_checkpointed(ready)
            if len(self._unsettled) <= depth:
                return
            if time.monotonic() > deadline:
                raise KafkaRetriableError(f"{self.where}: records up to offset "
                                          f"{self._unsettled[0][1].offset} not acknowledged "
                                          f"within {ACK_TIMEOUT:.0f}s")


DeliveryMode = Literal["exactly-once", "at-least-once"]


def delivery_for(mode: DeliveryMode) -> type[Delivery]:
    """The protocol of an ``ingress.delivery`` setting."""
    return ExactlyOnce if mode == "exactly-once" else AtLeastOnce
