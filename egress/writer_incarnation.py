"""Which topic incarnation a segment being named belongs to (``_incarnation``): its
epoch's topic id, checked against the id now; a segment whose topic was recreated under it
waits for the reset that settles it (``_hold``), or is dropped and the partition read again
from the new topic (``_switch``, its loss reported by ``egress.recreate_loss``).

``WriterIncarnation`` is a part of ``egress.partition_writer.PartitionWriter`` (the attributes and
the methods it names are the writer's), kept apart so that each module stays small.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from egress.epoch_ids import EpochIds, IncarnationChanged
from egress.metrics import PartitionMetrics
from egress.recreate_loss import SourceEnds, recreate_loss, unattributed
from egress.segment import Segment
from egress.writer_context import WriterContext

# The writer's logger: these lines keep the logger name they had before this part moved
# out of egress/partition_writer.py (operators filter on it; docs/runbooks.md shows it).
log = logging.getLogger("egress.partition_writer")

ID_CHANGE_HOLD = 30.0
"""Seconds a segment whose topic id changed under it waits for the reset that shows its
records came before the change (``PartitionWriter._hold``)."""


class WriterIncarnation:
    """The incarnation of the segments of ``egress.partition_writer.PartitionWriter`` (a
    part of it).
    """

    ctx: WriterContext
    metrics: PartitionMetrics
    name: str
    epoch: int
    ids: EpochIds
    appends: int
    source_ends: SourceEnds
    hold_seconds: float
    _switch_to: str | None

    if TYPE_CHECKING:
        # The writer's: declared for the type checker only, so that no stub here can
        # shadow them in the writer's method order.
        def _check_cancel(self) -> None: ...

        def _sleep(self, seconds: float) -> None: ...

    def _incarnation(self, seg: Segment) -> tuple[str | None, str]:
        """The id and location of a segment being named: its epoch's, checked against the
        id now (``IncarnationChanged`` when the topic was created again meanwhile).
        """
        ids = self.ids
        # A fetch before the id read below was of the topic that read names.
        seen = self.source_ends.last
        # Ids read after this epoch's are later topics': its own goes before them in the
        # chain even when one of them was recorded first (two recreates in a row).
        later = ids.later(seg.epoch)
        now = None
        if ids.inc is not None and seg.epoch == self.epoch \
                and ids.get(seg.epoch) is not None:
            now = ids.now()
            if now is not None and now != ids.get(seg.epoch):
                later.add(now)
        topic_id, label = ids.of(seg.epoch, later)
        if topic_id is None or ids.inc is None or seg.epoch != self.epoch:
            # A later epoch exists: the offsets went back after this segment's records,
            # where the topic changed; they are its epoch's topic's.
            return topic_id, label
        if now is None:
            now = ids.now()
        if now is not None and now != topic_id:
            self._hold(seg, IncarnationChanged(topic_id, now))
        elif now is not None:
            self.source_ends.verified(seg.epoch, seen)
        return topic_id, label

    def _hold(self, seg: Segment, changed: IncarnationChanged) -> None:
        """The topic was recreated and no reset came after the segment yet: wait for one
        (up to ``hold_seconds``). The offsets going back (the usual case: the new log is
        shorter) show where the topic changed, after this segment's records: they are its
        epoch's topic's. Records fetched in the same epoch meanwhile, or no reset in time,
        leave it undecidable: ``IncarnationChanged``.
        """
        seen = self.appends
        deadline = self.ctx.clock() + self.hold_seconds
        waited = 0.0
        while self.epoch == seg.epoch:
            if self.appends != seen or waited >= self.hold_seconds \
                    or self.ctx.clock() > deadline:
                raise changed
            self._check_cancel()
            self._sleep(0.05)
            waited += 0.05

    def _switch(self, seg: Segment, e: IncarnationChanged) -> None:
        """A segment whose records may be either topic's: dropped, and the partition read
        again from the new topic's oldest record. The earlier topic's records past the
        segment's start are lost up to its last known end; those past it are either
        topic's, reported apart (``egress.recreate_loss``).
        """
        end = self.source_ends.end(seg.epoch)
        loss = recreate_loss(seg.start, end, seg.end, seg.count)
        either = unattributed(seg.start, end, seg.end)
        self._switch_to = e.now
        note = ""
        if either is not None:
            first, last = either
            note = (f"; offsets {first}..{last} were fetched after topic {e.was}'s id was "
                    "last read: read again if they are the new topic's, lost if they were "
                    f"{e.was}'s (which cannot be told)")
            self.metrics.unattributed.inc(last - first + 1)
        if loss is None:
            log.warning("%s: the topic was recreated (topic id %s, was %s); the new topic is "
                        "read from its oldest record. Topic %s was read to its last known "
                        "end (offset %s) and archived: nothing of it is known lost%s",
                        self.name, e.now, e.was, e.was, end, note)
            return
        bound = "" if loss.exact else (", an upper bound: its end is not known, these are "
                                       "the records fetched since")
        log.error("%s: the source topic was deleted and created again (topic id %s, was "
                  "%s) while offsets %d..%d (%d records) were fetched: which topic they "
                  "came from cannot be told, so they are not archived as %s's; its records "
                  "%d..%d (%d%s) are lost (the topic is deleted)%s. Reading topic %s from "
                  "its oldest record", self.name, e.now, e.was, seg.start, seg.end,
                  seg.count, e.was, loss.first, loss.last, loss.count, bound, note, e.now)
        self.metrics.lost.inc(loss.count)
