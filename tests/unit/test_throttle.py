"""The byte-rate limit (``replicator.core.throttle``) and egress's poll loop held to it."""

from __future__ import annotations

import itertools
import queue
from collections.abc import Sequence
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.commits import CommitService
from egress.flow import FlowLimits
from egress.poll_loop import CONSUME_BATCH, THROTTLED_POLL, PollLoop
from egress.segment import SegmentOutcome
from replicator.core.kafka import Fetched, TopicPartition
from replicator.core.throttle import TokenBucket
from tests.unit.egress.fakes import FakeMessage, Harness, records


def test_a_bucket_starts_full_goes_into_debt_and_refills_at_its_rate() -> None:
    b = TokenBucket(1000.0, now=0.0)
    assert b.delay(0.0) == 0
    b.take(3000, 0.0)                       # 2000 in debt
    assert b.delay(0.0) == pytest.approx(2.0)
    assert b.delay(1.5) == pytest.approx(0.5)
    assert b.delay(2.0) == 0
    assert b.allowance(10.0, mean_record=100, most=5) == 5      # full again, capped
    assert b.allowance(10.0, mean_record=400, most=50) == 2
    b.take(int(b.tokens) + 1, 10.0)          # a debt of one byte: 1 ms at this rate
    assert b.delay(10.0) == pytest.approx(0.001)
    b.take(0, 10.0 + 0.001 - 1e-12)          # what is left is a rounding, not a wait
    assert b.delay(10.0 + 0.001 - 1e-12) == 0
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(0, now=0.0)


@settings(max_examples=100, deadline=None)
@given(rate=st.sampled_from([1_000.0, 50_000.0, 1_000_000.0]),
       sizes=st.lists(st.integers(1, 20_000), min_size=1, max_size=50),
       seconds=st.integers(5, 60))
def test_a_reader_obeying_the_bucket_never_exceeds_rate_plus_one_burst_and_record(
        rate: float, sizes: list[int], seconds: int) -> None:
    # Records of cycling sizes read as fast as the bucket lets: over any run the bytes
    # read stay within rate * time + one burst + one read's overshoot, and a reader that
    # waits only as long as told reaches the rate within that margin.
    b = TokenBucket(rate, now=0.0)
    now, read, i = 0.0, 0, 0
    while now < seconds:
        wait = b.delay(now)
        if wait > 0:
            now += min(wait, 0.1)
            continue
        mean = sum(sizes) / len(sizes)
        for _ in range(b.allowance(now, mean, 100)):
            n = sizes[i % len(sizes)]
            i += 1
            b.take(n, now)
            read += n
        now += 0.01
    biggest = max(sizes) * 100             # the most one read can overshoot
    assert read <= rate * now + b.burst + biggest
    capacity = 100 * min(sizes) / 0.01     # what the reader could take without a limit
    if capacity >= 2 * rate:
        assert read >= rate * (now - 0.2) - biggest


class SizedConsumer:
    """Records of ``size`` bytes, as many as asked for, offsets counting up."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.next = 0
        self.asked: list[int] = []

    def fetch(self, n: int, timeout: float) -> Fetched:
        self.asked.append(n)
        recs = records(range(self.next, self.next + n), size=self.size)
        self.next += n
        return Fetched(runs={("t", 0): [FakeMessage(r) for r in recs]})

    def position(self, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
        return []

    def watermarks(self, tp: TopicPartition, *, cached: bool = False,
                   timeout: float = 10.0) -> tuple[int, int]:
        return (-1001, -1001)

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        pass

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        pass

    def commit(self, offsets: Sequence[TopicPartition]) -> dict[tuple[str, int], object]:
        return {}


def test_the_poll_loop_reads_at_the_configured_rate_and_still_polls_every_second() -> None:
    h = Harness()
    try:
        consumer = SizedConsumer(size=990)          # 1,000 raw bytes with its key
        loop = PollLoop(consumer, {("t", 0): h.writer}, CommitService(),  # type: ignore[arg-type]
                        queue.SimpleQueue[SegmentOutcome](), h.m, "r1",
                        FlowLimits.for_budget(10**12), lambda: h.now, lambda _now: None,
                        lambda _t, _p: Future())
        rate = 200_000
        loop.throttle = TokenBucket(rate, h.now)

        def sleep(seconds: float) -> None:
            h.now += seconds

        loop.sleep = sleep
        fetched_at: list[float] = []
        while h.now < 10.0:
            before = len(consumer.asked)
            loop.turn()
            if len(consumer.asked) > before:
                fetched_at.append(h.now)
            h.now += 0.0002                           # the loop's own time
        read = h.metrics.total("egress_bytes_total")
        assert read == pytest.approx(rate * h.now, rel=0.10)
        assert max(consumer.asked) < CONSUME_BATCH    # fetches sized to the tokens
        gaps = [b - a for a, b in itertools.pairwise(fetched_at)]
        assert max(gaps) <= THROTTLED_POLL + 0.2      # callbacks served every second
        # Most of the time the loop waited for tokens (it could go 5,000 times faster).
        assert h.metrics.total("egress_throttled_seconds_total") > 5
    finally:
        h.writer.discard_open()
        h.close()
