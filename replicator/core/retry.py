"""The one retry policy: exponential backoff with multiplicative jitter.

Only ``RetriableError`` is retried. The jitter is ``d * (1 ± j)``: a delay ``d`` becomes a
uniform draw in ``[d * (1 - j), d * (1 + j)]``, so it never collapses to zero and never
more than ``(1 + j)`` times the nominal value.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from replicator.core.errors import RetriableError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry.

    Attributes:
        attempts: total tries, including the first one (``1`` means no retry).
        initial: delay before the second try.
        multiplier: growth of the delay per try.
        maximum: cap of a single delay (before jitter).
        jitter: the ``j`` of ``d * (1 ± j)``, in ``[0, 1)``.
    """

    attempts: int = 5
    initial: timedelta = timedelta(milliseconds=200)
    multiplier: float = 2.0
    maximum: timedelta = timedelta(seconds=10)
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")

    def nominal_delay(self, retry_index: int) -> float:
        """Delay in seconds before retry number ``retry_index`` (0-based), without jitter."""
        d = self.initial.total_seconds() * self.multiplier**retry_index
        return min(d, self.maximum.total_seconds())

    def delays(self, rand: Callable[[], float] = random.random) -> Iterator[float]:
        """The jittered delays between tries: ``attempts - 1`` values."""
        for i in range(self.attempts - 1):
            yield jittered(self.nominal_delay(i), self.jitter, rand)


class Backoff:
    """Unbounded exponential backoff with multiplicative jitter, for loops that retry until
    stopped (a replay session, the SQS relay); ``reset`` after a success starts over.

    Args:
        initial: the first delay.
        multiplier: growth of the delay per failure.
        maximum: cap of a single delay (before jitter).
        jitter: the ``j`` of ``d * (1 ± j)``, in ``[0, 1)``.
        rand: injected for tests.
    """

    def __init__(self, initial: timedelta = timedelta(milliseconds=200),
                 multiplier: float = 2.0, maximum: timedelta = timedelta(seconds=10),
                 jitter: float = 0.2, rand: Callable[[], float] = random.random) -> None:
        # The same checks and delays as a RetryPolicy without an attempt limit.
        self._policy = RetryPolicy(attempts=1, initial=initial, multiplier=multiplier,
                                   maximum=maximum, jitter=jitter)
        self._rand = rand
        self._failures = 0

    def next(self) -> float:
        """Seconds to wait after one more failure."""
        nominal = self._policy.nominal_delay(self._failures)
        if nominal < self._policy.maximum.total_seconds():
            # Stop counting at the cap: the exponent would overflow a float after about
            # a thousand failures, and a loop that retries until stopped gets there.
            self._failures += 1
        return jittered(nominal, self._policy.jitter, self._rand)

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self._failures = 0


def jittered(delay: float, jitter: float, rand: Callable[[], float] = random.random) -> float:
    """Return ``delay * (1 ± jitter)`` drawn uniformly (``rand`` gives ``[0, 1)``)."""
    return delay * (1.0 + jitter * (2.0 * rand() - 1.0))


def backoff_schedule(total: timedelta, tries: int, multiplier: float = 2.0) -> list[timedelta]:
    """Split ``total`` into ``tries`` exponentially growing waits that sum to ``total``.

    Used for late segments: ``late_segment_retries`` reloads spread over
    ``lost_segment_timeout`` (the first wait is the shortest).
    """
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries}")
    weights = [multiplier**i for i in range(tries)]
    scale = total.total_seconds() / sum(weights)
    waits = [timedelta(seconds=w * scale) for w in weights]
    # Put the rounding remainder on the last wait so the sum is exact.
    waits[-1] += total - sum(waits, timedelta())
    return waits


def retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
    on_retry: Callable[[RetriableError, int], None] | None = None,
) -> T:
    """Call ``fn`` until it returns, retrying ``RetriableError`` per ``policy``.

    Args:
        fn: the operation.
        policy: attempts and delays.
        what: a short description for log lines (``"put data/us-east-1/t/0/0/..."``).
        sleep: injected for tests.
        rand: injected for tests.
        on_retry: called with the error and the 1-based attempt number before each wait.

    Raises:
        RetriableError: the last error once attempts are exhausted.
        Exception: anything that is not a ``RetriableError``, at once.
    """
    delays = policy.delays(rand)
    attempt = 1
    while True:
        try:
            return fn()
        except RetriableError as e:
            delay = next(delays, None)
            if delay is None:
                log.warning("%s failed after %d attempt(s): %s", what, attempt, e)
                raise
            log.info("%s failed (attempt %d/%d), retrying in %.2fs: %s",
                     what, attempt, policy.attempts, delay, e)
            if on_retry is not None:
                on_retry(e, attempt)
            sleep(delay)
            attempt += 1
