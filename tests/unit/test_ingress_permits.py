"""Replay slots are granted in the order they were asked for (no partition starves)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ingress.permits import FifoPermits


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def waiting_is(permits: FifoPermits, n: int) -> Callable[[], bool]:
    return lambda: permits.waiting == n


def test_the_partition_that_asked_first_gets_the_slot_first() -> None:
    permits = FifoPermits(1)
    assert permits.acquire()
    order: list[int] = []
    threads = []
    for i in range(6):
        def take(i: int = i) -> None:
            permits.acquire()
            order.append(i)
            permits.release()

        t = threading.Thread(target=take)
        t.start()
        threads.append(t)
        wait_until(waiting_is(permits, i + 1))   # asked in this order
    permits.release()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3, 4, 5]


def test_a_late_asker_does_not_overtake_waiters_when_a_slot_frees() -> None:
    """A polled semaphore hands a freed slot to whoever polls next: a newcomer could take
    it from a partition that has waited long. Here the newcomer queues behind."""
    permits = FifoPermits(1)
    assert permits.acquire()
    got: list[str] = []
    def take(name: str) -> None:
        permits.acquire()
        got.append(name)

    first = threading.Thread(target=take, args=("waiting",))
    first.start()
    wait_until(lambda: permits.waiting == 1)
    permits.release()                       # handed to the waiter directly
    first.join(5)
    newcomer = threading.Thread(target=take, args=("newcomer",))
    newcomer.start()
    wait_until(lambda: permits.waiting == 1)
    assert got == ["waiting"]
    permits.release()
    newcomer.join(5)
    assert got == ["waiting", "newcomer"]


def test_a_stopped_waiter_leaves_the_queue_and_keeps_no_permit() -> None:
    permits = FifoPermits(1)
    assert permits.acquire()
    stop = threading.Event()
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(permits.acquire(stop.is_set)))
    t.start()
    wait_until(lambda: permits.waiting == 1)
    stop.set()
    t.join(5)
    assert result == [False] and permits.waiting == 0
    permits.release()
    assert permits.acquire()                # the permit was not lost
