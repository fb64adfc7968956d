"""How fresh one replayed partition is, and when it last moved: computed when ``/metrics``
is scraped, so a stall shows while nothing arrives (docs/operations.md, "Alerts: lag and
progress").

``replicator_ingress_replication_lag_seconds`` is *now* minus the time through which the
destination is known to hold the source's records:

* the source timestamp of the last record produced (what the gauge always meant), or
* after a restart, before a record was produced, the time of the checkpoint it resumed
  from (its records are at least that old: a lower bound of the lag), or
* with egress heartbeats (``[egress.topics] heartbeat_interval``), the time of the newest
  heartbeat whose committed end this partition has replayed through: egress had nothing
  more of it then, so a quiet topic is not lagging.

Because the value is computed at each scrape, it grows by itself when replication stops
(the bucket sync or S3 replication broken, egress down): ``ReplicatorReplicationLagHigh``
then fires. Without heartbeats a quiet topic grows the same way (nothing distinguishes
"no records" from "no replication" at the destination): enable heartbeats for quiet
topics.

``replicator_ingress_last_progress_timestamp_seconds`` is when the partition's position
last moved (or its worker started); with ``replicator_ingress_segments_waiting`` it gives
``ReplicatorIngressNoProgress``: segments are there and nothing moves.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from ingress.metrics import IngressMetrics
from replicator.core.clock import Clock


class PartitionFreshness:
    """The lag and progress gauges of one worker's partition.

    The lag's series exists once something is known (a record produced, a checkpoint
    loaded, a heartbeat matched): a partition that never had data reports no lag rather
    than a growing one. ``close`` removes the series, so a partition that moved to another
    process is not reported stale here.
    """

    def __init__(self, metrics: IngressMetrics, labels: dict[str, str], clock: Clock) -> None:
        self._metrics = metrics
        self._labels = labels
        self._values = tuple(labels.values())
        self._clock = clock
        self._lock = threading.Lock()
        # Seconds since the epoch: the last record's source timestamp, the resumed
        # checkpoint's time (until a record is produced), the newest matching heartbeat.
        self._record: float | None = None
        self._resumed: float | None = None
        self._heartbeat: float | None = None
        self._lag: Any = None
        self._progress = metrics.last_progress.labels(**labels)
        self._progress.set(clock().timestamp())
        self._closed = False
        metrics.series_owners[self._values] = self

    def lag_seconds(self) -> float:
        """Now minus the time the destination is fresh through (0 if in the future)."""
        with self._lock:
            data = self._record if self._record is not None else self._resumed
            through = max((t for t in (data, self._heartbeat) if t is not None),
                          default=None)
        if through is None:
            return 0.0
        return max(0.0, self._clock().timestamp() - through)

    def resumed(self, checkpoint_time: datetime) -> None:
        """A checkpoint was loaded: its records are at least as old as it."""
        self._fresh("_resumed", checkpoint_time.timestamp())

    def delivered(self, last_timestamp_ms: int | None) -> None:
        """Records (or only a checkpoint) made durable: the position moved."""
        self._progress.set(self._clock().timestamp())
        if last_timestamp_ms is not None and last_timestamp_ms > 0:
            self._fresh("_record", last_timestamp_ms / 1000.0)

    def heartbeat(self, written_at: datetime) -> None:
        """Egress had nothing beyond this partition's position at ``written_at``."""
        with self._lock:
            newer = self._heartbeat is None or written_at.timestamp() > self._heartbeat
        if newer:
            self._fresh("_heartbeat", written_at.timestamp())

    def _fresh(self, which: str, at: float) -> None:
        with self._lock:
            if self._closed:
                return
            setattr(self, which, at)
            if self._lag is None:
                self._lag = self._metrics.replication_lag.labels(**self._labels)
                self._lag.set_function(self.lag_seconds)

    def close(self) -> None:
        """Remove this partition's series (the worker stopped); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lag, self._lag = self._lag, None
            if self._metrics.series_owners.get(self._values) is not self:
                return    # a successor of this partition owns the series now
            del self._metrics.series_owners[self._values]
        for gauge, present in ((self._metrics.replication_lag, lag is not None),
                               (self._metrics.last_progress, True)):
            if present:
                try:
                    gauge.remove(*self._values)
                except KeyError:
                    pass   # removed already
