"""Egress heartbeats: per topic, opt-in (``[egress.topics."T"] heartbeat_interval``), a small
object that says which partitions this instance had nothing more of, and up to where
(docs/architecture.md, "Heartbeats").

At the destination, a topic that receives no records and a replication that stopped look
the same: no new segment. A heartbeat tells them apart. Every interval, each egress
instance writes ``{prefix}/{region}/{topic}/_heartbeats/{instance}.json``
(``replicator.core.wire.Heartbeat``) listing the partitions it owns that are caught up (no
open segment, none being made durable, no failed one, the consumer at the high watermark)
with their last durable position. It is no segment: it never reaches the destination
topic. S3 replication (or ``replicator sync``) copies it with the segments; ingress reads
it and, for a partition replayed up to that position, counts the destination fresh as of
the heartbeat (``replicator_ingress_heartbeat_age_seconds``, the lag gauge).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Protocol

from egress.metrics import EgressMetrics
from replicator.core.clock import Clock
from replicator.core.errors import ReplicatorError
from replicator.core.keys import heartbeat_key
from replicator.core.storage import ObjectStore
from replicator.core.wire import Heartbeat

log = logging.getLogger(__name__)

LOOK_EVERY = 1.0
"""Seconds between two looks for due heartbeats (intervals are at least 1 s)."""


class WriterState(Protocol):
    """What a heartbeat reads of a partition writer (``egress.partition_writer``)."""

    @property
    def expected(self) -> int | None:
        """Where the partition's next segment starts."""
    @property
    def segment(self) -> object | None:
        """The open segment."""
    @property
    def closing(self) -> Sequence[object]:
        """Segments being made durable."""
    @property
    def failed(self) -> object | None:
        """A segment that failed (the partition rewinds)."""


def caught_up(writers: Mapping[int, WriterState], positions: Mapping[int, int],
              highs: Mapping[int, int]) -> dict[int, int]:
    """Partition → last durable position, for the partitions with nothing more to write:
    no open, closing or failed segment, and the consumer's position at the high watermark
    (both known). ``expected`` is where the next segment starts, so the last durable one
    ends just before it.
    """
    out: dict[int, int] = {}
    for p, w in writers.items():
        if w.expected is None or w.expected < 1 or w.segment is not None or w.closing \
                or w.failed is not None:
            continue
        high, pos = highs.get(p, -1), positions.get(p, -1)
        if high < 0 or pos < 0 or pos < high:
            continue
        out[p] = w.expected - 1
    return out


class HeartbeatPublisher:
    """Writes the heartbeats of the topics that ask for them, each at its interval.

    Args:
        store: the bucket.
        prefix: ``s3.prefix``.
        region: this region.
        instance: this egress instance's name (one object per instance and topic).
        interval_of: a topic's ``heartbeat_interval`` (``None``: no heartbeats).
        metrics: egress metrics (``replicator_egress_heartbeats_total``).
        wall: the wall clock written into the heartbeat.
    """

    def __init__(self, store: ObjectStore, *, prefix: str, region: str, instance: str,
                 interval_of: Callable[[str], timedelta | None], metrics: EgressMetrics,
                 wall: Clock) -> None:
        self.store = store
        self.prefix = prefix
        self.region = region
        self.instance = instance
        self.interval_of = interval_of
        self.metrics = metrics
        self.wall = wall
        self._last: dict[str, float] = {}
        self._next_look = float("-inf")

    def may_be_due(self, now: float) -> bool:
        """False until a second after the last ``due``: the poll loop asks at every turn,
        and ``due`` walks the assigned topics.
        """
        return now >= self._next_look

    def due(self, topics: Iterable[str], now: float) -> list[str]:
        """The topics whose heartbeat is due at monotonic ``now`` (marked as written)."""
        self._next_look = now + LOOK_EVERY
        out = []
        for t in sorted(set(topics)):
            interval = self.interval_of(t)
            if interval is None:
                continue
            if now - self._last.get(t, float("-inf")) >= interval.total_seconds():
                self._last[t] = now
                out.append(t)
        return out

    def write(self, topic: str, partitions: Mapping[int, int],
              topic_ids: Mapping[int, str] | None = None) -> None:
        """Write one topic's heartbeat (a pool thread); a failure is logged and counted,
        the next interval writes again. ``topic_ids``: the incarnation of each position.
        """
        ids = {p: t for p, t in (topic_ids or {}).items() if p in partitions}
        hb = Heartbeat(topic, self.region, self.instance, self.wall(), dict(partitions), ids)
        key = heartbeat_key(self.prefix, self.region, topic, self.instance)
        try:
            self.store.put(key, hb.encode())
        except ReplicatorError as e:
            log.warning("heartbeat %s could not be written (next interval tries again): %s",
                        key, e)
            self.metrics.heartbeat_failures.labels(self.region).inc()
            return
        self.metrics.heartbeats.labels(self.region, topic).inc()
        log.debug("heartbeat %s: %d partition(s) caught up", key, len(partitions))
