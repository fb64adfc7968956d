"""``[ingress] max_bytes_per_second`` (``ingress.throttle``): what a transaction takes,
how long the loop and the at-least-once produce calls wait, on a fake clock; and the
transaction loop held to it (with the fake producer of test_ingress_shared).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ingress.rows import Rows
from ingress.throttle import ProduceThrottle, drain_all, rows_bytes
from replicator.core.metrics import Metrics
from replicator.core.throttle import MIN_DELAY
from tests.unit.test_ingress_shared import Harness, T


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.waited = 0.0

    def clock(self) -> float:
        return self.now

    def wait(self, stop: threading.Event, seconds: float) -> None:
        self.now += seconds
        self.waited += seconds


def rows_of(size: int) -> Rows:
    """One record whose value is ``size`` bytes (no key, no headers)."""
    return Rows([0], [1], [None], [b"x" * size], [None])


@dataclass
class B:
    rows: Rows | None


def throttle(rate: int, t: FakeTime, m: Metrics | None = None) -> ProduceThrottle:
    counter = None
    if m is not None:
        counter = m.counter("ingress_throttled_seconds_total", "t", ("region",)).labels("r")
    return ProduceThrottle(rate, counter, clock=t.clock, wait=t.wait)


def test_rows_bytes_counts_keys_values_and_headers() -> None:
    rows = Rows([0, 1], [1, 1], [b"ab", None], [b"cde", None],
                [[("h", b"12"), ("é", None)], None])
    assert rows_bytes(rows) == 2 + 3 + (1 + 2) + 2
    assert rows_bytes(None) == 0


def test_a_transaction_takes_what_the_tokens_cover_and_at_least_one_batch() -> None:
    t, m = FakeTime(), Metrics()
    th = throttle(1000, t, m)
    pending = deque(B(rows_of(400)) for _ in range(5))
    assert len(th.drain(pending)) == 2                  # 800 of the 1000 tokens
    assert len(th.drain(pending)) == 1                  # 200 left: one batch alone, in debt
    assert th.bucket.delay(t.now) > 0
    th.hold(threading.Event())                          # waits out the 200 of debt
    assert t.waited == 0.2 and th.bucket.delay(t.now) == 0
    assert m.value("replicator_ingress_throttled_seconds_total", {"region": "r"}) == 0.2
    big = deque([B(rows_of(5000)), B(rows_of(1))])
    assert [len(x.rows or []) for x in th.drain(big)] == [1]   # larger than the bucket
    th.hold(threading.Event())
    assert t.waited == 0.2 + 5.0


def test_no_throttle_drains_everything() -> None:
    pending = deque(B(rows_of(10)) for _ in range(3))
    assert len(drain_all(pending, None)) == 3 and not pending


def test_hold_returns_once_stopped() -> None:
    t = FakeTime()
    th = throttle(10, t)
    th.drain(deque([B(rows_of(10_000))]))               # 999 s of debt
    stop = threading.Event()
    stop.set()
    th.hold(stop)
    assert t.waited == 0


@settings(max_examples=40, deadline=None)
@given(rate=st.sampled_from([1_000, 64_000, 1_000_000]),
       sizes=st.lists(st.integers(1_000, 300_000), min_size=1, max_size=30),
       seconds=st.integers(5, 30))
def test_a_loop_held_to_the_throttle_keeps_the_rate_within_one_burst_and_one_batch(
        rate: int, sizes: list[int], seconds: int) -> None:
    # A transaction loop that always has batches waiting: hold, drain, produce. The bytes
    # produced by any time stay within rate * time + one burst + the largest batch, and
    # reach rate * time less one batch (the rate is held, not undershot). A debt below
    # MIN_DELAY seconds is no wait: that much more.
    t = FakeTime()
    th = throttle(rate, t)
    pending: deque[B] = deque()
    produced, i = 0, 0
    never = threading.Event()
    while t.now < seconds:
        while len(pending) < 10:
            pending.append(B(rows_of(sizes[i % len(sizes)])))
            i += 1
        th.hold(never)
        produced += sum(rows_bytes(b.rows) for b in th.drain(pending))
        assert produced <= rate * (t.now + MIN_DELAY) + rate + max(sizes)
    assert produced >= rate * seconds - max(sizes) - rate * 0.5


def test_at_least_once_calls_go_in_order_and_each_waits_for_the_debt_before_it() -> None:
    t, m = FakeTime(), Metrics()
    th = throttle(1000, t, m)
    checks: list[int] = []
    th.admit(1500, lambda: checks.append(1))            # full bucket: no wait, 500 in debt
    assert t.waited == 0
    th.admit(1000, lambda: checks.append(2))            # waits 0.5 s for the first's debt
    assert t.waited == 0.5 and checks == [2]
    th.admit(10, lambda: checks.append(3))              # waits 1 s for the second's
    assert t.waited == 1.5
    assert m.value("replicator_ingress_throttled_seconds_total", {"region": "r"}) == 1.5


def test_an_admit_whose_sink_was_purged_gives_up() -> None:
    t = FakeTime()
    th = throttle(100, t)
    th.admit(10_000, lambda: None)

    def purged() -> None:
        raise RuntimeError("purged")

    try:
        th.admit(10, purged)
    except RuntimeError:
        pass
    else:
        raise AssertionError("admit went on for a purged sink")
    assert t.waited == 0


def test_the_transaction_loop_puts_only_what_the_limit_allows_in_one_transaction() -> None:
    h = Harness()
    h.ownership.grant([(T, 0), (T, 1)])
    # 2 records of 2 bytes per batch (4 bytes); a bucket of 10 bytes a second takes two
    # batches in the first transaction and then one per 0.4 s.
    h.loop.throttle = ProduceThrottle(10)
    batches = [h.batch(0, 0, 2), h.batch(1, 0, 2), h.batch(0, 2, 4), h.batch(1, 2, 4)]
    for b in batches:
        h.loop.submit(b)
    h.loop.start()
    try:
        assert all(h.outcome(b) is None for b in batches)
    finally:
        h.loop.close()
    assert h.log.count("commit") == 3
    assert len(h.producer.committed) == 8


def test_replicator_topics_describes_each_limit() -> None:
    from replicator.ops.topics import describe_rate

    assert describe_rate(0) == "unlimited"
    assert describe_rate(10 * 1024**2) == "10.0 MiB/s per process"
