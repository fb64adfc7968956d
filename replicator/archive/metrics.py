"""Metrics of the archive tables (docs/metrics.md): commits, files, conflicts, segments kept
out of a table, the time of the last step that brought a table up to date.
"""

from __future__ import annotations

from replicator.core.metrics import Metrics, build_info


class ArchiveMetrics:
    """The committer's metrics in ``metrics`` (names get the ``replicator_`` prefix)."""

    def __init__(self, metrics: Metrics) -> None:
        m = metrics
        self.commits = m.counter(
            "archive_commits_total",
            "Snapshots committed to a topic's table, by reason (sync: new and gone "
            "segments; compaction: outputs swapped in before inputs are deleted).",
            ["region", "topic", "reason"])
        self.files_added = m.counter("archive_files_added_total",
                                     "Segments added to a table.", ["region", "topic"])
        self.files_removed = m.counter(
            "archive_files_removed_total",
            "Segments removed from a table, by reason (covered: by a compaction output; "
            "gone: deleted by a lifecycle rule, retention or an operator).",
            ["region", "topic", "reason"])
        self.conflicts = m.counter(
            "archive_commit_conflicts_total",
            "Commits refused because another writer committed first (then planned again).",
            ["region", "topic"])
        self.not_in_table = m.counter(
            "archive_segments_not_in_table_total",
            "Segments a table cannot list, by reason (not-parquet; unreadable: a footer "
            "that cannot be read; schema: columns the table does not have; range: rows "
            "or footer that are not the key's range); logged with their key.",
            ["region", "topic", "reason"])
        self.refused = m.counter(
            "archive_refused_steps_total",
            "Steps that refused to touch a table, by reason (foreign-table: stamped for "
            "another source; foreign-write: another engine committed to it); logged at "
            "ERROR, the table left as it is.", ["region", "topic", "reason"])
        self.held_gone = m.counter(
            "archive_held_segments_gone_total",
            "Segments compaction swapped out of a table and held for "
            "catalog.snapshot_retention that left the bucket before it (a lifecycle rule or "
            "an operator); the snapshots listing them were expired at once, logged at ERROR "
            "naming both.", ["region", "topic"])
        self.failures = m.counter(
            "archive_step_failures_total",
            "Steps that left a table as it was (catalog or bucket errors).", ["region", "topic"])
        self.lag = m.gauge(
            "archive_table_lag_seconds",
            "How long the oldest listed segment not yet in the table has been in the "
            "bucket: at a step that committed, the wait of the oldest segment it added (0: "
            "nothing was waiting); at a step that failed, the age of the oldest segment it "
            "could not add (growing with every failed step).",
            ["region", "topic"])
        self.last_sync = m.gauge(
            "archive_last_sync_timestamp_seconds",
            "Unix time of the last step that brought the table up to date with the bucket.",
            ["region", "topic"])
        self.build_info = build_info(m, "archive")
