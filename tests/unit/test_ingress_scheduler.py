"""The replay pool: many tasks on a fixed number of threads, timers, wake-ups, FIFO."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ingress.permits import FifoPermits
from ingress.scheduler import WAIT, Scheduler


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class Recorder:
    """A task that records each step (its thread, when) and returns what it is told."""

    def __init__(self, results: list[float | None] | None = None,
                 body: Callable[[], object] | None = None) -> None:
        self.results = list(results or [])
        self.body = body
        self.steps: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def step(self) -> float | None:
        with self.lock:
            self.steps.append((threading.current_thread().name, time.monotonic()))
        if self.body is not None:
            self.body()
        return self.results.pop(0) if self.results else WAIT

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.steps)


@pytest.fixture
def pool() -> Iterator[Scheduler]:
    s = Scheduler(3, name="t-pool")
    s.start()
    yield s
    s.close()


def test_many_waiting_tasks_hold_no_thread_and_run_when_woken(pool: Scheduler) -> None:
    before = threading.active_count()
    tasks = [Recorder() for _ in range(300)]
    for t in tasks:
        pool.add(t)
    wait_until(lambda: all(t.count == 1 for t in tasks))
    assert threading.active_count() == before      # no thread per task
    for t in tasks:
        pool.wake(t)
    wait_until(lambda: all(t.count == 2 for t in tasks))
    names = {n for t in tasks for n, _ in t.steps}
    assert names <= {"t-pool-0", "t-pool-1", "t-pool-2"}
    time.sleep(0.1)
    assert all(t.count == 2 for t in tasks)        # WAIT: nothing without a wake


def test_timer_runs_the_next_step_after_the_delay_and_a_wake_cancels_it(
        pool: Scheduler) -> None:
    t = Recorder([0.3])
    pool.add(t)
    wait_until(lambda: t.count == 2)
    assert t.steps[1][1] - t.steps[0][1] >= 0.29
    late = Recorder([0.4])
    pool.add(late)
    wait_until(lambda: late.count == 1)
    pool.wake(late)                                  # early: the timer is stale now
    wait_until(lambda: late.count == 2)
    time.sleep(0.6)
    assert late.count == 2


def test_a_wake_during_a_step_runs_it_again_right_after(pool: Scheduler) -> None:
    entered, release = threading.Event(), threading.Event()

    def body() -> None:
        if not entered.is_set():
            entered.set()
            release.wait(5)

    t = Recorder([WAIT, WAIT], body=body)
    pool.add(t)
    entered.wait(5)
    pool.wake(t)                                     # while it runs: not lost
    release.set()
    wait_until(lambda: t.count == 2)


def test_a_finished_task_is_dropped_and_wakes_are_ignored(pool: Scheduler) -> None:
    t = Recorder([None])
    pool.add(t)
    wait_until(lambda: pool.tasks == 0)
    pool.wake(t)
    time.sleep(0.05)
    assert t.count == 1


def test_ready_tasks_run_in_the_order_they_became_ready() -> None:
    one = Scheduler(1, name="t-one")
    order: list[int] = []
    gate = threading.Event()
    blocker = Recorder([None], body=lambda: gate.wait(5))
    tasks = [Recorder([None], body=functools.partial(order.append, i)) for i in range(5)]
    one.add(blocker)
    for t in tasks:
        one.add(t)
    one.start()
    try:
        gate.set()
        wait_until(lambda: len(order) == 5)
        assert order == [0, 1, 2, 3, 4]
    finally:
        one.close()


def test_a_step_that_raises_is_retried_later_not_lost(pool: Scheduler,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import ingress.scheduler as sched

    monkeypatch.setattr(sched, "FAILED_STEP_DELAY", 0.05)
    calls: list[int] = []

    class Flaky:
        def step(self) -> float | None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("bug")
            return None

    pool.add(Flaky())
    wait_until(lambda: len(calls) == 2 and pool.tasks == 0)


def test_permit_requests_are_granted_in_order_by_callback() -> None:
    permits = FifoPermits(1)
    first = permits.request(lambda: None)
    assert first.granted
    granted: list[int] = []
    reqs = [permits.request(functools.partial(granted.append, i)) for i in range(3)]
    assert not any(r.granted for r in reqs) and permits.waiting == 3
    permits.cancel(reqs[1])                          # left the queue
    permits.release()
    assert granted == [0] and reqs[0].granted
    permits.cancel(reqs[0])                          # granted: handed on
    assert granted == [0, 2] and reqs[2].granted and permits.waiting == 0
    permits.release()
    assert permits.request(lambda: None).granted     # no permit was lost


def test_a_finished_task_is_not_kept_alive_by_its_stale_timer(pool: Scheduler) -> None:
    """A revoked partition's worker (its segment inventory, its sink) is freed when it
    finishes. Was: the timer of its last wait (a rescan in minutes, a late gap's reload in
    up to an hour) kept it in the heap until that time."""
    import gc
    import weakref

    def run_one() -> weakref.ref[Recorder]:
        t = Recorder([3600.0, None])
        pool.add(t)
        wait_until(lambda: t.count == 1)
        pool.wake(t)                  # the stop: its timer is stale now
        wait_until(lambda: pool.tasks == 0)
        return weakref.ref(t)

    ref = run_one()
    gc.collect()
    assert ref() is None


def test_stale_timers_do_not_pile_up_while_tasks_are_woken_early(pool: Scheduler) -> None:
    """A partition waiting for a late gap (a reload in up to an hour) is woken by each
    event of a later segment; each wake leaves its former timer stale. Was: every stale
    timer stayed in the heap until its time (one per event per partition)."""
    tasks = [Recorder([3600.0] * 60) for _ in range(50)]
    for t in tasks:
        pool.add(t)
    def stepped(n: int) -> bool:
        return all(t.count >= n for t in tasks)

    for n in range(1, 41):
        wait_until(functools.partial(stepped, n))       # each one waits for its timer
        for t in tasks:
            pool.wake(t)
    wait_until(functools.partial(stepped, 41))
    with pool._cond:
        assert len(pool._timers) <= 2 * len(tasks) + 64
