"""``[ingress] max_bytes_per_second``: what one process produces into the destination.

One ``ProduceThrottle`` per process, shared by its producers (the token bucket of
``replicator.core.throttle``, one second of burst, debt carried over). Bytes are the
records' key + value + headers, as for the egress limit; checkpoints and offset-map
entries are not counted (a few hundred bytes per batch).

* Exactly-once (``TransactionLoop``): before a transaction the loop waits out the debt
  (``hold``), then takes from its queue only the batches the tokens cover, at least one
  (``drain``): a transaction never stays open while throttled, so the limit never pushes
  one past ``transaction.timeout.ms``, and one carries about a second of bytes at most.
* At-least-once (``SharedAcks``): each produce call waits until the debt of the calls
  before it is paid, then goes (``admit``): FIFO across the workers' threads.

Waiting batches hold their bytes of ``max_bytes_in_flight`` (exactly-once) or their
worker's thread (at-least-once), so memory stays bounded by the same budgets.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ingress.rows import Rows
from replicator.core.throttle import TokenBucket

WAIT_SLICE = 0.5
"""Longest single wait, in seconds: a stop or a purge is noticed within it."""


class _HasRows(Protocol):
    @property
    def rows(self) -> Rows | None: ...


B = TypeVar("B", bound=_HasRows)


def rows_bytes(rows: Rows | None) -> int:
    """Bytes of ``rows`` as the limit counts them: key + value + header names and values."""
    if rows is None:
        return 0
    n = sum(len(k) for k in rows.keys if k is not None)
    n += sum(len(v) for v in rows.values if v is not None)
    for hs in rows.headers:
        if hs:
            n += sum(len(name.encode()) + (len(v) if v is not None else 0) for name, v in hs)
    return n


class ProduceThrottle:
    """A byte-rate limit on what the process produces (thread-safe).

    Args:
        rate: bytes per second (> 0).
        throttled: the counter of seconds waited (``replicator_ingress_throttled_seconds_total``,
            already labelled), or ``None``.
        clock: monotonic seconds (tests pass a fake).
        wait: waits up to the given seconds or until ``stop`` is set (tests pass a fake
            that moves the fake clock).
    """

    def __init__(self, rate: int, throttled: Any | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[threading.Event, float], object] | None = None) -> None:
        self.clock = clock
        self.bucket = TokenBucket(float(rate), clock())
        self.throttled = throttled
        self._wait = wait or (lambda stop, seconds: stop.wait(seconds))
        self._lock = threading.Lock()

    def _waited(self, seconds: float) -> None:
        if self.throttled is not None and seconds > 0:
            self.throttled.inc(seconds)

    def hold(self, stop: threading.Event) -> None:
        """Wait until the bucket is out of debt (or ``stop`` is set)."""
        while not stop.is_set():
            with self._lock:
                delay = self.bucket.delay(self.clock())
            if delay <= 0:
                return
            pause = min(delay, WAIT_SLICE)
            self._wait(stop, pause)
            self._waited(pause)

    def drain(self, pending: deque[B]) -> list[B]:
        """Pop the batches of ``pending`` the tokens cover, in order, at least one (a batch
        larger than the tokens goes alone, and its debt is waited out by the next
        ``hold``); their bytes are taken. The caller holds the queue's lock.
        """
        out: list[B] = []
        with self._lock:
            now = self.clock()
            self.bucket.take(0, now)            # refill to now
            room = self.bucket.tokens
            used = 0
            while pending:
                size = rows_bytes(pending[0].rows)
                if out and used + size > room:
                    break
                out.append(pending.popleft())
                used += size
            self.bucket.take(used, now)
        return out

    def admit(self, nbytes: int, check: Callable[[], None],
              stop: threading.Event | None = None) -> bool:
        """Wait until the bytes of the calls admitted before are paid for, then take
        ``nbytes``: calls go in the order they arrive. True once admitted; False when
        ``stop`` was set while waiting (the worker is stopping: it must not produce).

        ``check`` runs between waits and may raise to give up (the sink was purged); the
        bytes then stay taken (a bounded overshoot of the wait, never of the rate).
        """
        stop = stop or threading.Event()
        with self._lock:
            now = self.clock()
            delay = self.bucket.delay(now)
            self.bucket.take(nbytes, now)
        until = self.clock() + delay
        while delay > 0:
            if stop.is_set():
                return False
            check()
            pause = min(delay, WAIT_SLICE)
            self._wait(stop, pause)
            self._waited(pause)
            delay = until - self.clock()
        return True


def drain_all(pending: deque[B], throttle: ProduceThrottle | None) -> list[B]:
    """Every batch of ``pending`` (no limit), or what ``throttle`` lets through."""
    if throttle is not None:
        return throttle.drain(pending)
    out = list(pending)
    pending.clear()
    return out
