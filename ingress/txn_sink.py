"""Exactly-once: a worker's sink over the process's shared transaction loop
(``ingress.transactions``).
"""

from __future__ import annotations

from collections.abc import Callable

from ingress.rows import Rows
from ingress.sink import ReplaySink
from ingress.transactions import TransactionLoop
from ingress.txn_batches import Batch
from replicator.core.errors import KafkaFatalError
from replicator.core.wire import Checkpoint


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
               on_done: Callable[[], None], *, alone: bool = False) -> Batch:
        self._check()
        batch = Batch(self.topic, self.partition, self.epoch, rows, key, checkpoint,
                      on_done=on_done, alone=alone)
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
