"""The poll loop's decisions around a partition writer: rewinds after a failed segment."""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import pytest

from egress.commits import CommitService
from egress.flow import FlowLimits
from egress.out_of_range import READ_PATIENCE, RETRY_DELAY, STALLED_AFTER
from egress.poll_loop import CONSUME_BATCH, TICK_INTERVAL, PollLoop, tick_interval
from egress.rotation import CloseReason
from egress.segment import SegmentOutcome
from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import Fetched, TopicPartition
from tests.unit.egress.fakes import FakeMessage, Harness, messages, records


class FakeConsumer:
    """Records seeks; ``seek_failures`` seeks raise first."""

    def __init__(self) -> None:
        self.seeks: list[TopicPartition] = []
        self.restarts: list[TopicPartition] = []
        self.seek_failures = 0
        self.stopped = False
        self.paused: list[TopicPartition] = []
        self.highs: dict[tuple[str, int], int] = {}
        """The high watermark the last fetch response gave of each partition (the cached
        ``watermarks``); unknown (-1001) when missing."""

    def seek(self, tp: TopicPartition) -> None:
        if self.stopped:
            raise KafkaRetriableError(f"seek {tp}: Local: Erroneous state")
        if self.seek_failures > 0:
            self.seek_failures -= 1
            raise KafkaRetriableError(f"seek {tp}: Local: Erroneous state")
        self.seeks.append(tp)

    def restart(self, tp: TopicPartition, others: Sequence[TopicPartition]) -> None:
        self.restarts.append(tp)
        self.seeks.append(tp)   # the same for most tests: where the partition reads next

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        self.paused.extend(tps)

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        pass

    def position(self, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
        return []

    def watermarks(self, tp: TopicPartition, *, cached: bool = False,
                   timeout: float = 10.0) -> tuple[int, int]:
        return (-1001, self.highs.get((tp.topic, tp.partition), -1001))


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


class LogStarts:
    """The log-start reads a loop starts: answered at once from ``h.low`` (an error when it
    is ``None``), or left unanswered while ``hang`` is set.
    """

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.hang = False
        self.asked: list[Future[int]] = []

    def __call__(self, topic: str, partition: int) -> Future[int]:
        f: Future[int] = Future()
        self.asked.append(f)
        if self.hang:
            return f
        if self.h.low is None:
            f.set_exception(KafkaRetriableError("no answer in time"))
        else:
            f.set_result(self.h.low)
        return f

    def outstanding(self) -> int:
        return sum(not f.done() for f in self.asked)


def loop_for(h: Harness, consumer: FakeConsumer, reads: LogStarts | None = None) -> PollLoop:
    outcomes: queue.SimpleQueue[SegmentOutcome] = queue.SimpleQueue()
    return PollLoop(consumer, {("t", 0): h.writer}, CommitService(),  # type: ignore[arg-type]
                    outcomes, h.m, "r1", FlowLimits.for_budget(10**9), lambda: h.now,
                    lambda _now: None, reads or LogStarts(h))


def fail_first_segment(h: Harness) -> None:
    h.store.fail["copy"] = 100
    h.writer.append(messages(records(range(3))), now=0.0)
    h.writer.close(CloseReason.COUNT)
    h.settle()
    h.store.fail["copy"] = 0
    assert h.writer.failed is not None


def test_a_failed_seek_keeps_the_partition_rewinding(h: Harness) -> None:
    fail_first_segment(h)
    consumer = FakeConsumer()
    consumer.seek_failures = 1
    loop = loop_for(h, consumer)
    h.now = 100.0
    loop._tick(h.now)
    # The seek failed: the partition is still waiting to rewind, and what the consumer
    # delivers from where it stands is dropped, never named from the old start.
    assert consumer.seeks == []
    assert h.writer.failed is not None and h.writer.failed.start == 0
    h.writer.append(messages(records(range(3, 6))), now=h.now)
    assert h.writer.segment is None
    # Retried later (backoff), the seek succeeds and the partition restarts at 0.
    h.now = 1000.0
    loop._tick(h.now)
    assert [(tp.partition, tp.offset) for tp in consumer.seeks] == [(0, 0)]
    assert h.writer.failed is None
    h.writer.append(messages(records(range(6))), now=h.now)
    h.writer.close(CloseReason.COUNT)
    h.settle()
    assert h.final_keys() == ["data/r1/t/0/0/00000000000000000000-00000000000000000005"]
    assert h.commits == [6]


def settle_log_start(loop: PollLoop, h: Harness) -> None:
    loop._tick(h.now)


def test_records_deleted_under_an_open_segment_are_reported_exactly(
        h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    consumer = FakeConsumer()
    loop = loop_for(h, consumer)
    h.writer.append(messages(records(range(51))), now=0.0)     # an open segment, 0..50
    # Retention deleted 51..149 before they were fetched: the broker answers "out of
    # range" for position 51 and the client stops the partition there.
    h.low = 150
    loop._dispatch(Fetched(out_of_range={("t", 0): 51}), 0.0)
    assert consumer.seeks == []                       # not before the log start is known
    with caplog.at_level(logging.ERROR):
        settle_log_start(loop, h)
    assert [(tp.partition, tp.offset) for tp in consumer.seeks] == [(0, 150)]
    assert h.metrics.total("egress_source_lost_messages_total") == 99
    assert "t[0]: offsets 51..149 (99 positions) were deleted at the source" in caplog.text
    assert len(loop.out_of_range) == 0
    # The segment goes on (the loss is reported here, once; ingress sees no gap).
    h.writer.append(messages(records(range(150, 160))), now=0.0)
    h.writer.close(CloseReason.COUNT)
    h.settle()
    assert h.final_keys() == ["data/r1/t/0/0/00000000000000000000-00000000000000000159"]
    assert h.commits == [160]


def test_the_log_start_is_read_again_until_it_is_known(h: Harness) -> None:
    consumer = FakeConsumer()
    loop = loop_for(h, consumer)
    h.writer.append(messages(records(range(10))), now=0.0)
    h.low = None                                       # the first read fails
    loop._dispatch(Fetched(out_of_range={("t", 0): 10}), 0.0)
    settle_log_start(loop, h)
    assert consumer.seeks == [] and ("t", 0) in loop.out_of_range
    h.low = 20
    settle_log_start(loop, h)                          # not before the retry delay
    assert consumer.seeks == []
    h.now += RETRY_DELAY
    settle_log_start(loop, h)                          # asked again
    settle_log_start(loop, h)                          # answered
    assert [tp.offset for tp in consumer.seeks] == [20]
    assert h.metrics.total("egress_source_lost_messages_total") == 10


def test_a_log_start_read_that_never_returns_is_asked_again(h: Harness) -> None:
    # A read that never answers (beyond the client's own deadline) must not keep the
    # partition stopped: after READ_PATIENCE it is abandoned and asked again, and only one
    # read per partition is ever outstanding.
    consumer = FakeConsumer()
    reads = LogStarts(h)
    loop = loop_for(h, consumer, reads)
    h.writer.append(messages(records(range(10))), now=0.0)
    reads.hang = True
    loop._dispatch(Fetched(out_of_range={("t", 0): 10}), 0.0)
    for _ in range(3):                                  # the same event again: no new read
        loop._dispatch(Fetched(out_of_range={("t", 0): 10}), 0.0)
    h.low = 20
    loop._tick(1.0)
    assert consumer.seeks == [] and ("t", 0) in loop.out_of_range
    assert len(reads.asked) == 1
    reads.hang = False
    h.now = 1.0 + READ_PATIENCE + 1
    loop._tick(h.now)                                   # abandoned, asked again: answered
    settle_log_start(loop, h)
    assert len(reads.asked) == 2
    assert [tp.offset for tp in consumer.seeks] == [20]
    assert h.metrics.total("egress_source_lost_messages_total") == 10
    assert h.metrics.total("egress_log_start_read_failures_total") == 1


def test_a_partition_whose_log_start_stays_unknown_is_reported_stalled_then_recovers(
        h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    consumer = FakeConsumer()
    reads = LogStarts(h)
    loop = loop_for(h, consumer, reads)
    h.writer.append(messages(records(range(10))), now=0.0)
    reads.hang = True
    loop._dispatch(Fetched(out_of_range={("t", 0): 10}), 0.0)
    stalled = h.m.log_start_stalled.labels("r1")
    with caplog.at_level(logging.WARNING):
        while h.now < STALLED_AFTER - 1:
            h.now += 1.0
            loop._tick(h.now)
        assert stalled._value.get() == 0 and loop.out_of_range.stalled == 0
        for _ in range(5):
            h.now += 1.0
            loop._tick(h.now)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors                     # once, not every tick
    assert "t[0]: stopped at offset 10" in errors[0] and "ListOffsets" in errors[0]
    assert stalled._value.get() == 1 and loop.out_of_range.stalled == 1
    assert reads.outstanding() <= 1
    assert consumer.seeks == []
    # The source answers again: the partition goes on by itself and the stall ends.
    reads.hang, h.low = False, 20
    h.now += READ_PATIENCE + 1
    loop._tick(h.now)
    loop._tick(h.now)
    assert [tp.offset for tp in consumer.seeks] == [20]
    assert stalled._value.get() == 0 and len(loop.out_of_range) == 0


def test_an_out_of_range_event_of_a_new_assignment_replaces_a_stale_entry(h: Harness) -> None:
    # The partition was released and assigned back while its first writer's read was
    # pending; the new writer's event must start its own read, and the old read finishing
    # must not end the new writer's wait without a restart (the partition would never be
    # fetched again: no ERROR, lag frozen).
    from egress.partition_writer import PartitionWriter

    consumer = FakeConsumer()
    reads = LogStarts(h)
    loop = loop_for(h, consumer, reads)
    reads.hang = True
    loop._dispatch(Fetched(out_of_range={("t", 0): 10}), 0.0)
    old = reads.asked[0]
    second = PartitionWriter(h.writer.ref, h.limits, 10, ctx=h.ctx,
                             metrics=h.m.for_partition("r1", "t", 0), commit=h._commit)
    loop.writers[("t", 0)] = second                     # released, assigned again
    loop._dispatch(Fetched(out_of_range={("t", 0): 10}), 0.0)
    assert len(reads.asked) == 2
    assert old.cancelled()                              # the stale read is dropped unused
    loop._tick(1.0)
    assert consumer.seeks == [] and ("t", 0) in loop.out_of_range
    reads.asked[1].set_result(20)
    loop._tick(2.0)
    assert [tp.offset for tp in consumer.seeks] == [20]
    assert len(loop.out_of_range) == 0


def test_release_and_loss_drop_the_entry(h: Harness) -> None:
    consumer = FakeConsumer()
    reads = LogStarts(h)
    loop = loop_for(h, consumer, reads)
    reads.hang = True
    loop._dispatch(Fetched(out_of_range={("t", 0): 10}), 0.0)
    h.now = STALLED_AFTER + 1
    loop._tick(h.now)
    assert loop.out_of_range.stalled == 1
    loop.forget([("t", 0)])
    assert len(loop.out_of_range) == 0
    assert h.m.log_start_stalled.labels("r1")._value.get() == 0


def test_a_position_beyond_the_log_closes_the_segment_and_restarts(h: Harness) -> None:
    # The source partition was recreated: the position is above its end, nothing was lost
    # that egress can name; the open segment closes and the next one starts at the
    # first record.
    consumer = FakeConsumer()
    loop = loop_for(h, consumer)
    h.writer.append(messages(records(range(30))), now=0.0)
    h.low = 0
    loop._dispatch(Fetched(out_of_range={("t", 0): 30}), 0.0)
    settle_log_start(loop, h)
    assert [tp.offset for tp in consumer.seeks] == [0]
    h.writer.append(messages(records(range(5))), now=0.0)
    h.writer.close(CloseReason.COUNT)
    h.settle()
    assert h.final_keys() == ["data/r1/t/0/0/00000000000000000000-00000000000000000004",
                              "data/r1/t/0/0/00000000000000000000-00000000000000000029"]
    assert h.metrics.total("egress_source_lost_messages_total") == 0


def test_a_partition_stopped_out_of_range_while_failed_is_restarted_by_the_rewind(
        h: Harness) -> None:
    # The position left the log, then a segment failed: the client refuses seeks on the
    # stopped partition, so the rewind must assign it again (or it would retry forever).
    consumer = FakeConsumer()
    loop = loop_for(h, consumer)
    h.low = 0
    loop._dispatch(Fetched(out_of_range={("t", 0): 3}), 0.0)
    consumer.stopped = True
    fail_first_segment(h)
    h.now = 100.0
    loop._tick(h.now)
    assert [(tp.partition, tp.offset) for tp in consumer.restarts] == [(0, 0)]
    assert h.writer.failed is None and len(loop.out_of_range) == 0


def test_ticks_space_out_with_many_partitions() -> None:
    # A tick walks every writer: with 1,000 partitions a 20 ms tick took a third of the poll
    # thread, so the interval grows with the partition count (age rotations wait that long).
    assert tick_interval(0) == tick_interval(64) == TICK_INTERVAL
    assert tick_interval(1000) == pytest.approx(0.1)
    assert tick_interval(10_000) == pytest.approx(1.0)


@pytest.mark.parametrize("native", [0, 600_000])
def test_arrow_allocations_count_against_the_memory_budget(h: Harness, native: int) -> None:
    # The Parquet encoders' pages are held by no segment: the loop charges what Arrow's
    # pools hold (egress.allocators.arrow_allocated_bytes), so the same open segment
    # fits the budget alone and is closed early when the encoders hold the rest.
    outcomes: queue.SimpleQueue[SegmentOutcome] = queue.SimpleQueue()
    h.writer.append(messages(records(range(500))), now=0.0)   # below the 1000-count limit
    held = h.writer.held_bytes()[0]
    assert 0 < held < 1_000_000
    loop = PollLoop(FakeConsumer(), {("t", 0): h.writer}, CommitService(),  # type: ignore[arg-type]
                    outcomes, h.m, "r1", FlowLimits.for_budget(held + 500_000),
                    lambda: h.now, lambda _now: None, LogStarts(h),
                    native_bytes=lambda: native)
    loop._apply_memory_budget([h.writer])
    closed = h.writer.segment is None
    assert closed == (native > 0)
    if closed:
        assert h.writer.closing[0].reason is CloseReason.MEMORY
    assert h.m.buffered.labels("r1")._value.get() >= held + native
    h.settle()


def test_arrow_bytes_alone_never_keep_the_process_paused(h: Harness) -> None:
    # Nothing to close: pausing would never end (no segment could free anything).
    outcomes: queue.SimpleQueue[SegmentOutcome] = queue.SimpleQueue()
    loop = PollLoop(FakeConsumer(), {("t", 0): h.writer}, CommitService(),  # type: ignore[arg-type]
                    outcomes, h.m, "r1", FlowLimits.for_budget(10**6),
                    lambda: h.now, lambda _now: None, LogStarts(h),
                    native_bytes=lambda: 2 * 10**6)
    loop._apply_memory_budget([h.writer])
    assert not loop.memory_paused
    h.writer.append(messages(records(range(10))), now=0.0)
    loop._apply_memory_budget([h.writer])
    assert loop.memory_paused           # a segment to close: paused until it is durable


def test_each_tick_gives_writers_the_flush_size_of_the_partition_count(h: Harness) -> None:
    from egress.flow import flush_bytes

    outcomes: queue.SimpleQueue[SegmentOutcome] = queue.SimpleQueue()
    budget = 64 * 1024**2
    loop = PollLoop(FakeConsumer(), {("t", 0): h.writer}, CommitService(),  # type: ignore[arg-type]
                    outcomes, h.m, "r1", FlowLimits.for_budget(budget),
                    lambda: h.now, lambda _now: None, LogStarts(h))
    for p in range(1, 64):
        loop.writers[("t", p)] = h.writer   # the count is what matters
    loop._tick(0.0)
    assert h.writer.flush_bytes == flush_bytes(budget, 64) < 4 * 1024**2


class PositionConsumer(FakeConsumer):
    def __init__(self, position: int) -> None:
        super().__init__()
        self.at = position

    def position(self, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.at) for tp in tps]


def test_tails_say_where_the_records_end_before_the_consumer_position(h: Harness) -> None:
    # Records 0-2 appended; the consumer read on past a commit marker at 3: position 4.
    h.writer.append(messages(records(range(3))), now=0.0)
    loop = loop_for(h, PositionConsumer(4))
    loop._update_gauges([h.writer])
    assert loop.tails == {("t", 0): (3, 4)}
    # A failed segment drops what the consumer delivers until its rewind: no claim then.
    fail_first_segment(h)
    loop._update_gauges([h.writer])
    assert loop.tails == {}


class FetchingConsumer(FakeConsumer):
    """Returns one prepared run per fetch and records how many records each asked for."""

    def __init__(self, runs: list[list[FakeMessage]]) -> None:
        super().__init__()
        self.runs = runs
        self.asked: list[int] = []

    def fetch(self, max_messages: int, timeout: float) -> Fetched:
        self.asked.append(max_messages)
        run = self.runs.pop(0)[:max_messages] if self.runs else []
        return Fetched(runs={("t", 0): run}) if run else Fetched()  # type: ignore[dict-item]


@pytest.mark.parametrize(("size", "most"), [(4 * 1024**2, 4), (10, CONSUME_BATCH)])
def test_a_fetch_of_large_records_takes_no_more_than_the_room_left(
        h: Harness, size: int, most: int) -> None:
    # A 20 MiB budget, one record of 4 MiB held: the next fetch asks for at most the
    # records that fit the 16 MiB left. Small records are never fetched one by one. The
    # first fetch, before any record's size is known, takes one: asked for CONSUME_BATCH,
    # librdkafka keeps gathering records for the whole poll timeout (a starved loop's first
    # fetch brought four records of 8 MiB against a share of 19 MiB).
    consumer = FetchingConsumer([messages(records([0], size)), messages(records([1], size))])
    loop = PollLoop(consumer, {("t", 0): h.writer}, CommitService(),  # type: ignore[arg-type]
                    queue.SimpleQueue(), h.m, "r1", FlowLimits.for_budget(20 * 1024**2),
                    lambda: h.now, lambda _now: None, LogStarts(h))
    loop.turn()
    loop.turn()
    assert consumer.asked[0] == 1
    assert 1 <= consumer.asked[1] <= most
    assert consumer.asked[1] == most or size > CONSUME_BATCH
