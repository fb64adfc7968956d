"""The offset map, written in the transactions that replay the records (exactly-once).

For every batch of a transaction the shared producer learns where the batch's first and
last record landed (two delivery callbacks per batch, ``Producer.produce_many(on_ends=)``);
after the flush, before the commit, this writer produces the batch's entries
(``replicator.core.offset_map``) to the offset-map topic in the same transaction. So the
map holds an entry exactly when the records it describes are committed, and a consumer
group can later be translated exactly (docs/failover.md).

A batch's records are consecutive in the destination partition: one producer writes each
destination partition (producer p % ``ingress.producers``; ownership follows destination
partitions, so all the sources of a partition are replayed by the same process), and it
produces one batch after the other. The writer checks it anyway (last - first + 1 ==
records): a batch that is not consecutive gets no entry (an ERROR and a metric; translation
of that range reports "unmapped" instead of a wrong offset).

Entries tile the replayed positions: a batch's entry starts after the previous checkpoint
of its source partition (``Rows.start``) and ends at its checkpoint, so positions without
records at either end are holes of the map too. The entry of a partition's very first
batch is marked ``from_origin``: nothing was replicated below it, so a group committed
below it resumes at its first record.

Every entry records the destination topic's incarnation (Kafka's topic id, looked up once
a minute and again whenever a destination partition's offsets go back, which is what a
recreated topic looks like), so ``replicator groups`` never translates through the entries
of a topic that was deleted and created again (``replicator.core.offset_map.live_entries``).
An id that cannot be read, or the old id still answered right after the offsets went back,
leaves it out of the entry: that range then shows "unmapped".
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

from ingress.metrics import IngressMetrics
from ingress.rows import Rows
from ingress.topics import TopicAdmin
from replicator.core.compacted_topic import ensure_compacted_topic
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import DeliveryReport
from replicator.core.offset_map import entries_of, map_key
from replicator.core.wire import Checkpoint, parse_checkpoint_key

log = logging.getLogger(__name__)


class MapBatch(Protocol):
    """What the writer reads of a transaction's batch (``ingress.transactions.Batch``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def key(self) -> str: ...
    @property
    def checkpoint(self) -> Checkpoint: ...
    @property
    def rows(self) -> Rows | None: ...


class Produce(Protocol):
    """The producer's ``produce`` (inside the transaction)."""

    def __call__(self, topic: str, value: bytes | None, key: bytes | None = None) -> None: ...


