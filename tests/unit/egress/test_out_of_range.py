"""Partitions stopped out of range: a stateful exploration of reads that answer, fail or
hang, while partitions are released, assigned again and report the same event twice.

Invariants after every step: at most one unanswered read per partition is wanted (every
other is cancelled); an entry belongs to the partition's current writer; a partition is
restarted only for its current writer and only with the log start its own read returned;
the stalled gauge counts exactly the stalled entries, and a partition is stalled only after
``STALLED_AFTER`` without its log start. Once reads answer again, every stopped partition is
restarted and nothing stays stalled.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from egress.out_of_range import (
    READ_PATIENCE,
    RETRY_DELAY,
    STALLED_AFTER,
    OutOfRangePartitions,
)
from egress.partition_writer import PartitionWriter
from replicator.core.errors import KafkaRetriableError

KEYS = [("t", 0), ("t", 1)]


@dataclass(eq=False)
class FakeWriter:
    name: str


@dataclass
class Gauge:
    value: float = 0.0

    def inc(self, n: float = 1.0) -> None:
        self.value += n

    def dec(self, n: float = 1.0) -> None:
        self.value -= n


@dataclass
class Reads:
    started: dict[tuple[str, int], list[tuple[Future[int], int]]] = field(
        default_factory=lambda: {k: [] for k in KEYS})
    low: int = 100
    """What the next answer says (each read is tagged with the value it will return)."""

    def __call__(self, topic: str, partition: int) -> Future[int]:
        f: Future[int] = Future()
        self.started[(topic, partition)].append((f, self.low))
        return f


class OutOfRangeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.reads = Reads()
        self.gauge = Gauge()
        self.failures = Gauge()
        self.oor = OutOfRangePartitions(self.reads, self.gauge, self.failures)
        self.writers: dict[tuple[str, int], Any] = {}
        self.generation = 0
        self.restarted: list[tuple[tuple[str, int], Any, int]] = []
        self.stopped: set[Any] = set()
        """Writers whose partition the client stopped and that were not restarted yet."""

    def _writers(self) -> dict[tuple[str, int], PartitionWriter]:
        return self.writers

    @rule(key=st.sampled_from(KEYS))
    def assign(self, key: tuple[str, int]) -> None:
        self.generation += 1
        self.stopped.discard(self.writers.get(key))     # released before (not forgotten)
        self.writers[key] = FakeWriter(f"{key}#{self.generation}")

    @rule(key=st.sampled_from(KEYS), forget=st.booleans())
    def release(self, key: tuple[str, int], forget: bool) -> None:
        self.stopped.discard(self.writers.pop(key, None))
        if forget:
            self.oor.forget([key])

    @rule(key=st.sampled_from(KEYS), position=st.integers(0, 50))
    def out_of_range_event(self, key: tuple[str, int], position: int) -> None:
        w = self.writers.get(key)
        if w is not None:
            self.oor.report(key, w, position, self.now)
            self.stopped.add(w)

    @rule(key=st.sampled_from(KEYS), ok=st.booleans(), low=st.integers(0, 200))
    def answer(self, key: tuple[str, int], ok: bool, low: int) -> None:
        self.reads.low = low
        pending = [(f, v) for f, v in self.reads.started[key] if not f.done()]
        if not pending:
            return
        f, v = pending[-1]
        if ok:
            f.set_result(v)
        else:
            f.set_exception(KafkaRetriableError("broker said no"))

    @rule(dt=st.sampled_from([0.5, RETRY_DELAY, READ_PATIENCE + 0.1, 20.0]),
          refuse=st.booleans())
    def tick(self, dt: float, refuse: bool) -> None:
        self.now += dt
        for key, o in self.oor.settle(self.now, self._writers()):
            assert self.writers.get(key) is o.writer
            answered = [v for f, v in self.reads.started[key]
                        if f.done() and not f.cancelled() and f.exception() is None]
            assert o.low in answered, "restarted at a log start no read of it returned"
            if refuse:
                self.oor.retry(key, self.now, "refused")
            else:
                self.restarted.append((key, o.writer, o.low))
                self.stopped.discard(o.writer)
                self.oor.done(key)

    @precondition(lambda self: len(self.oor) > 0)
    @rule()
    def quiesce(self) -> None:
        # Reads answer again and restarts are accepted: every stopped partition goes on.
        for _ in range(10):
            for key in KEYS:
                for f, v in self.reads.started[key]:
                    if not f.done():
                        f.set_result(v)
            self.now += READ_PATIENCE + 0.1
            for key, o in self.oor.settle(self.now, self._writers()):
                self.stopped.discard(o.writer)
                self.oor.done(key)
        assert len(self.oor) == 0
        assert self.gauge.value == 0
        assert not self.stopped, "a stopped partition was never restarted"

    @invariant()
    def one_wanted_read_per_partition(self) -> None:
        for key in KEYS:
            assert sum(not f.done() for f, _ in self.reads.started[key]) <= 1

    @invariant()
    def the_gauge_counts_the_stalled(self) -> None:
        assert self.gauge.value == self.oor.stalled
        for o in self.oor.entries.values():
            if o.stalled:
                assert self.now - o.since >= STALLED_AFTER


TestOutOfRange = OutOfRangeMachine.TestCase
TestOutOfRange.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
