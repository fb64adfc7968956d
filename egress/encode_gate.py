"""The upload pool's admission of encodes: before a worker encodes a segment's rows it
reserves their working memory from the segments' budget and waits until it is granted
(``egress.flow.EncodeAdmissions``, the rule); the reservation returns when the encode and
the upload of its bytes end.

A worker waits while holding its pool thread. That cannot deadlock: a granted encode
never waits for another pool task (its S3 calls and retries are its own), so each grant
ends, and the oldest request is granted at the latest when no reservation is left. The
poll thread counts the reservations with the segments' bytes (``egress.poll_loop``), so
consumption stays paused while they fill the budget.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from egress.flow import EncodeAdmissions
from replicator.core.errors import ReplicatorError

WAIT_SLICE = 0.5
"""Seconds between two looks at the cancel event of a waiting worker."""


class EncodeCancelled(ReplicatorError):
    """The partition was cancelled while its encode waited for memory."""


class EncodeGate:
    """Thread-safe ``EncodeAdmissions`` of one egress process.

    Args:
        budget: the segments' share of ``egress.max_buffered_bytes``
            (``egress.flow.segment_budget``).
    """

    def __init__(self, budget: int) -> None:
        self._state = EncodeAdmissions(budget)
        self._cond = threading.Condition()

    @property
    def reserved(self) -> int:
        """Bytes reserved by running encodes."""
        return self._state.reserved

    @property
    def peak(self) -> int:
        """The most segments and reservations held together (a high-water mark)."""
        return self._state.peak

    @property
    def waiting(self) -> int:
        """Encodes waiting for memory."""
        return self._state.waiting

    def set_held(self, held: int) -> None:
        """What segments hold now (poll thread, at each tick)."""
        with self._cond:
            self._state.set_held(held)
            self._cond.notify_all()

    @contextmanager
    def reserve(self, size: int, cancel: threading.Event) -> Iterator[None]:
        """Hold ``size`` bytes of the budget for the block; waits until granted.

        Raises:
            EncodeCancelled: ``cancel`` was set while waiting (nothing stays reserved).
        """
        key = object()
        with self._cond:
            granted = self._state.request(key, size)
            while not granted:
                if cancel.is_set():
                    self._state.release(key)
                    self._cond.notify_all()
                    raise EncodeCancelled("cancelled while waiting for memory to encode")
                self._cond.wait(WAIT_SLICE)
                granted = key in self._state.granted
        try:
            yield
        finally:
            with self._cond:
                self._state.release(key)
                self._cond.notify_all()
