"""A partition writer's failure path: a segment that could not be made durable breaks
the partition (``outcome``), which waits out its backoff and its queued tasks
(``ready_to_rewind``), has the consumer seeked (``rewind_offset``, ``seek_failed``) and
forgets everything after the failed segment (``rewind``).

``WriterRewind`` is a part of ``egress.partition_writer.PartitionWriter`` (the attributes and
the methods it names are the writer's), kept apart so that each module stays small.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from egress.epoch_ids import EpochIds
from egress.metrics import PartitionMetrics
from egress.segment import Segment, SegmentOutcome, SegmentState
from egress.writer_context import WriterContext
from replicator.core.kafka import OFFSET_BEGINNING
from replicator.core.queues import SerialQueue

# The writer's logger: these lines keep the logger name they had before this part moved
# out of egress/partition_writer.py (operators filter on it; docs/runbooks.md shows it).
log = logging.getLogger("egress.partition_writer")


class WriterRewind:
    """The failure path of ``egress.partition_writer.PartitionWriter`` (a part of it)."""

    ctx: WriterContext
    metrics: PartitionMetrics
    name: str
    closing: list[Segment]
    queue: SerialQueue
    broken: threading.Event
    failed: Segment | None
    failures: int
    retry_at: float
    expected: int | None
    next_offset: int | None
    position: int | None
    committed_offset: int | None
    resumed: bool
    epoch: int
    ids: EpochIds
    _epoch_starts: dict[int, int]
    _switch_to: str | None

    if TYPE_CHECKING:
        # The writer's: declared for the type checker only, so that no stub here can
        # shadow them in the writer's method order.
        def discard_open(self) -> None: ...

    def outcome(self, o: SegmentOutcome, now: float) -> None:
        """Apply a worker's report (poll thread)."""
        if o.segment in self.closing:
            self.closing.remove(o.segment)
        if o.state is SegmentState.COMMITTED:
            self.failures = 0
            self.committed_offset = max(o.segment.commit_to, self.committed_offset or 0)
        elif o.state is SegmentState.FAILED and self.failed is None:
            self.failures += 1
            self.failed = o.segment
            delay = self.ctx.retry_policy.nominal_delay(self.failures - 1)
            self.retry_at = now + delay
            self.discard_open()
            for s in self.closing:
                s.state = SegmentState.ABORTED
            log.warning("%s: segment from %d could not be made durable (%s: %s); rewinding "
                        "to %d in %.1fs", self.name, o.segment.start, o.step, o.error,
                        o.segment.start, delay)

    def ready_to_rewind(self, now: float) -> bool:
        """A failed segment waits out its backoff and every queued task before the seek."""
        return self.failed is not None and now >= self.retry_at and self.queue.idle

    def rewind_offset(self) -> int:
        """Where the consumer must seek before ``rewind``: the failed segment's start (the
        new topic's oldest record after a switch; where the current epoch began when the
        failed segment is from before a reset).
        """
        assert self.failed is not None
        if self._switch_to is not None:
            return OFFSET_BEGINNING
        if self.failed.epoch < self.epoch:
            # Its records left the log with a reset after it: read the log again where the
            # current epoch began (``rewind`` reports them lost).
            return self._epoch_starts.get(self.epoch, OFFSET_BEGINNING)
        return self.failed.start

    def seek_failed(self, now: float) -> float:
        """The seek to ``rewind_offset`` failed: stay failed and wait before the next try.

        Returns:
            The delay in seconds before ``ready_to_rewind`` is true again.
        """
        self.failures += 1
        delay = self.ctx.retry_policy.nominal_delay(self.failures - 1)
        self.retry_at = now + delay
        return delay

    def rewind(self) -> int:
        """Forget everything after the failed segment once the consumer has been seeked to
        ``rewind_offset``; returns that offset.
        """
        assert self.failed is not None
        failed = self.failed
        start = self.rewind_offset()
        self.failed = None
        switch, self._switch_to = self._switch_to, None
        if switch is None:
            # Segments from before a reset (the topic recreated or truncated under them):
            # their records are no longer in the log, so seeking back to them would read
            # the new log's records at those offsets instead (or nothing): lost.
            for g in (failed, *self.closing):
                if g.epoch < self.epoch:
                    log.error("%s: offsets %d..%d (%d records, read before the source "
                              "partition went back) could not be made durable and are no "
                              "longer in the source log: lost", self.name, g.start, g.end,
                              g.count)
                    self.metrics.lost.inc(g.count)
        self.closing.clear()
        if switch is not None:
            # The new topic from its oldest record, a new epoch of its id (never a resume
            # of the earlier topic's positions).
            self.epoch += 1
            self.ids.record(self.epoch, switch)
            self.expected = self.next_offset = self.position = None
            self.committed_offset = None
            self.resumed = False
            self.broken.clear()
            return OFFSET_BEGINNING
        if start == OFFSET_BEGINNING:
            self.expected = self.next_offset = self.position = None
            self.broken.clear()
            return start
        self.expected = start
        self.next_offset = start
        self.position = start
        self.broken.clear()
        return start
