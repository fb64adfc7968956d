"""``Scheduler``: a fixed pool of threads that runs the steps of many tasks (the replay
workers of every owned partition), so threads do not grow with partitions.

A task is anything with ``step() -> float | None``: it does a bounded piece of work and
returns when it would wait, with the seconds until it wants to run again (``0``: at once,
after the tasks already ready; ``WAIT`` (infinity): only when woken), or ``None`` when it
is finished. A task that waits holds no thread: it is an entry in a timer heap, or nothing
at all until ``wake`` (a segment event, a replay permit granted, stop).

* One step of a task runs at a time. ``wake`` during a step makes the task run again right
  after it, whatever the step returned (no wake-up is lost).
* Ready tasks run in the order they became ready (FIFO): a partition with a lot to replay
  goes to the back after each step.
* Threads: ``threads``, named ``{name}-{i}``, started by ``start``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

WAIT = math.inf
"""A step's return value: run again only when woken."""

STALE_SLACK = 64
"""Timers the heap may hold beyond twice the tasks before stale ones are dropped."""

FAILED_STEP_DELAY = 5.0
"""Seconds before a task whose step raised (a bug) is run again."""


class Task(Protocol):
    """A unit of work the scheduler runs step by step."""

    def step(self) -> float | None:
        """Run until the task would wait; the seconds until the next step, ``WAIT``, or
        ``None`` once finished.
        """


class _Finished:
    """What a finished entry holds instead of its task (its stale timers stay in the heap
    until their time; the task is freed at once).
    """

    def step(self) -> float | None:
        return None


_FINISHED = _Finished()


class _Entry:
    __slots__ = ("gen", "state", "task")

    def __init__(self, task: Task) -> None:
        self.task: Task = task
        self.state = "idle"     # idle | ready | running | rerun
        self.gen = 0            # bumped when a timer of this entry becomes stale


class Scheduler:
    """Runs tasks' steps on ``threads`` threads.

    Args:
        threads: the pool size.
        name: the threads' name prefix.
        monotonic: the clock of timers (tests).
    """

    def __init__(self, threads: int, *, name: str = "replay",
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if threads < 1:
            raise ValueError("at least one thread")
        self.size = threads
        self.name = name
        self._now = monotonic
        self._entries: dict[int, _Entry] = {}
        self._ready: deque[_Entry] = deque()
        self._timers: list[tuple[float, int, int, _Entry]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self.running = 0
        """Steps running now (introspection)."""

    def start(self) -> None:
        """Start the pool's threads (idempotent)."""
        with self._cond:
            if self._threads:
                return
            self._threads = [threading.Thread(target=self._run, name=f"{self.name}-{i}",
                                              daemon=True) for i in range(self.size)]
        for t in self._threads:
            t.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the threads after their current steps; tasks left are dropped."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def add(self, task: Task) -> None:
        """Schedule ``task``'s first step now."""
        with self._cond:
            if id(task) in self._entries:
                raise ValueError("task already scheduled")
            entry = _Entry(task)
            self._entries[id(task)] = entry
            self._make_ready(entry)

    def wake(self, task: Task) -> None:
        """Run ``task``'s next step now (any thread); nothing if it is finished."""
        with self._cond:
            entry = self._entries.get(id(task))
            if entry is None:
                return
            if entry.state == "idle":
                entry.gen += 1          # its timer, if any, is stale
                self._make_ready(entry)
            elif entry.state == "running":
                entry.state = "rerun"

    @property
    def tasks(self) -> int:
        """Tasks not finished."""
        with self._cond:
            return len(self._entries)

    def _make_ready(self, entry: _Entry) -> None:
        entry.state = "ready"
        self._ready.append(entry)
        self._cond.notify()

    def _next(self) -> _Entry | None:
        """The next ready entry, marked running (waits); None when closing."""
        with self._cond:
            while not self._closing:
                now = self._now()
                while self._timers and self._timers[0][0] <= now:
                    _, _, gen, entry = heapq.heappop(self._timers)
                    if entry.gen == gen and entry.state == "idle":
                        self._make_ready(entry)
                if self._ready:
                    entry = self._ready.popleft()
                    entry.state = "running"
                    self.running += 1
                    return entry
                wait = None if not self._timers else max(0.0, self._timers[0][0] - now)
                self._cond.wait(wait)
            return None

    def _run(self) -> None:
        while (entry := self._next()) is not None:
            try:
                delay = entry.task.step()
            except Exception:
                log.exception("a scheduled step failed; retried in %.0fs", FAILED_STEP_DELAY)
                delay = FAILED_STEP_DELAY
            with self._cond:
                self.running -= 1
                if delay is None:
                    del self._entries[id(entry.task)]
                    entry.task = _FINISHED
                elif entry.state == "rerun" or delay <= 0:
                    self._make_ready(entry)
                else:
                    entry.state = "idle"
                    if delay != WAIT:
                        entry.gen += 1
                        when = self._now() + delay
                        first = not self._timers or when < self._timers[0][0]
                        heapq.heappush(self._timers, (when, next(self._seq), entry.gen, entry))
                        if len(self._timers) > 2 * len(self._entries) + STALE_SLACK:
                            self._drop_stale_timers()
                        if first:
                            self._cond.notify()

    def _drop_stale_timers(self) -> None:
        """Under the lock: keep only the timers that still fire (a wake makes the timer of
        the wait it ends stale; it would otherwise stay in the heap until its time).
        """
        self._timers = [t for t in self._timers if t[3].gen == t[2] and t[3].state == "idle"]
        heapq.heapify(self._timers)
