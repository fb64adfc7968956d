"""Where a worker's replay continues from when it has no checkpoint yet: the partition's
recorded first position (``ingress.first_position``), ``start = "latest"`` (the history
the bucket holds is skipped, once per worker), or, when egress records none, the earliest
segment known after ``first_segment_delay``; and the positions below that start reported
once when their segments arrive late.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Literal

from formats.segment_io import read_footer
from ingress.checkpoint_writer import CheckpointWriter
from ingress.first_position import PENDING, FirstPosition
from ingress.incarnations import IncarnationTracker
from ingress.inventory import SegmentInventory
from ingress.metrics import IngressMetrics
from ingress.progress import Progress
from replicator.core.errors import ReplicatorError
from replicator.core.keys import SegmentKey
from replicator.core.settings import IngressSourceSettings

log = logging.getLogger(__name__)


class StartPoint:
    """The start decisions of one worker (see the module)."""

    def __init__(self, source: IngressSourceSettings, first: FirstPosition,
                 inventory: SegmentInventory, progress: Progress, writer: CheckpointWriter,
                 metrics: IngressMetrics, labels: dict[str, str], where: str) -> None:
        self.source = source
        self.first = first
        self.inventory = inventory
        self.progress = progress
        self.writer = writer
        self.metrics = metrics
        self.labels = labels
        self.where = where
        self.first_seen: datetime | None = None
        """When the earliest segment known was first seen (``first_segment_delay``)."""
        self.latest_pending = source.start == "latest"
        """``start = "latest"``, no checkpoint, and the bucket's history not looked at yet
        (``plan_from``): decided once per worker, at its first plan."""
        self.latest_decision: SegmentKey | int | None = None
        """What that decision checkpoints until it is durable (a later session of the
        worker delivers it again): the newest segment skipped, or the first position
        replayed from when there was nothing to skip."""
        self.history_skipped = source.start == "latest"
        """Positions below ``origin`` were skipped by choice (``start = "latest"``), not
        missed: ``report_below_origin`` leaves them alone."""
        self.pending_logged = False
        self.meta_older_logged = False
        self._created: dict[SegmentKey, datetime | None] = {}

    def plan_from(self, usable: set[SegmentKey], now: datetime
                  ) -> int | Literal["pending"] | None:
        """The position the planner continues after: the checkpoint; without one, the
        position before the partition's recorded first one (a late first segment is then
        a gap like any other, lost only after lost_segment_timeout); ``None`` when egress
        records none (first_segment_delay); ``PENDING`` while its entry is not there yet
        (for at most ``first_segment_delay`` once the partition has segments:
        ``_first_position_overdue``). With ``start = "latest"`` and no checkpoint, the
        history the bucket holds at the worker's first plan is skipped first
        (``_start_latest`` checkpoints the newest segment's end); with none there, the
        partition is replayed from its first position like any other.
        """
        progress = self.progress
        if progress.position is None and self.source.start == "latest":
            self._decide_latest(usable)
        if progress.position is not None:
            return progress.position
        first = self.first.get()
        if first == PENDING and not self._first_position_overdue(usable, now):
            return PENDING
        if isinstance(first, int):
            if progress.origin is None:
                progress.origin = first
            if self.source.start == "latest" and not self.history_skipped and first > 0:
                # Nothing was there to skip: keep that choice across restarts.
                self.latest_decision = first
                self.writer.history_begins(first)
                return progress.position
            return first - 1
        return None

    def latest_incarnation(self, tracker: IncarnationTracker, usable: set[SegmentKey]
                           ) -> None:
        """``start = "latest"`` without a checkpoint (before the incarnation is chosen):
        the history of every incarnation in the bucket is skipped, not only the current
        one's (``IncarnationTracker.skip_to_newest``); a decision delivered again (its
        checkpoint not durable yet) returns to the incarnation it was made in.
        """
        if self.progress.position is not None or self.source.start != "latest":
            return
        decided = self.latest_decision
        if isinstance(decided, SegmentKey):
            tracker.label = decided.incarnation
        elif self.latest_pending and usable:
            skipped = tracker.skip_to_newest(usable)
            if skipped:
                self.metrics.messages_skipped.labels(**self.labels).inc(skipped)

    def _decide_latest(self, usable: set[SegmentKey]) -> None:
        """``start = "latest"`` without a checkpoint: decided at the worker's first plan,
        and delivered again by a later session until its checkpoint is durable (a failed
        transaction must not turn the skip into a replay).
        """
        decided = self.latest_decision
        if isinstance(decided, SegmentKey):
            self.progress.origin = decided.end + 1
            self.writer.latest_start(decided)
        elif isinstance(decided, int):
            self.writer.history_begins(decided)
        elif self.latest_pending:
            self.latest_pending = False
            if usable:
                self._start_latest(usable)
            else:
                # Nothing in the bucket yet: there is no history to skip, and everything
                # that arrives from now on is replayed from the partition's first position
                # (checkpointed once it is known: ``plan_from``).
                log.info("%s: start = latest: the bucket holds no segment of the partition "
                         "yet; replay starts at its first position", self.where)
                self.history_skipped = False

    def _start_latest(self, usable: set[SegmentKey]) -> None:
        """``start = "latest"``, no checkpoint: skip the history the bucket holds now (an
        explicit choice: WARNING with the range, ``messages_skipped``) and checkpoint its
        end at once, so a restart resumes there instead of skipping further.
        """
        newest = max(usable, key=lambda s: (s.end, -s.start))
        first = min(s.start for s in usable)
        recorded = self.first.get()
        if isinstance(recorded, int):
            # Segments of the history still replicating (below the earliest one here) are
            # skipped too: counted from where egress's history begins.
            first = min(first, recorded)
        log.warning("%s: start = latest: positions %d-%d (%d) already in the bucket are "
                    "skipped; replay starts at %d", self.where, first, newest.end,
                    newest.end - first + 1, newest.end + 1)
        self.metrics.messages_skipped.labels(**self.labels).inc(newest.end - first + 1)
        self.progress.origin = newest.end + 1
        self.latest_decision = newest
        self.writer.latest_start(newest)

    def _first_position_overdue(self, usable: set[SegmentKey], now: datetime) -> bool:
        """True once the partition's segments have been in the bucket for
        ``first_segment_delay`` and egress still has not recorded where its history begins
        (an egress of a release that left it out, a lost ``_topic.json`` write): one
        ERROR, and the replay goes on as without first positions (from the earliest
        segment known; one arriving later below it is reported as not replayed). Egress
        records the entry before a partition's first segment is visible, so waiting longer
        than S3 takes to replicate ``_topic.json`` waits for nothing.
        """
        if not usable:
            return False
        arrived = [t for s, t in self.inventory.arrived.items() if s in usable]
        since = min(arrived) if arrived else now
        delay = self.source.first_segment_delay
        if now < since + delay:
            return False
        if now < since + self.source.lost_segment_timeout \
                and (self._meta_absent() or self._meta_predates(usable)):
            return False
        first = min(s.start for s in usable)
        log.error("%s: egress has not recorded where this partition's history begins "
                  "(first_positions in _topic.json) although its segments have been in the "
                  "bucket since %s; after first_segment_delay (%s) the replay starts at the "
                  "earliest segment known, position %d (a segment arriving later below it "
                  "is reported as NOT replayed)", self.where, since.isoformat(), delay, first)
        self.first.give_up()
        self.first_seen = since
        self.pending_logged = False
        return True

    def _meta_absent(self) -> bool:
        """No ``_topic.json`` here although the partition has segments: egress writes it
        before any segment, so it is still replicating (the low-RPO mirror's copies, or S3
        replication out of order, can bring segments first). Deciding a start without it
        would take the earliest segment known for the partition's first (a dropped first
        copy then reads as NOT replayed), so the wait goes on, up to
        ``lost_segment_timeout``.
        """
        if not self.first.absent:
            return False
        if not self.meta_older_logged:
            log.warning("%s: the partition has segments but there is no _topic.json yet: "
                        "waiting for it (at most lost_segment_timeout, %s) before deciding "
                        "where the replay starts", self.where,
                        self.source.lost_segment_timeout)
            self.meta_older_logged = True
        return True

    def _meta_predates(self, usable: set[SegmentKey]) -> bool:
        """Whether the ``_topic.json`` read last was written before the partition's first
        segment known here was created: it cannot hold the entry yet (S3 replication keeps
        no order, so a newer version may still be on its way), and the wait goes on, up to
        ``lost_segment_timeout``. A file written after it without the entry means egress
        did not record it.
        """
        written = self.first.written_at
        level0 = [s for s in usable if s.level == 0]
        if written is None or not level0:
            return False
        seg = min(level0, key=lambda s: s.start)
        if seg not in self._created:
            try:
                self._created[seg] = read_footer(self.first.store, seg).created_at
            except ReplicatorError as e:
                log.warning("%s: the footer of %s could not be read: %s", self.where,
                            seg.to_key(), e)
                return False
        created = self._created[seg]
        if created is None or written >= created:
            return False
        if not self.meta_older_logged:
            log.warning("%s: the _topic.json here was written at %s, before segment %s (%s): "
                        "waiting for a newer one with the partition's first position (at "
                        "most lost_segment_timeout, %s)", self.where, written.isoformat(),
                        seg.to_key(), created.isoformat(), self.source.lost_segment_timeout)
            self.meta_older_logged = True
        return True

    def log_pending(self, usable: set[SegmentKey]) -> None:
        """No checkpoint, and egress has not recorded where this partition begins yet:
        one WARNING while it has segments.
        """
        if not self.pending_logged and usable:
            log.warning("%s: no checkpoint; waiting for egress to record the partition's "
                        "first position in _topic.json (%d segment(s) known; at most "
                        "first_segment_delay, %s, from the first one's arrival)", self.where,
                        len(usable), self.source.first_segment_delay)
            self.pending_logged = True

    def report_below_origin(self, usable: set[SegmentKey]) -> None:
        """Log and count positions of segments that lie below ``origin``.

        The first replay without a checkpoint starts at the earliest segment known after
        ``first_segment_delay``; a segment that arrives later below that start was never
        replayed and never will be (replay only moves forward). Each position is reported
        once per worker. With ``start = "latest"`` everything below the start is history
        skipped by choice, reported once when the start was chosen (``_start_latest``).
        """
        progress = self.progress
        if progress.origin is None or self.history_skipped:
            return
        low = progress.origin if progress.reported_below is None else progress.reported_below
        below = [s for s in usable if s.start < low]
        if not below:
            return
        first = min(s.start for s in below)
        last = low - 1
        log.error("%s: segment(s) %s arrived after the first replay started at %d without a "
                  "checkpoint: positions %d-%d (%d) were NOT replayed (raise "
                  "first_segment_delay if first segments can be this late)", self.where,
                  ", ".join(sorted(s.to_key() for s in below)), progress.origin, first, last,
                  last - first + 1)
        self.metrics.messages_skipped.labels(**self.labels).inc(last - first + 1)
        progress.reported_below = first
