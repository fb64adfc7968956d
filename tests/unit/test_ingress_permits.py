"""Replay slots are granted in the order they were asked for (no partition starves)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ingress.permits import ByteBudget, FifoPermits


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


def test_byte_budget_grants_in_order_and_gives_back_what_a_batch_does_not_hold() -> None:
    budget = ByteBudget(100)
    woken: list[str] = []
    a = budget.request(60, lambda: woken.append("a"))
    assert a.granted and budget.in_use == 60
    b = budget.request(60, lambda: woken.append("b"))      # does not fit: queued
    c = budget.request(10, lambda: woken.append("c"))      # fits, but b asked first
    assert not b.granted and not c.granted and budget.waiting == 2
    budget.resize(a, 30)              # the decoded batch holds less than asked for
    assert woken == ["b", "c"] and budget.in_use == 100
    budget.cancel(b)                  # its transaction ended
    budget.cancel(b)                  # idempotent
    assert budget.in_use == 40
    assert budget.peak == 100


def test_byte_budget_caps_a_request_at_the_limit_and_lets_one_large_batch_pass() -> None:
    budget = ByteBudget(100)
    a = budget.request(1000, lambda: None)     # batch_bytes above the limit: asks for all
    assert a.granted and a.size == 100
    budget.resize(a, 150)                      # one record above batch_bytes goes whole
    b = budget.request(1, lambda: None)
    assert not b.granted                       # nothing more until it is given back
    budget.cancel(a)
    assert b.granted and budget.in_use == 1
    budget.cancel(b)
    c = budget.request(5, lambda: None)
    budget.cancel(c)
    assert budget.in_use == 0 and budget.waiting == 0
