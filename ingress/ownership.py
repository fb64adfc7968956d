"""The destination partitions this process owns (ingress/README.md, "Producer and
fencing"): ``Ownership`` gives each worker an epoch under its partition's grant, and the
revoke callback (and every other stop) takes them away, waiting for a commit that contains
one of them. The transaction loop (``ingress.transactions``) checks it before and right
before each commit.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

TP = tuple[str, int]
"""A destination partition: ``(topic, partition)``."""


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
