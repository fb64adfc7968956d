"""Hand-offs between a producing thread and its consumer through a bounded queue."""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import TypeVar

T = TypeVar("T")


def put_unless_stopped(q: queue.Queue[T], item: T, stop: threading.Event,
                       poll: float = 0.1) -> bool:
    """Put ``item`` into the bounded ``q``, waiting for room, unless ``stop`` is set first.

    Returns:
        True if the item was queued, False if ``stop`` was set while waiting (the consumer
        is gone, so the producer must end instead of blocking forever).
    """
    while not stop.is_set():
        # queue.Full here only means the wait timed out: check stop, then wait again.
        with contextlib.suppress(queue.Full):
            q.put(item, timeout=poll)
            return True
    return False
