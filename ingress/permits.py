"""``FifoPermits``: the replay slots of a process (``ingress.max_parallel_replays``),
granted in the order they were asked for.

A semaphore polled with a timeout grants a freed slot to whichever waiter polls next, so
during a catch-up of many partitions some can wait far longer than others. Here a freed
slot is handed to the longest waiter directly.

A replay worker holds no thread while it waits (``ingress.scheduler``): it asks with
``request`` and is woken by the grant's callback. ``acquire`` is the blocking form.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

POLL = 0.2
"""Seconds between checks of ``stop`` while blocked in ``acquire``."""


class PermitRequest:
    """One caller's place in the queue; ``granted`` once it holds a permit."""

    __slots__ = ("_on_grant", "granted")

    def __init__(self, on_grant: Callable[[], None]) -> None:
        self.granted = False
        self._on_grant = on_grant


class FifoPermits:
    """``n`` permits, granted first come, first served.

    Args:
        n: the number of permits.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("at least one permit")
        self._free = n
        self._waiting: deque[PermitRequest] = deque()
        self._lock = threading.Lock()

    def request(self, on_grant: Callable[[], None]) -> PermitRequest:
        """Ask for a permit without waiting: granted at once when one is free and nobody
        asked before (``on_grant`` is not called then); otherwise queued, and ``on_grant``
        is called (from the releasing thread) when it is handed this request. The holder
        gives it back with ``release``; a request no longer wanted is dropped with
        ``cancel``.
        """
        req = PermitRequest(on_grant)
        with self._lock:
            if self._free > 0 and not self._waiting:
                self._free -= 1
                req.granted = True
            else:
                self._waiting.append(req)
        return req

    def cancel(self, req: PermitRequest) -> None:
        """Drop ``req``: leave the queue, or give the permit back if it was granted."""
        with self._lock:
            if not req.granted:
                self._waiting.remove(req)
                return
        self.release()

    def acquire(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait for a permit, after every caller that asked before; False (no permit held)
        once ``stop()`` is true.
        """
        granted = threading.Event()
        req = self.request(granted.set)
        while not req.granted and not granted.wait(POLL):
            if stop():
                self.cancel(req)
                return False
        return True

    def release(self) -> None:
        """Give a permit back: to the longest waiter, if any."""
        with self._lock:
            if not self._waiting:
                self._free += 1
                return
            req = self._waiting.popleft()
            req.granted = True
        req._on_grant()

    @property
    def waiting(self) -> int:
        """Callers waiting for a permit."""
        with self._lock:
            return len(self._waiting)
