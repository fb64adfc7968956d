"""The retry helper: multiplicative jitter, only RetriableError, attempt counting."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.core.errors import FatalError, RetriableError, StorageError
from replicator.core.retry import Backoff, RetryPolicy, backoff_schedule, jittered, retry

ALMOST_ONE = 1.0 - 2**-53


@pytest.mark.parametrize("j", [0.0, 0.2, 0.5, 0.99])
def test_jitter_bounds(j: float) -> None:
    assert jittered(10.0, j, lambda: 0.0) == pytest.approx(10.0 * (1 - j))
    assert jittered(10.0, j, lambda: ALMOST_ONE) == pytest.approx(10.0 * (1 + j))
    assert jittered(10.0, j, lambda: 0.5) == pytest.approx(10.0)


@given(st.floats(0.001, 1000), st.floats(0, 0.99), st.floats(0, ALMOST_ONE))
def test_jitter_stays_within_d_times_one_plus_minus_j(d: float, j: float, r: float) -> None:
    v = jittered(d, j, lambda: r)
    assert d * (1 - j) - 1e-9 <= v <= d * (1 + j) + 1e-9
    assert v > 0  # multiplicative jitter never collapses to zero


def test_policy_delays_grow_and_cap() -> None:
    p = RetryPolicy(attempts=6, initial=timedelta(seconds=1), multiplier=2,
                    maximum=timedelta(seconds=5), jitter=0.0)
    assert list(p.delays()) == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert RetryPolicy(attempts=1).nominal_delay(0) == 0.2
    assert list(RetryPolicy(attempts=1).delays()) == []


@pytest.mark.parametrize("kwargs", [{"attempts": 0}, {"jitter": 1.0}, {"jitter": -0.1},
                                    {"multiplier": 0.5}])
def test_policy_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


class Flaky:
    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


POLICY = RetryPolicy(attempts=4, initial=timedelta(seconds=1), multiplier=3,
                     maximum=timedelta(seconds=60), jitter=0.5)


def test_retries_retriable_errors_then_succeeds() -> None:
    fn = Flaky(2, StorageError("s3 503"))
    sleeps: list[float] = []
    seen: list[int] = []
    out = retry(fn, POLICY, what="put x", sleep=sleeps.append, rand=lambda: 0.0,
                on_retry=lambda e, n: seen.append(n))
    assert out == "done"
    assert fn.calls == 3
    assert sleeps == [0.5, 1.5]  # d * (1 - j) with rand = 0
    assert seen == [1, 2]


def test_gives_up_after_attempts() -> None:
    fn = Flaky(100, RetriableError("still down"))
    sleeps: list[float] = []
    with pytest.raises(RetriableError, match="still down"):
        retry(fn, POLICY, what="x", sleep=sleeps.append, rand=lambda: ALMOST_ONE)
    assert fn.calls == POLICY.attempts
    assert sleeps == pytest.approx([1.5, 4.5, 13.5])  # d * (1 + j)


@pytest.mark.parametrize("error", [FatalError("bad"), ValueError("bug"), KeyError("k")])
def test_other_errors_are_not_retried(error: Exception) -> None:
    fn = Flaky(1, error)
    sleeps: list[float] = []
    with pytest.raises(type(error)):
        retry(fn, POLICY, what="x", sleep=sleeps.append)
    assert fn.calls == 1
    assert sleeps == []


def test_single_attempt_policy_does_not_sleep() -> None:
    fn = Flaky(1, RetriableError("once"))
    sleeps: list[float] = []
    with pytest.raises(RetriableError):
        retry(fn, RetryPolicy(attempts=1), what="x", sleep=sleeps.append)
    assert (fn.calls, sleeps) == (1, [])


@given(st.integers(1, 50), st.integers(1, 10**7))
def test_backoff_schedule_sums_to_total_and_grows(tries: int, total_ms: int) -> None:
    total = timedelta(milliseconds=total_ms)
    waits = backoff_schedule(total, tries)
    assert len(waits) == tries
    assert sum(waits, timedelta()) == total
    assert all(w >= timedelta(0) for w in waits)
    # Non-decreasing up to microsecond rounding on the way.
    assert all(b >= a - timedelta(microseconds=2) for a, b in itertools.pairwise(waits))


def test_backoff_schedule_for_the_defaults() -> None:
    waits = backoff_schedule(timedelta(hours=1), 5)
    # weights 1, 2, 4, 8, 16 of 31
    assert waits[0] == timedelta(seconds=3600 / 31)
    assert waits[-1] == pytest.approx(timedelta(seconds=3600 * 16 / 31),
                                      abs=timedelta(microseconds=5))
    assert waits[4] > waits[3] > waits[2] > waits[1] > waits[0]
    assert backoff_schedule(timedelta(minutes=5), 1) == [timedelta(minutes=5)]
    with pytest.raises(ValueError):
        backoff_schedule(timedelta(minutes=5), 0)


def test_backoff_grows_to_its_cap_resets_and_never_overflows() -> None:
    b = Backoff(initial=timedelta(milliseconds=500), multiplier=2.0,
                maximum=timedelta(seconds=60), jitter=0.0)
    assert [b.next() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 32, 60, 60]
    for _ in range(5000):   # a loop that retries for days: the exponent stays bounded
        assert b.next() == 60
    b.reset()
    assert b.next() == 0.5


def test_backoff_jitter_is_multiplicative() -> None:
    lo = Backoff(initial=timedelta(seconds=1), jitter=0.2, rand=lambda: 0.0)
    hi = Backoff(initial=timedelta(seconds=1), jitter=0.2, rand=lambda: 0.999999)
    assert lo.next() == pytest.approx(0.8) and hi.next() == pytest.approx(1.2, rel=1e-5)
