"""What a worker hands the shared transaction loop (``ingress.transactions``): a ``Batch``
of one destination partition and its checkpoint, and how a batch can fail.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ingress.ownership import TP
from ingress.rows import Rows
from replicator.core.errors import RecordRefused, RetriableError
from replicator.core.kafka import DeliveryReport
from replicator.core.wire import Checkpoint


class PartitionRevoked(RetriableError):
    """The batch's destination partition was revoked before its transaction committed:
    nothing of it was committed (the next owner replays it).
    """


@dataclass(eq=False)
class Batch:
    """One worker's batch: records of one destination partition and their checkpoint.

    ``alone``: the batch is one record that its destination may refuse (``ingress.limits``,
    ``isolate``): it goes into a transaction of its own, so a refusal aborts nothing of
    any other partition.
    """

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
    alone: bool = False

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


class Revoked(Exception):
    """A partition of the transaction was revoked before the commit (loop-internal)."""

    def __init__(self, lost: frozenset[TP]) -> None:
        super().__init__(", ".join(f"{t}[{p}]" for t, p in sorted(lost)))
        self.lost = lost


class Refused(Exception):
    """The destination refused records of these partitions for good (loop-internal);
    ``reports``: the first failed delivery of each, naming its record.
    """

    def __init__(self, refused: dict[TP, RecordRefused],
                 reports: dict[TP, DeliveryReport] | None = None) -> None:
        super().__init__("; ".join(str(e) for e in refused.values()))
        self.refused = refused
        self.reports = reports or {}


def shifted(ends: Callable[[int, DeliveryReport], None], lo: int
            ) -> Callable[[int, DeliveryReport], None]:
    """``ends`` for a chunk starting at index ``lo`` of its batch."""
    return lambda i, report: ends(lo + i, report)
