"""Checkpoints without records: what a worker writes besides a replayed batch's checkpoint.

Each goes through the session's delivery like a batch (``Progress``): durable in the
checkpoint topic, in a transaction in exactly-once mode.

* the position moves without records: a range declared lost (``lost``), a segment whose
  last records are holes (``holes``), ``start = "latest"`` skipping the history
  (``latest_start``), a checkpoint of an earlier version taken over (``upgrade``);
* the position stays and the checkpoint records a state, for restarts and the operator
  tools: when a gap after it was first seen (``late``), the record the destination
  refuses (``refusal``).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ingress.planner import LateGap
from ingress.progress import Progress
from replicator.core.clock import Clock
from replicator.core.keys import SegmentKey
from replicator.core.wire import Checkpoint, Refusal

log = logging.getLogger(__name__)


class CheckpointWriter:
    """Writes one worker's checkpoint-only records through its ``Progress``."""

    def __init__(self, progress: Progress, where: str, clock: Clock) -> None:
        self.progress = progress
        self.where = where
        self.clock = clock

    def lost(self, first: int, last: int, following: SegmentKey | None) -> None:
        """Positions ``first``-``last`` are declared lost: the checkpoint moves past them
        (``following``: the segment after them, named in it).
        """
        self.progress.deliver(None, Checkpoint(
            last, "" if following is None else following.to_key(), self.clock(),
            lost=(first, last)))

    def holes(self, seg: SegmentKey) -> Checkpoint | None:
        """The checkpoint of ``seg``'s end when its last record lies before it: the footer
        vouches for the range, positions after the last record are holes.
        """
        position = self.progress.position
        if position is not None and position >= seg.end:
            return None
        name = seg.to_key()
        log.warning("%s: segment %s ends at %d but its last record is %s; checkpointing "
                    "its end", self.where, name, seg.end, position)
        return Checkpoint(seg.end, name, self.clock())

    def latest_start(self, newest: SegmentKey) -> None:
        """``start = "latest"``: the history up to ``newest``'s end is skipped; its end is
        checkpointed at once, so a restart resumes there instead of skipping further.
        """
        self.progress.deliver(None, Checkpoint(newest.end, newest.to_key(), self.clock()))

    def history_begins(self, first: int) -> None:
        """``start = "latest"`` found no history to skip: the partition is replayed from
        its first position ``first`` (> 0), checkpointed at once as "replayed through the
        position before it", so a restart keeps that choice instead of skipping what
        arrived meanwhile.
        """
        self.progress.deliver(None, Checkpoint(first - 1, "", self.clock(), origin=first))

    def upgrade(self, cp: Checkpoint) -> None:
        """A checkpoint of an earlier version (no destination in its key) is written under
        the key with the destination (the legacy key is read only until then).
        """
        self.progress.deliver(None, replace(cp, updated_at=self.clock()))

    def late(self, late: LateGap) -> None:
        """Record when the gap after the checkpoint was first seen, in the checkpoint
        itself (same offset), once per gap: a restart goes on counting from then.
        """
        last = self.progress.last_cp
        if last is None or last.offset != self.progress.position \
                or last.offset + 1 != late.first:
            return
        if last.late is not None and last.late[0] == late.first:
            return
        self.progress.deliver_same(replace(last, updated_at=self.clock(),
                                           late=(late.first, late.since)))

    def refusal(self, refusal: Refusal) -> None:
        """A session after a refusal: record the refused record in the checkpoint itself
        (same offset, once per record), so ``replicator topics`` and ``replicator
        checkpoints`` show the partition stopped at it; the checkpoints below it carry it
        too (``Progress.prepare``), the first one past it none.
        """
        last = self.progress.last_cp
        if last is None or refusal.offset <= last.offset:
            return
        if last.refused is not None and last.refused.offset == refusal.offset:
            return
        self.progress.deliver_same(replace(last, updated_at=self.clock(), refused=refusal))
