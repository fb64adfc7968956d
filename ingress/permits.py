"""``FifoPermits``: the replay slots of a process (``ingress.max_parallel_replays``),
granted in the order they were asked for.

A semaphore polled with a timeout grants a freed slot to whichever waiter polls next, so
during a catch-up of many partitions some can wait far longer than others. Here a freed
slot is handed to the longest waiter directly.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

POLL = 0.2
"""Seconds between checks of ``stop`` while waiting for a slot."""


class FifoPermits:
    """``n`` permits, granted first come, first served.

    Args:
        n: the number of permits.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("at least one permit")
        self._free = n
        self._waiting: deque[threading.Event] = deque()
        self._lock = threading.Lock()

    def acquire(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait for a permit, after every caller that asked before; False (no permit held)
        once ``stop()`` is true.
        """
        granted = threading.Event()
        with self._lock:
            if self._free > 0 and not self._waiting:
                self._free -= 1
                return True
            self._waiting.append(granted)
        while not granted.wait(POLL):
            if stop():
                with self._lock:
                    if not granted.is_set():
                        self._waiting.remove(granted)
                        return False
                # Granted meanwhile: hand it on.
                self.release()
                return False
        return True

    def release(self) -> None:
        """Give a permit back: to the longest waiter, if any."""
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._free += 1

    @property
    def waiting(self) -> int:
        """Callers waiting for a permit."""
        with self._lock:
            return len(self._waiting)
