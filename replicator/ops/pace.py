"""Pacing and progress of a long operator command (``replicator restore``): a token bucket
for ``--rate`` and the progress line, both pure (the clock is passed in).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replicator.core.units import format_size


class TokenBucket:
    """Limits bytes per second: ``take(n, now)`` says how long to wait before sending ``n``.

    Tokens refill at ``rate`` per second up to ``burst`` (one second's worth by default). A
    request larger than what is left is granted at once and paid for by waiting: the bucket
    goes negative and the wait is the time to refill it to zero, so the long-run rate is
    ``rate`` whatever the request sizes.
    """

    def __init__(self, rate: float, burst: float | None = None, *, now: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate)
        self._tokens = self.burst
        self._at = now

    def take(self, n: float, now: float) -> float:
        """Spend ``n`` tokens at time ``now``; returns the seconds to wait before sending."""
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = max(self._at, now)
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


@dataclass
class Progress:
    """Counts of a running restore and the one-line view of them.

    ``est_records`` is an upper bound (offset positions); the ETA uses bytes read of the
    segments, which is exact.
    """

    est_records: int
    bytes_total: int
    started: float
    records: int = 0
    bytes_read: int = 0
    raw_bytes: int = 0
    skipped: int = 0
    """Records of the offset range outside the time bounds."""
    resumed: dict[int, int] = field(default_factory=dict)
    """Partition → the offset an earlier run's checkpoint had reached."""
    gaps: list[tuple[int, int, int]] = field(default_factory=list)

    def line(self, now: float) -> str:
        """``records  MB/s  ETA`` for the terminal."""
        elapsed = max(1e-6, now - self.started)
        rate = self.raw_bytes / elapsed
        done = min(1.0, self.bytes_read / self.bytes_total) if self.bytes_total else 1.0
        eta = "--:--" if done <= 0 else _clock(elapsed * (1 - done) / done)
        return (f"restored {self.records:,} records (~{self.est_records:,} at most)  "
                f"{rate / 1e6:.1f} MB/s  {done:.0%}  ETA {eta}")


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def summary_lines(p: Progress, now: float) -> list[str]:
    """The end-of-run summary."""
    elapsed = max(1e-6, now - p.started)
    out = [f"restored {p.records:,} records ({format_size(p.raw_bytes)} of keys, values and "
           f"headers) in {elapsed:.1f}s ({p.raw_bytes / elapsed / 1e6:.1f} MB/s)",
           f"read {format_size(p.bytes_read)} of segments"]
    out += [f"partition {part}: resumed after offset {off} (an earlier run's checkpoint)"
            for part, off in sorted(p.resumed.items())]
    if p.skipped:
        out.append(f"skipped {p.skipped:,} records of the offset range outside the time "
                   "bounds")
    out += [f"GAP skipped: partition {part} positions {a}-{b} ({b - a + 1})"
            for part, a, b in p.gaps]
    return out
