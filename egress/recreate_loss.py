"""What a topic deleted and created again under a fetch that went on cost: the earlier
topic's records egress never archived, bounded by its last known high watermark.

librdkafka cannot tell a recreated topic from the same one: when the new log already
reaches egress's read position ``p``, the fetch at ``p`` returns the new topic's records
with no sign of the change. The change shows when the segment holding them is named (the
topic id is read again) and the segment is dropped (``PartitionWriter._switch``): which
topic its records came from cannot be told. What can be lost is only the earlier topic's
records from ``p`` on, up to its end. Each fetch response carries the partition's high
watermark; one read before a topic id read that still named the earlier topic is that
topic's (``PartitionWriter._incarnation``), so it bounds that topic's end ``H``:

- ``H <= p``: egress had read the earlier topic to its end as far as it knew; the dropped
  records are the new topic's, read again from its oldest record: nothing is lost.
- ``H > p``: exactly the earlier topic's offsets ``p .. H - 1`` are lost.
- ``H`` unknown: the dropped records are reported lost, an upper bound of what was fetched.

The dropped records past ``max(p, H)`` were fetched after that id read: they cannot be
told from the new topic's (the earlier topic may have received them after the id read and
been deleted after they were fetched). They are never claimed lost, nor passed over in
silence: ``unattributed`` gives their range, logged and counted apart
(docs/architecture.md, "Topic incarnations").
"""

from __future__ import annotations

from dataclasses import dataclass


def source_end(high: int, consumer_position: int | None, fetched_to: int | None) -> int | None:
    """Where the source partition's records end, from one fetch's high watermark ``high``
    (``None`` when unknown: negative).

    A consumer whose position reached ``high`` has been handed every record below it, so
    only transaction markers (or records skipped by compaction) lie between the last one,
    ``fetched_to`` (the offset after it), and ``high``: the end is ``fetched_to``. On a
    transactional source the high watermark is past the last commit marker, never a record.
    """
    if high < 0:
        return None
    if consumer_position is not None and fetched_to is not None \
            and consumer_position >= high:
        return min(high, fetched_to)
    return high


@dataclass(frozen=True)
class RecreateLoss:
    """The earlier topic's records a dropped segment's switch loses."""

    first: int
    last: int
    count: int
    exact: bool
    """``False``: the earlier topic's end is unknown, ``count`` is an upper bound (the
    dropped segment's records)."""


def recreate_loss(start: int, end: int | None, seg_end: int, seg_count: int
                  ) -> RecreateLoss | None:
    """The loss of dropping a segment from ``start`` (``seg_count`` records up to
    ``seg_end``) whose topic was created again, given the earlier topic's known end ``end``
    (the offset after its last record; ``None``: unknown). ``None``: nothing is lost.
    """
    if end is None:
        return RecreateLoss(start, seg_end, seg_count, exact=False)
    if end <= start:
        return None
    return RecreateLoss(start, end - 1, end - start, exact=True)


def unattributed(start: int, end: int | None, seg_end: int) -> tuple[int, int] | None:
    """The offsets of a dropped segment (from ``start`` to ``seg_end``) that may be either
    topic's: past the earlier topic's known end ``end``. ``None``: none, or the end is
    unknown (every dropped record is then counted lost, ``recreate_loss``).
    """
    if end is None:
        return None
    first = max(start, end)
    return (first, seg_end) if first <= seg_end else None


Note = tuple[int, int, int]
"""``(epoch, runs, end)``: a fetch's source end, and the writer's epoch and appended runs
when it was noted."""


class SourceEnds:
    """Each epoch's topic's known end, from the fetches' high watermarks.

    A note (poll thread) is the earlier topic's only when no record came since its id was
    last read: one taken before an id read that still named the epoch's topic (``verified``,
    a worker naming a segment), or one after it with no run appended since and the
    consumer's position at the watermark (``idle``: if the new topic's log is already
    exactly there, the earlier topic's end past it could not be known anyway, as at a
    reset). A run appended after the last id read may be either topic's, and so may records
    a fetch response holds that the consumer has not handed out yet (its position below the
    watermark): their watermark is never used unless an id read comes after it.
    """

    def __init__(self) -> None:
        self.last: Note | None = None
        """The last fetch's (poll thread)."""
        self._verified: dict[int, tuple[int, int]] = {}
        """Epoch -> (runs, end) of the last verified note (workers)."""
        self._idle: dict[int, int] = {}
        """Epoch -> end of notes with no run since a verified one (poll thread)."""

    def note(self, epoch: int, runs: int, end: int, *, idle: bool) -> None:
        """A fetch's end (poll thread); ``runs``: the writer's appended runs so far;
        ``idle``: the consumer's position is at the watermark (nothing past it to hand out).
        """
        self.last = (epoch, runs, end)
        verified = self._verified.get(epoch, (0, 0) if epoch == 0 else None)
        if idle and verified is not None and verified[0] == runs:
            self._idle[epoch] = max(end, self._idle.get(epoch, 0))

    def verified(self, epoch: int, seen: Note | None) -> None:
        """The id read after ``seen`` (``last`` before the read) still named ``epoch``'s
        topic (worker).
        """
        if seen is None or seen[0] != epoch:
            return
        runs, end = self._verified.get(epoch, (0, 0))
        self._verified[epoch] = (max(runs, seen[1]), max(end, seen[2]))

    def end(self, epoch: int) -> int | None:
        """The epoch's topic's known end (``None``: none known)."""
        ends = [e for e in (self._verified.get(epoch, (0, None))[1], self._idle.get(epoch))
                if e is not None]
        return max(ends) if ends else None
