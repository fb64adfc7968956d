"""The poll loop's decisions around a partition writer: rewinds after a failed segment."""

from __future__ import annotations

import queue
from collections.abc import Iterator, Sequence

import pytest

from egress.commits import CommitService
from egress.flow import FlowLimits
from egress.poll_loop import PollLoop
from egress.rotation import CloseReason
from egress.segment import SegmentOutcome
from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import TopicPartition
from tests.unit.egress.fakes import Harness, messages, records


class FakeConsumer:
    """Records seeks; ``seek_failures`` seeks raise first."""

    def __init__(self) -> None:
        self.seeks: list[TopicPartition] = []
        self.seek_failures = 0
        self.paused: list[TopicPartition] = []

    def seek(self, tp: TopicPartition) -> None:
        if self.seek_failures > 0:
            self.seek_failures -= 1
            raise KafkaRetriableError(f"seek {tp}: Local: Erroneous state")
        self.seeks.append(tp)

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        self.paused.extend(tps)

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        pass

    def position(self, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
        return []

    def watermarks(self, tp: TopicPartition, *, cached: bool = False,
                   timeout: float = 10.0) -> tuple[int, int]:
        return (-1001, -1001)


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def loop_for(h: Harness, consumer: FakeConsumer) -> PollLoop:
    outcomes: queue.SimpleQueue[SegmentOutcome] = queue.SimpleQueue()
    return PollLoop(consumer, {("t", 0): h.writer}, CommitService(),  # type: ignore[arg-type]
                    outcomes, h.m, "r1", FlowLimits.for_budget(10**9), lambda: h.now,
                    lambda _now: None)


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
