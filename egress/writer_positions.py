"""A partition writer's positions outside its segments: its first position, recorded in
``_topic.json`` ahead of the first segment when it can be (``commit_start``,
``record_resumed``) and always before that segment is visible (``_record_start``), and the
commits of positions no segment carries (a start egress chose, records skipped by
``[egress] skip_origins``).

``WriterPositions`` is a part of ``egress.partition_writer.PartitionWriter`` (the attributes and
the methods it names are the writer's), kept apart so that each module stays small.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, TypeVar

from egress.commits import Commit, NotOwner
from egress.encode_gate import EncodeCancelled
from egress.epoch_ids import EpochIds
from egress.metrics import PartitionMetrics
from egress.segment import Segment
from egress.writer_context import Cancelled, WriterContext
from replicator.core.errors import ReplicatorError
from replicator.core.keys import BASE_INCARNATION, PartitionRef, SegmentKey
from replicator.core.queues import SerialQueue

if TYPE_CHECKING:
    from collections.abc import Callable

# The writer's logger: these lines keep the logger name they had before this part moved
# out of egress/partition_writer.py (operators filter on it; docs/runbooks.md shows it).
log = logging.getLogger("egress.partition_writer")

T = TypeVar("T")


class WriterPositions:
    """First positions and position commits of ``egress.partition_writer.PartitionWriter``
    (a part of it).
    """

    ref: PartitionRef
    ctx: WriterContext
    metrics: PartitionMetrics
    _commit: Commit
    name: str
    segment: Segment | None
    closing: list[Segment]
    queue: SerialQueue
    broken: threading.Event
    cancel: threading.Event
    failed: Segment | None
    expected: int | None
    position: int | None
    committed_offset: int | None
    _skip_commit_at: float
    resumed: bool
    _first_recorded: bool
    epoch: int
    ids: EpochIds

    if TYPE_CHECKING:
        # The writer's: declared for the type checker only, so that no stub here can
        # shadow them in the writer's method order.
        def _retry(self, fn: Callable[[], T], what: str) -> T: ...

    def commit_skipped(self, now: float, interval: float) -> None:
        """Commit the position past skipped records while no segment is open or closing
        (poll thread; at most every ``interval`` seconds, any time with ``interval`` 0).

        In active-active replication a partition whose recent records all came from the
        other region opens no segment, so no segment commit moves its offset: without this
        the commit stays behind them, every restart reads them again, and once retention
        deletes them a restart would report them as lost although they were never to be
        copied. The next segment's start (``expected``) goes into the commit's metadata.
        """
        pos, start = self.position, self.expected
        if pos is None or start is None or pos <= start or self.segment is not None \
                or self.closing or self.failed is not None or self.broken.is_set():
            return
        if self.committed_offset is not None and pos <= self.committed_offset:
            return
        if now < self._skip_commit_at:
            return
        self._skip_commit_at = now + interval
        self.queue.submit(lambda: self._commit_position(pos, start, "skipped records"))

    def commit_start(self) -> None:
        """Make the position this partition was started at without a commit (``start =
        "latest"`` or a time; poll thread, at assignment) its first position and commit it,
        so that wherever and whenever it is assigned next it resumes here rather than at a
        later end of the log.

        1. Record the position as the partition's first position in ``_topic.json``
           (ingress starts its replay there), unless the live topic is a later incarnation
           (its first segment records where it begins).
        2. Commit it, marked as a start egress chose (``egress.commits.FIRST_POSITION``):
           a member that resumes from that commit before the first segment (a rebalance,
           a restart) records the same first position instead of taking it for a resume.

        A failed step 1 is logged and left to the first segment, which records the first
        position before it is visible in any case.
        """
        pos = self.position
        if pos is None:
            return
        self.resumed = False
        self.queue.submit(lambda: self._start_here(pos))

    def _start_here(self, position: int) -> None:
        if self.cancel.is_set() or self.broken.is_set():
            return
        # Step 1: the first position, before the commit that makes it the resume point.
        if not self._record_now(position, resumed=False):
            return
        # Step 2: commit the start, marked as chosen here.
        self._commit_position(position, position, "its start", first=True)

    def record_resumed(self) -> None:
        """A partition resumed from a commit (poll thread, at assignment): make sure
        ``_topic.json`` says where its history begins now, not only at its next segment,
        so ingress does not wait for an idle partition's entry (segments written by an
        egress that did not record first positions). Nothing is done when the entry is
        known already (the usual case: ``_topic.json`` was read at start).
        """
        pos = self.expected
        if pos is not None and self.resumed and not self._first_recorded \
                and self.ctx.first_positions is not None:
            self.queue.submit(lambda: self._record_resumed_task(pos))

    def _record_resumed_task(self, position: int) -> None:
        self._record_now(position, resumed=True)

    def _record_now(self, position: int, *, resumed: bool) -> bool:
        """Record the first position ahead of the first segment (base incarnation only:
        a later one records where it begins when its first segment is named); False when
        cancelled. A failure is a WARNING: the first segment records it before it is
        visible in any case.
        """
        record = self.ctx.first_positions
        if record is None or self._first_recorded or self.cancel.is_set():
            return not self.cancel.is_set()
        try:
            _, label = self.ids.of(self.epoch)
            if label == BASE_INCARNATION:
                self._retry(lambda: record(self.ref, position, resumed=resumed),
                            f"{self.name}: record the first position {position}")
                self._first_recorded = True
        except (Cancelled, EncodeCancelled):
            return False
        except ReplicatorError as e:
            log.warning("%s: the first position is not in _topic.json yet (the first segment "
                        "records it before it is visible): %s", self.name, e)
        return True

    def _commit_position(self, position: int, start: int, why: str, *,
                         first: bool = False) -> None:
        if self.cancel.is_set() or self.broken.is_set():
            return
        try:
            self._commit(position, start, first=first,
                         topic_id=self.ids.get(self.epoch))
        except NotOwner as e:
            log.info("%s: %s", self.name, e)
            return
        except ReplicatorError as e:
            # The next one (or the next segment's) covers it.
            log.warning("%s: committing offset %d (%s) failed: %s",
                        self.name, position, why, e)
            self.metrics.commit_failures.inc()
            return
        log.debug("%s: committed offset %d (%s; next segment starts at %d)",
                  self.name, position, why, start)
        self.committed_offset = max(position, self.committed_offset or 0)

    def _record_start(self, seg: Segment, key: SegmentKey) -> None:
        if not key.incarnation:
            self._record_first_position(seg)
            return
        # The previous incarnation's end, before this one's segment is visible: ingress
        # replays this one after exactly that.
        seal = self.ctx.incarnations
        assert seal is not None
        self._retry(lambda: seal.seal(key.partition_ref, seg.start),
                    f"{self.name}: record where incarnation {key.incarnation} begins")

    def _record_first_position(self, seg: Segment) -> None:
        # Before the partition's first segment is visible, _topic.json says where its
        # history begins (ingress must not start after a first segment that arrives late).
        record = self.ctx.first_positions
        if self._first_recorded or record is None:
            return
        self._retry(lambda: record(self.ref, seg.start, resumed=self.resumed),
                    f"{self.name}: record the first position {seg.start}")
        self._first_recorded = True
