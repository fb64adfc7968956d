"""Segments that arrive after their range was declared lost: reported with the command that
brings their records back (docs/restore.md).

Replay only moves forward, so a range declared lost after ``lost_segment_timeout`` is
never replayed by ingress, even when its segment reaches the bucket later (S3 replication
re-driven after a regional incident). The records are not gone: they are in the archive.
The worker tells this tracker which ranges it declared lost (and the one its resumed
checkpoint records); a segment event that covers part of one is logged at ERROR with the
exact ``replicator restore`` command for those positions and counted in
``replicator_ingress_late_after_lost_messages_total``.

What is known: the ranges this worker declared, and the one in the checkpoint it resumed
from (the newest checkpoint record keeps only the last declared range). A range declared
by another process before this one took the partition over, and not the newest, is not
reported here; its declaration was logged at ERROR with the range when it happened.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

from ingress.events import SegmentEvent
from ingress.metrics import IngressMetrics
from replicator.core.keys import PartitionRef

log = logging.getLogger(__name__)

REMEMBERED = 64
"""Declared ranges kept per partition (the newest): a partition that declares more than
this many losses in one process's life has a problem the lost-message alert shows already."""


def restore_command(ref: PartitionRef, first: int, last: int, to_topic: str,
                    topic_id: str | None = None) -> str:
    """The ``replicator restore`` command that replays positions ``first..last`` of
    ``ref`` into ``to_topic`` (``FILE``: the ingress config, which names the destination
    cluster and bucket), of the incarnation ``topic_id`` when the topic has several
    (restore reads the live one by default).
    """
    return (f"replicator restore --config FILE --source-region {ref.region} "
            f"--topic {ref.topic} --partitions {ref.partition} --from-offset {first} "
            f"--to-offset {last} --to-topic {to_topic}"
            + ("" if topic_id is None else f" --incarnation {topic_id}"))


class DeclaredLost:
    """The declared-lost ranges of one worker's partition, and the late arrivals in them."""

    def __init__(self, ref: PartitionRef, destination_topic: str, where: str,
                 metrics: IngressMetrics, labels: dict[str, str], *,
                 current: Callable[[], str] = lambda: "",
                 topic_id_of: Callable[[str], str | None] = lambda label: None) -> None:
        self.ref = ref.base
        self.current = current
        """The incarnation the worker replays now (where a range it declares lies)."""
        self.topic_id_of = topic_id_of
        """The topic id of an incarnation label (``None``: the topic has no incarnations
        recorded)."""
        self.destination_topic = destination_topic
        self.where = where
        self._counter = metrics.late_after_lost.labels(**labels)
        self.ranges: deque[tuple[int, int, str]] = deque(maxlen=REMEMBERED)
        self._reported: set[tuple[int, int, str]] = set()
        """Ranges reported: a compacted segment over the same positions adds nothing."""

    def declared(self, first: int, last: int, incarnation: str | None = None) -> None:
        """Positions ``first..last`` of ``incarnation`` (default: the current one) were
        declared lost (by this worker, or in the checkpoint it resumed from).
        """
        entry = (first, last, self.current() if incarnation is None else incarnation)
        if entry not in self.ranges:
            self.ranges.append(entry)

    def arrived(self, events: Iterable[SegmentEvent]) -> None:
        """Report each created segment that covers part of a declared range (each part
        once).
        """
        for ev in events:
            if ev.kind != "created" or ev.key.partition_ref.base != self.ref:
                continue
            label = ev.key.incarnation
            for first, last, declared_in in self.ranges:
                lo, hi = max(first, ev.key.start), min(last, ev.key.end)
                if declared_in != label or lo > hi or (lo, hi, label) in self._reported:
                    continue
                self._reported.add((lo, hi, label))
                tid = self.topic_id_of(label)
                self._counter.inc(hi - lo + 1)
                log.error(
                    "%s: segment %s arrived after positions %d-%d were declared LOST; "
                    "positions %d-%d (%d) of it are in the archive and were NOT replayed "
                    "(replay only moves forward). To bring them back into the topic (after "
                    "the records replayed since): %s ; or into a side topic: %s",
                    self.where, ev.key.to_key(), first, last, lo, hi, hi - lo + 1,
                    restore_command(self.ref, lo, hi, self.destination_topic, tid),
                    restore_command(self.ref, lo, hi,
                                    f"{self.destination_topic}.restored", tid))
