"""One segment of a partition, from its first message until it is committed or aborted,
and what a worker reports about it (``SegmentOutcome``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from egress.columns import ColumnBuffer
from egress.rotation import CloseReason, SegmentStats
from formats.segment_io import SegmentUpload
from replicator.core.keys import SegmentKey

if TYPE_CHECKING:
    from egress.partition_writer import PartitionWriter


class SegmentState(StrEnum):
    """Where a segment is in its life."""

    OPEN = "open"
    CLOSING = "closing"
    COMMITTED = "committed"
    ABORTED = "aborted"
    FAILED = "failed"


class Segment:
    """One segment of a partition, from its first message until it is committed or aborted.

    The poll thread owns ``count``/``raw_bytes``/``end``/``columns``/``submitted``; the worker
    owns ``upload`` and ``written``. ``held_bytes`` reads both (plain int reads).
    """

    def __init__(self, start: int, first_at: float) -> None:
        self.start = start
        self.end = start - 1
        self.count = 0
        self.raw_bytes = 0
        self.first_at = first_at
        self.columns = ColumnBuffer()
        self.submitted = 0
        self.written = 0
        self.upload: SegmentUpload | None = None
        self.state = SegmentState.OPEN
        self.reason: CloseReason | None = None
        self.stored_bytes = 0
        self.commit_to = start
        """The offset committed once durable: ``end + 1``, or past the skipped records
        after it (set at close)."""
        self.epoch = 0
        """The writer's incarnation epoch when the segment opened (``PartitionWriter``)."""
        self.largest_row = 0
        """Bytes of the largest key plus the largest value written so far (worker)."""

    def stats(self) -> SegmentStats:
        return SegmentStats(self.count, self.raw_bytes, self.first_at)

    def held_bytes(self) -> int:
        """Memory held: column lists, batches not yet encoded, writer and upload buffers."""
        held = self.columns.held_bytes + (self.submitted - self.written)
        u = self.upload
        if u is not None:
            held += u.buffered_bytes
        return held

    @property
    def temp_key(self) -> str | None:
        return self.upload.temp_key if self.upload is not None else None

    def backlog_bytes(self) -> int:
        """Batches handed to the worker and not yet encoded."""
        return self.submitted - self.written


@dataclass(frozen=True)
class SegmentOutcome:
    """What a worker reports about a segment (drained by the poll thread)."""

    writer: PartitionWriter
    segment: Segment
    state: SegmentState
    key: SegmentKey | None = None
    error: BaseException | None = None
    step: str = ""
