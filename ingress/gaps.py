"""A worker's gaps (``ingress.replay_state``'s ``LATE`` and ``LOST``): positions after the
checkpoint that no segment covers yet are late, waited for with reloads of the segment
list (their clock kept in the checkpoint across restarts), and declared lost after
``lost_segment_timeout``: ERROR with the exact range, metrics, a checkpoint past them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from ingress.checkpoint_writer import CheckpointWriter
from ingress.declared_lost import DeclaredLost
from ingress.inventory import SegmentInventory
from ingress.metrics import IngressMetrics
from ingress.planner import DeclareLost, LateGap, WaitLate
from ingress.progress import Progress
from replicator.core.settings import IngressSourceSettings
from replicator.core.wire import Checkpoint

log = logging.getLogger(__name__)


class Gaps:
    """The late gap of one worker, if any, and what is done about it (see the module)."""

    def __init__(self, source: IngressSourceSettings, inventory: SegmentInventory,
                 progress: Progress, writer: CheckpointWriter, declared_lost: DeclaredLost,
                 metrics: IngressMetrics, labels: dict[str, str], where: str) -> None:
        self.source = source
        self.inventory = inventory
        self.progress = progress
        self.writer = writer
        self.declared_lost = declared_lost
        self.metrics = metrics
        self.labels = labels
        self.where = where
        self.late: LateGap | None = None
        self._m_late = metrics.segments_late.labels(**labels)

    def resumed(self, cp: Checkpoint | None) -> None:
        """A session starts from ``cp``: a gap it records keeps its clock (``lost_segment_
        timeout`` counts from when it was first seen, not from this session's start).
        """
        self.late = None
        if cp is not None and cp.late is not None and cp.late[0] == cp.offset + 1:
            self.late = LateGap(cp.late[0], cp.late[0], cp.late[1])
            log.info("%s: positions from %d have been late since %s", self.where,
                     cp.late[0], cp.late[1].isoformat())

    def clear(self) -> None:
        """No gap any more (filled, declared lost, or another incarnation)."""
        self.late = None
        self._m_late.set(0)

    def filled(self, now: datetime) -> None:
        """A segment after the position is replayed: a late range arrived."""
        if self.late is not None:
            log.info("%s: late range %d-%d arrived after %.1fs", self.where,
                     self.late.first, self.late.last, (now - self.late.since).total_seconds())
            self.clear()

    def wait(self, action: WaitLate) -> Callable[[], None]:
        """The planner waits for a late gap: report it once, record when it was first seen
        in the checkpoint; returns what the wait's timer does (a full reload).
        """
        late = action.late
        if self.progress.position is None and (self.late is None
                                               or self.late.first != late.first):
            # Nothing replayed yet, so no checkpoint keeps the gap's clock across restarts:
            # the gap exists at least since the segment after it arrived in the bucket.
            after = [t for s, t in self.inventory.arrived.items()
                     if s.start == late.last + 1 and s in self.inventory.usable()]
            if after:
                late = replace(late, since=min(late.since, *after))
        if self.late is None or self.late.first != late.first:
            log.warning("%s: positions %d-%d are late (next segment starts at %d); reloading "
                        "the segment list with backoff for up to %s", self.where, late.first,
                        late.last, late.last + 1, self.source.lost_segment_timeout)
            self.metrics.late_gaps.labels(**self.labels).inc()
        self.late = late
        self._m_late.set(late.size)
        self.writer.late(late)

        def reload() -> None:
            self.inventory.reload(full=True)
            self.late = replace(late, reloads=late.reloads + 1)

        return reload

    def declare_lost(self, action: DeclareLost) -> None:
        """``lost_segment_timeout`` passed: the range is lost (ERROR with it, metrics, the
        checkpoint past it naming it).
        """
        log.error("%s: positions %d-%d (%d) declared LOST after %s: no segment covering them "
                  "arrived", self.where, action.first, action.last, action.size,
                  self.source.lost_segment_timeout)
        self.metrics.segments_lost.labels(**self.labels).inc()
        self.declared_lost.declared(action.first, action.last)
        self.metrics.messages_lost.labels(**self.labels).inc(action.size)
        following = min((s for s in self.inventory.usable() if s.start == action.last + 1),
                        key=lambda s: -s.end, default=None)
        self.writer.lost(action.first, action.last, following)
        self.clear()
