"""Where one worker's replay stands, and the one way it moves: ``Progress.deliver``.

``position`` is the planner's view (replayed through: the records up to it are produced),
``checkpointed`` the newest checkpoint made durable after its records, ``origin`` where
the partition's replicated history begins (carried in every checkpoint once set).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ingress.delivery import Delivery
from ingress.freshness import PartitionFreshness
from ingress.rows import Rows
from replicator.core.errors import FatalError
from replicator.core.wire import Checkpoint, Refusal


class Progress:
    """A worker's position and the session's delivery that moves it.

    Args:
        where: names the partition in errors.
        incarnation: the label of the topic incarnation replayed now (goes into every
            checkpoint).
        freshness: told of each delivered batch.
        produced: counts the records produced (``inc``).
        refusal: the record the destination refused, if any: every checkpoint below it
            records it (``replicator topics`` shows the partition stopped there).
    """

    def __init__(self, where: str, incarnation: Callable[[], str],
                 freshness: PartitionFreshness, produced: Callable[[int], None],
                 refusal: Callable[[], Refusal | None] = lambda: None) -> None:
        self.where = where
        self._incarnation = incarnation
        self._refusal = refusal
        self.freshness = freshness
        self._produced = produced
        self.position: int | None = None
        """Replayed through: the records up to here are produced (the planner's view)."""
        self.checkpointed: int | None = None
        """The newest checkpoint sent after its records were acknowledged/committed."""
        self.origin: int | None = None
        """See ``Checkpoint.origin``; carried in every checkpoint once set."""
        self.reported_below: int | None = None
        """Positions from here up to ``origin`` were reported as skipped (this worker)."""
        self.last_cp: Checkpoint | None = None
        """The newest checkpoint delivered (the base of checkpoint-only records)."""
        self.delivery: Delivery | None = None
        """The session's delivery protocol (``None`` between sessions)."""

    def resume(self, cp: Checkpoint | None) -> None:
        """A session starts from ``cp`` (the loaded checkpoint; ``None``: none yet)."""
        self.position = self.checkpointed = None if cp is None else cp.offset
        self.last_cp = cp
        self.origin = None if cp is None else cp.origin

    def deliver(self, rows: Rows | None, cp: Checkpoint, *, alone: bool = False) -> None:
        """Make ``rows`` and then the checkpoint ``cp`` durable, then move the position.

        Steps 1-4 are the session's delivery protocol (``ingress.delivery``: one
        transaction per batch in exactly-once mode; pipelined acknowledgements, then the
        checkpoint, in at-least-once mode; ``alone``: a record the destination may refuse,
        produced once everything before it is durable and waited for).
        5. Advance the in-memory position (the planner's) and metrics; ``checkpointed``
           follows when the protocol reports the checkpoint durable.

        A failure raises; the session restarts from the last committed checkpoint.
        Checkpoints only move forward: ``cp.offset`` is always above the position.
        """
        rows, cp = self.prepare(rows, cp)
        assert self.delivery is not None
        self.delivery.deliver(rows, cp, alone=alone)         # Steps 1-4
        self.delivered(rows, cp)                             # Step 5

    def deliver_same(self, cp: Checkpoint) -> None:
        """A checkpoint-only record at the position (late gap, refusal): delivered and
        made durable before the worker waits; the position does not move.
        """
        assert self.delivery is not None
        self.delivery.deliver(None, cp)
        self.delivery.settle()       # at-least-once: out before the worker waits
        self.last_cp = cp

    def prepare(self, rows: Rows | None, cp: Checkpoint) -> tuple[Rows | None, Checkpoint]:
        """``rows`` and ``cp`` as delivered after the position: checked, origin set."""
        if self.position is not None and cp.offset <= self.position:
            raise FatalError(f"{self.where}: checkpoint {cp.offset} would not move forward "
                             f"from {self.position}")
        if cp.origin is None and self.origin is not None:
            cp = replace(cp, origin=self.origin)
        label = self._incarnation()
        if cp.incarnation != label:
            cp = replace(cp, incarnation=label)
        refusal = self._refusal()
        if cp.refused is None and refusal is not None and cp.offset < refusal.offset:
            cp = replace(cp, refused=refusal)
        if rows is not None:
            rows = replace(rows, start=self.origin if self.position is None
                           else self.position + 1)
        return rows, cp

    def delivered(self, rows: Rows | None, cp: Checkpoint) -> None:
        """Step 5 of ``deliver``: the batch is durable (or, at-least-once, produced)."""
        self.position = cp.offset
        self.last_cp = cp
        self.freshness.delivered(None if rows is None else rows.timestamps[-1])
        if rows is not None:
            self._produced(len(rows))
