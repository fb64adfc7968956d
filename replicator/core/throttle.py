"""A byte-rate limit: a token bucket that may go into debt (pure; the caller owns the clock).

A service takes what it just read or wrote (``take``), then asks how long to wait before
the next read (``delay``) and how many records that read may hold (``allowance``). Debt
carries over, so over any window longer than a second the rate stays within one burst (one
second of bytes) and one record of the limit, whatever the record sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BURST_SECONDS = 1.0
"""Bytes a bucket holds when full, in seconds of its rate."""
MIN_DELAY = 1e-4
"""The shortest wait ``delay`` asks for, in seconds."""


@dataclass
class TokenBucket:
    """``rate`` bytes per second, starting full.

    Args:
        rate: bytes per second (> 0).
        now: the clock's reading at creation.
    """

    rate: float
    now: float
    tokens: float = field(init=False)
    _at: float = field(init=False)

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        self.tokens = self.burst
        self._at = self.now

    @property
    def burst(self) -> float:
        return self.rate * BURST_SECONDS

    def _refill(self, now: float) -> None:
        if now > self._at:
            self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
            self._at = now

    def take(self, n: int, now: float) -> None:
        """``n`` bytes went through (debt allowed)."""
        self._refill(now)
        self.tokens -= n

    def delay(self, now: float) -> float:
        """Seconds until the bucket is out of debt (0: go on now). A debt of less than
        ``MIN_DELAY`` seconds is none: waiting for it could not move a clock (a float
        rounding of the refill), and a caller adding it to its clock would never get on.
        """
        self._refill(now)
        wait = 0.0 if self.tokens >= 0 else -self.tokens / self.rate
        return wait if wait >= MIN_DELAY else 0.0

    def allowance(self, now: float, mean_record: float, most: int) -> int:
        """Records the next read may take: what the tokens cover at ``mean_record`` bytes
        each, at least 1 and at most ``most``.
        """
        self._refill(now)
        if mean_record <= 0:
            return most
        return max(1, min(most, int(self.tokens / mean_record)))
