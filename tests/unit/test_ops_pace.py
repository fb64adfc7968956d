"""Token bucket and progress line of ``replicator restore`` (``replicator/ops/pace.py``)."""

from __future__ import annotations

import pytest

from replicator.ops.pace import Progress, TokenBucket, summary_lines


def test_bucket_grants_its_burst_then_paces_at_the_rate() -> None:
    b = TokenBucket(1000, now=0.0)
    assert b.take(1000, 0.0) == 0.0          # one second's burst, at once
    assert b.take(500, 0.0) == pytest.approx(0.5)
    assert b.take(500, 0.5) == pytest.approx(0.5)  # the first wait was paid; still behind


def test_bucket_long_run_rate_is_the_rate_whatever_the_request_sizes() -> None:
    b = TokenBucket(1_000_000, now=0.0)
    now = 0.0
    sent = 0
    for size in [10, 5_000_000, 1, 300_000, 2_000_000] * 4:
        now += b.take(size, now)
        sent += size
    # Sent ~29 MB at 1 MB/s: about 28 s after the 1 s burst.
    assert now == pytest.approx((sent - 1_000_000) / 1_000_000)


def test_bucket_refills_only_up_to_its_burst() -> None:
    b = TokenBucket(100, burst=100, now=0.0)
    assert b.take(100, 0.0) == 0.0
    assert b.take(100, 1000.0) == 0.0        # an hour idle buys one burst, not more
    assert b.take(100, 1000.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rate must be positive"):
        TokenBucket(0)


def test_progress_line_and_summary() -> None:
    p = Progress(est_records=1000, bytes_total=4000, started=10.0)
    assert "ETA --:--" in p.line(11.0)
    p.records, p.bytes_read, p.raw_bytes = 500, 1000, 2_000_000
    line = p.line(12.0)
    assert line.startswith("restored 500 records (~1,000 at most)")
    assert "1.0 MB/s" in line and "25%" in line and "ETA 0:00:06" in line
    p.gaps.append((3, 10, 19))
    p.resumed[1] = 42
    text = "\n".join(summary_lines(p, 12.0))
    assert "restored 500 records" in text and "partition 3 positions 10-19 (10)" in text
    assert "partition 1: resumed after offset 42" in text
