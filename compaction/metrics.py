"""Compaction metrics (docs/metrics.md): runs by outcome, duration, segments and bytes,
last success, holes, conflicting segments kept, outputs whose replication failed.
"""

from __future__ import annotations

from typing import Any

from replicator.core.metrics import Metrics

RUN_OUTCOMES = ("success", "skipped", "failed")


class CompactionMetrics:
    """The compaction job's metrics in ``metrics`` (names get the ``replicator_`` prefix)."""

    def __init__(self, metrics: Metrics, region: str) -> None:
        self.metrics = metrics
        self.region = region
        m = metrics
        self.runs = m.counter("compaction_runs_total", "Compaction runs by outcome.",
                              ["region", "outcome"])
        self.duration = m.histogram(
            "compaction_run_duration_seconds", "Wall time of a compaction run.", ["region"],
            buckets=(1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, 43200))
        self.last_success = m.gauge("compaction_last_success_timestamp_seconds",
                                    "Unix time of the last successful run.", ["region"])
        self.segments_read = m.counter("compaction_segments_read_total",
                                       "Input segments merged.", ["region", "topic"])
        self.segments_written = m.counter("compaction_segments_written_total",
                                          "Output segments published.", ["region", "topic"])
        self.bytes_read = m.counter("compaction_bytes_read_total",
                                    "Bytes of input segments merged.", ["region", "topic"])
        self.bytes_written = m.counter("compaction_bytes_written_total",
                                       "Bytes of output segments published.",
                                       ["region", "topic"])
        self.records_written = m.counter("compaction_records_written_total",
                                         "Records in published output segments.",
                                         ["region", "topic"])
        self.segments_deleted = m.counter(
            "compaction_segments_deleted_total",
            "Segments deleted: merged inputs, and leftovers covered by a higher level.",
            ["region", "topic", "reason"])
        self.tasks = m.counter("compaction_tasks_total",
                               "Merge tasks by outcome (merged, existing, failed).",
                               ["region", "topic", "outcome"])
        self.holes = m.counter("compaction_holes_total",
                               "Missing segment ranges found (each ends a run).",
                               ["region", "topic", "partition"])
        self.conflicts = m.counter(
            "compaction_conflicts_total",
            "Segments kept because their footer contradicts the segment(s) holding their "
            "positions (a topic recreated, a partition truncated or reset): neither is "
            "deleted nor merged.", ["region", "topic", "partition"])
        self.replication_failed = m.counter(
            "compaction_replication_failed_total",
            "Outputs whose S3 replication status is FAILED, counted by each run that finds "
            "one (S3 never retries them; their inputs stay until the replication is "
            "re-driven).", ["region", "topic"])
        for outcome in RUN_OUTCOMES:
            self.runs.labels(region, outcome)

    def summary(self) -> dict[str, Any]:
        """Totals for the end-of-run log line of ``--once``."""
        m, r = self.metrics, self.region
        return {
            "runs": {o: m.total("compaction_runs_total", region=r, outcome=o)
                     for o in RUN_OUTCOMES},
            "segments_read": m.total("compaction_segments_read_total", region=r),
            "segments_written": m.total("compaction_segments_written_total", region=r),
            "segments_deleted": m.total("compaction_segments_deleted_total", region=r),
            "bytes_read": m.total("compaction_bytes_read_total", region=r),
            "bytes_written": m.total("compaction_bytes_written_total", region=r),
            "records_written": m.total("compaction_records_written_total", region=r),
            "holes": m.total("compaction_holes_total", region=r),
            "conflicts": m.total("compaction_conflicts_total", region=r),
            "replication_failed": m.total("compaction_replication_failed_total", region=r),
            "last_success_timestamp": m.value("compaction_last_success_timestamp_seconds",
                                              {"region": r}),
        }