class OffsetMapWriter:
    """Entries of each transaction's batches, produced before its commit.

    Args:
        topic: the offset-map topic (``ingress.offset_map_topic``).
        metrics: ``offset_map_entries`` and ``offset_map_unmapped``.
        topic_ids: the destination cluster's topic id of a topic (``Admin.topic_id``);
            ``None``: entries carry no incarnation.
        clock: monotonic seconds (tests inject one).
    """

    ID_TTL = 60.0
    """Seconds a destination topic's id is trusted before it is looked up again (a
    recreated topic is also noticed at once when its partition's offsets go back)."""

    def __init__(self, topic: str, metrics: IngressMetrics,
                 topic_ids: Callable[[str], str | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = topic
        self.m = metrics
        self._topic_ids = topic_ids
        self._clock = clock
        self._ids: dict[str, tuple[str | None, float]] = {}
        self._dest_next: dict[tuple[str, int], int] = {}
        self._doubt: dict[str, float] = {}
        """Topics whose offsets went back, since when: their id is looked up per batch."""
        self._ends: weakref.WeakKeyDictionary[MapBatch, dict[int, int]] = \
            weakref.WeakKeyDictionary()
        """Reported destination offsets of each batch's first and last record (a batch
        that fails and is dropped takes its entry with it)."""
        self._lock = threading.Lock()

    def on_ends(self, batch: MapBatch) -> Callable[[int, DeliveryReport], None]:
        """The ``produce_many(on_ends=...)`` listener of ``batch``'s records."""
        ends: dict[int, int] = {}
        with self._lock:
            self._ends[batch] = ends            # a batch tried again starts afresh

        def record(i: int, report: DeliveryReport) -> None:
            if report.error is None and report.offset >= 0:
                with self._lock:
                    ends[i] = report.offset
        return record

    def produce(self, batches: Sequence[MapBatch], produce: Produce) -> int:
        """Produce the entries of ``batches`` (after the flush: every end is reported);
        returns how many.
        """
        n = 0
        for b in batches:
            offsets = None if b.rows is None else b.rows.offsets
            with self._lock:
                ends = self._ends.pop(b, {})
            if not offsets:
                continue
            parsed = parse_checkpoint_key(b.key)
            if parsed is None:
                continue
            region, topic, partition, destination = parsed
            if destination is None:
                continue
            first, last = ends.get(0), ends.get(len(offsets) - 1)
            where = f"{region}/{topic}[{partition}] -> {b.topic}[{b.partition}]"
            if first is None or last is None or last - first + 1 != len(offsets):
                # Never a wrong translation: this range is reported "unmapped" instead.
                log.error("offset map: the batch of %s with source offsets %d-%d landed at "
                          "destination offsets %s-%s, not %d consecutive ones; no map entry "
                          "(consumer groups in this range cannot be translated)", where,
                          offsets[0], offsets[-1], first, last, len(offsets))
                self.m.offset_map_unmapped.labels(topic=b.topic).inc()
                continue
            assert b.rows is not None
            start = b.rows.start
            if start is None or start > offsets[0]:
                start = offsets[0]
            end = max(b.checkpoint.offset, offsets[-1])
            for e in entries_of(offsets, first, first=start, last=end,
                                from_origin=start == b.checkpoint.origin,
                                incarnation=self._incarnation(b.topic, b.partition, first,
                                                              last + 1),
                                source_incarnation=b.checkpoint.incarnation):
                produce(self.topic, e.encode(),
                        map_key(region, topic, partition, destination, e.src_first).encode())
                n += 1
        self.m.offset_map_entries.inc(n)
        return n


    def _incarnation(self, topic: str, partition: int, first: int, after: int) -> str | None:
        """The destination topic's id for a batch at ``first..after - 1`` of ``partition``.

        After the partition's offsets went back, the same id as before is not trusted until
        ``ID_TTL`` passed (a broker may still answer from metadata of the deleted topic for
        a moment, and an unclean leader election also moves offsets back): those batches'
        entries carry no id, so their range shows unmapped rather than mixing with the old
        topic's entries.
        """
        if self._topic_ids is None:
            return None
        now = self._clock()
        if first < self._dest_next.get((topic, partition), 0):
            self._doubt.setdefault(topic, now)
        self._dest_next[(topic, partition)] = after
        known = self._ids.get(topic)
        doubt = self._doubt.get(topic)
        if known is None or doubt is not None or now - known[1] >= self.ID_TTL:
            before = None if known is None else known[0]
            try:
                known = (self._topic_ids(topic), now)
            except ReplicatorError as e:
                # Asked again after ID_TTL (one WARNING per minute, not one per batch).
                log.warning("offset map: the id of destination topic %s cannot be read (%s); "
                            "entries written for the next %.0fs carry none", topic, e,
                            self.ID_TTL)
                known = (None, now)
            self._ids[topic] = known
            if doubt is not None:
                if known[0] is not None and known[0] == before and now - doubt < self.ID_TTL:
                    return None
                del self._doubt[topic]
        return known[0]


def ensure_offset_map_topic(admin: TopicAdmin, topic: str) -> None:
    """Create the offset-map topic (compacted: one key per entry) if it is missing, with the
    checkpoint topic's compaction settings (pruned entries' tombstones go within an hour,
    not after the default week of the active segment); report a badly set existing one.
    """
    ensure_compacted_topic(admin, topic, "offset-map topic")
