"""``FifoPermits``: the replay slots of a process (``ingress.max_parallel_replays``),
granted in the order they were asked for; ``ByteBudget``: the bytes of decoded records not
committed yet (``ingress.max_bytes_in_flight``), granted the same way.

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


class BudgetRequest:
    """One caller's share of a ``ByteBudget``: ``size`` bytes, ``granted`` once held."""

    __slots__ = ("_on_grant", "granted", "size")

    def __init__(self, size: int, on_grant: Callable[[], None]) -> None:
        self.size = size
        self.granted = False
        self._on_grant = on_grant


class ByteBudget:
    """``limit`` bytes, granted first come, first served (ingress/README.md, "Threads").

    A replay worker asks for a batch's worth (``batch_bytes``) before it reads one, keeps
    what the decoded batch holds (``resize``) until its transaction ends, then gives it
    back (``cancel``). A request larger than ``limit`` asks for ``limit``; a batch above
    its request (one record larger than ``batch_bytes`` goes alone) is kept whole, so
    ``in_use`` can pass ``limit`` by that one batch, never more.

    Args:
        limit: the bytes.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one byte")
        self.limit = limit
        self.in_use = 0
        """Bytes granted now."""
        self.peak = 0
        """The most bytes granted at once so far (tests, the benchmark)."""
        self._waiting: deque[BudgetRequest] = deque()
        self._lock = threading.Lock()

    def request(self, size: int, on_grant: Callable[[], None]) -> BudgetRequest:
        """Ask for ``size`` bytes without waiting: granted at once when they are free and
        nobody asked before (``on_grant`` is not called then); otherwise queued, and
        ``on_grant`` is called (from the releasing thread) once granted.
        """
        req = BudgetRequest(max(0, min(size, self.limit)), on_grant)
        with self._lock:
            self._waiting.append(req)
            granted = self._grant()
        for r in granted:
            if r is not req:
                r._on_grant()
        return req

    def resize(self, req: BudgetRequest, size: int) -> None:
        """A granted request now holds ``size`` bytes (the decoded batch's)."""
        assert req.granted, "resize a granted request only"
        with self._lock:
            self.in_use += size - req.size
            req.size = size
            self.peak = max(self.peak, self.in_use)
            granted = self._grant()
        for r in granted:
            r._on_grant()

    def cancel(self, req: BudgetRequest) -> None:
        """Give the bytes back, or leave the queue (idempotent)."""
        with self._lock:
            if req.granted:
                self.in_use -= req.size
                req.granted = False
                req.size = 0
            elif req in self._waiting:
                self._waiting.remove(req)
            granted = self._grant()
        for r in granted:
            r._on_grant()

    def _grant(self) -> list[BudgetRequest]:
        """Under the lock: grant waiters in order while the first one fits."""
        out = []
        while self._waiting and self.in_use + self._waiting[0].size <= self.limit:
            req = self._waiting.popleft()
            req.granted = True
            self.in_use += req.size
            out.append(req)
        self.peak = max(self.peak, self.in_use)
        return out

    @property
    def waiting(self) -> int:
        """Callers waiting for bytes."""
        with self._lock:
            return len(self._waiting)
