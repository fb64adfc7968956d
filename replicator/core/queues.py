"""Hand-offs between threads through bounded queues: ``put_unless_stopped`` and
``read_ahead`` (an iterator run ahead of its consumer in a helper thread)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Generator, Iterator
from typing import Any, TypeVar

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
