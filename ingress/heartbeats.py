"""Egress heartbeats read at the destination (egress/heartbeat.py writes them;
docs/architecture.md, "Heartbeats").

Every ``topic_check_interval`` ingress lists each source's ``_heartbeats/`` and reads the
objects there (one per egress instance). Per source it exports
``replicator_ingress_heartbeat_age_seconds`` (now minus the newest heartbeat, computed at
each scrape: it grows when heartbeats stop arriving), and per partition it keeps the
newest heartbeat that lists the partition as caught up. A worker whose replay reached
that position is fresh as of the heartbeat (``ingress.freshness``): a quiet topic's lag
stays about the heartbeat interval plus replication instead of growing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ingress.metrics import IngressMetrics
from replicator.core.clock import Clock
from replicator.core.errors import ReplicatorError
from replicator.core.heartbeats import read_heartbeats
from replicator.core.storage import ObjectStore
from replicator.core.wire import Heartbeat

log = logging.getLogger(__name__)

Source = tuple[str, str]
"""(source region, source topic)."""


@dataclass(frozen=True)
class CaughtUp:
    """The newest heartbeat that listed a partition: egress had nothing of it past
    ``position`` at ``written_at``.
    """

    written_at: datetime
    position: int
    topic_id: str | None = None
    """The incarnation of ``position`` (``None``: an egress that does not say)."""


def newest_per_partition(beats: Iterable[Heartbeat]) -> dict[int, CaughtUp]:
    """Per partition, the newest heartbeat listing it (instances that owned it before a
    rebalance left older ones).
    """
    out: dict[int, CaughtUp] = {}
    for hb in beats:
        for p, pos in hb.caught_up.items():
            cur = out.get(p)
            if cur is None or hb.written_at > cur.written_at:
                out[p] = CaughtUp(hb.written_at, pos, hb.topic_ids.get(p))
    return out


class HeartbeatReader:
    """The heartbeats of the replicated sources, as of the last ``refresh``."""

    def __init__(self, store: ObjectStore, prefix: str, metrics: IngressMetrics,
                 clock: Clock) -> None:
        self.store = store
        self.prefix = prefix
        self.metrics = metrics
        self.clock = clock
        self._lock = threading.Lock()
        self._newest: dict[Source, datetime] = {}
        self._partitions: dict[Source, dict[int, CaughtUp]] = {}

    def refresh(self, sources: Iterable[Source]) -> None:
        """Read the heartbeats of ``sources`` (a failed listing keeps what was known)."""
        for region, topic in sources:
            try:
                beats = read_heartbeats(self.store, self.prefix, region, topic)
            except ReplicatorError as e:
                log.warning("heartbeats of %s/%s cannot be listed: %s", region, topic, e)
                continue
            if not beats:
                continue
            newest = max(hb.written_at for hb in beats)
            with self._lock:
                first = (region, topic) not in self._newest
                self._newest[(region, topic)] = newest
                self._partitions[(region, topic)] = newest_per_partition(beats)
            if first:
                self.metrics.heartbeat_age.labels(region, topic).set_function(
                    lambda s=(region, topic): self.age_seconds(s))

    def age_seconds(self, source: Source) -> float:
        """Now minus the newest heartbeat of ``source`` (0 if none is known)."""
        with self._lock:
            newest = self._newest.get(source)
        return 0.0 if newest is None else max(0.0, (self.clock() - newest).total_seconds())

    def newest(self, source: Source) -> datetime | None:
        """The newest heartbeat of ``source`` seen."""
        with self._lock:
            return self._newest.get(source)

    def caught_up(self, source: Source, partition: int) -> CaughtUp | None:
        """The newest heartbeat that listed ``partition`` of ``source`` as caught up."""
        with self._lock:
            return self._partitions.get(source, {}).get(partition)
