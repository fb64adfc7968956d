"""Pure decisions of the egress: when a segment closes and where a segment starts (flow
control, the memory budget and pauses, is next door in ``egress.flow``).

Nothing here touches Kafka, S3 or a clock: callers pass ``now`` and the numbers, so every
rule has a fast unit test (``tests/unit/egress/test_rotation.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from replicator.core.settings import EgressTopicSettings


class CloseReason(StrEnum):
    """Why a segment was closed (the ``reason`` label of the segment metrics)."""

    SIZE = "size"
    COUNT = "count"
    AGE = "age"
    MEMORY = "memory"
    REVOKE = "revoke"
    SHUTDOWN = "shutdown"
    RESET = "reset"
    """The source partition was truncated or recreated under the open segment."""


@dataclass(frozen=True)
class SegmentLimits:
    """Thresholds of one topic's segments (from ``[egress.topics."name"]``)."""

    max_messages: int
    max_bytes: int
    max_age: float
    """Seconds since the segment's first message."""

    @classmethod
    def from_settings(cls, topic: EgressTopicSettings) -> SegmentLimits:
        return cls(topic.max_segment_messages, topic.max_segment_size,
                   topic.max_segment_age.total_seconds())


@dataclass(frozen=True)
class SegmentStats:
    """What rotation looks at in an open segment."""

    count: int
    raw_bytes: int
    first_message_at: float | None
    """Clock reading (``time.monotonic``-like) when the first message was appended."""


def should_rotate(stats: SegmentStats, limits: SegmentLimits, now: float) -> CloseReason | None:
    """The reason to close a segment now, or ``None`` to keep it open.

    An empty segment never closes. Count wins over size, size over age, so a segment that
    reaches several limits in one batch reports the one that is exact (count).
    """
    if stats.count <= 0:
        return None
    if stats.count >= limits.max_messages:
        return CloseReason.COUNT
    if stats.raw_bytes >= limits.max_bytes:
        return CloseReason.SIZE
    if stats.first_message_at is not None and now - stats.first_message_at >= limits.max_age:
        return CloseReason.AGE
    return None


def room_for(stats: SegmentStats, limits: SegmentLimits) -> int:
    """How many more messages the segment takes before the count limit closes it."""
    return max(0, limits.max_messages - stats.count)


# --- where segments start -------------------------------------------------------------


@dataclass(frozen=True)
class StartDecision:
    """Where the next segment starts, and what the source lost before it.

    Attributes:
        start: the segment's start position (its key's ``start``).
        lost: inclusive offset range deleted at the source (retention) before it was read,
            or ``None``.
        reset: the first message lies *before* the expected position: the source
            partition was truncated or recreated; the segment starts at the message.
    """

    start: int
    lost: tuple[int, int] | None = None
    reset: bool = False


def decide_start(expected: int | None, first_offset: int,
                 low_watermark: int | None = None) -> StartDecision:
    """Name the start of a segment whose first message has offset ``first_offset``.

    ``expected`` is the position the partition resumed from (the committed offset at
    assignment, the previous segment's end + 1, or the rewind point after a failure), or
    ``None`` when the group has no commit for the partition.

    * No expected position: the segment starts at the first message
      (docs/architecture.md, "S3 layout").
    * The message is at or after the expected position: the segment starts at the expected
      position, so consecutive segments touch even across offset holes (transaction
      markers, aborted or compacted-away records).
    * Records between the expected position and the source's log start (``low_watermark``)
      were deleted by retention before egress read them: real loss, reported as
      ``lost``. The segment *still* starts at the expected position. Starting it after the
      hole would leave a gap between segments, and ingress would wait
      ``lost_segment_timeout`` for a segment that can never come and then declare the same
      range lost a second time; the loss is known here, exactly, so it is logged and
      counted once, here.
    * The message is before the expected position (the topic was recreated or truncated):
      start at the message and flag ``reset``.
    """
    if expected is None:
        return StartDecision(first_offset)
    if first_offset < expected:
        return StartDecision(first_offset, reset=True)
    lost = None
    if first_offset > expected and low_watermark is not None and low_watermark > expected:
        lost = (expected, min(low_watermark, first_offset) - 1)
    return StartDecision(expected, lost)
