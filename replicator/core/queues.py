"""Hand-offs between threads: ``put_unless_stopped`` (a bounded queue), ``read_ahead`` (an
iterator run ahead of its consumer in a helper thread) and ``SerialQueue`` (one owner's
tasks in order on a shared pool).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


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


_DONE = object()


def read_ahead(items: Iterator[T], depth: int, *, name: str = "read-ahead"
               ) -> Generator[T, None, None]:
    """Iterate ``items`` in a helper thread, at most ``depth`` items ahead of the consumer.

    Reading and decoding (network, decompression, which release the GIL) overlap the
    consumer's work; memory stays bounded: ``depth`` items queued, one being made, one
    being used. The helper thread starts with the first ``next``.

    An exception of ``items`` is raised to the consumer at the point it happened. When the
    consumer stops early (an exception, ``close()`` of this generator), the helper is told
    to stop, ``items`` is closed in the helper's thread (its ``with``/``finally`` blocks run
    there) and the thread is joined, so what ``items`` reads from may be released after.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    cancel = threading.Event()

    def put(item: Any) -> bool:
        return put_unless_stopped(q, item, cancel)

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    break
        except BaseException as e:  # noqa: BLE001 - not swallowed: raised by the consumer
            put((False, e))
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        put((True, _DONE))

    t = threading.Thread(target=produce, name=name, daemon=True)
    t.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        cancel.set()
        t.join()


class SerialQueue:
    """Runs one partition's tasks in submission order on a shared pool, one at a time."""

    def __init__(self, pool: Executor, name: str) -> None:
        self._pool = pool
        self._name = name
        self._lock = threading.Lock()
        self._tasks: deque[Callable[[], None]] = deque()
        self._running = False
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            self._tasks.append(task)
            self._idle.clear()
            if self._running:
                return
            self._running = True
        self._pool.submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._tasks:
                    self._running = False
                    self._idle.set()
                    return
                task = self._tasks.popleft()
            try:
                task()
            except Exception:
                # Tasks handle their own errors; reaching here is a bug. Keep the queue
                # alive for the partition's later tasks and make the failure loud.
                log.exception("%s: unexpected error in a segment task", self._name)

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(max(0.0, timeout))
