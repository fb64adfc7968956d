"""The egress metrics (docs/metrics.md), labelled by region/topic/partition, never by offset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replicator.core.metrics import Metrics, build_info

_PART = ("region", "topic", "partition")

# Segment sizes from a few KiB (age-closed, idle topics) to several GiB.
_SIZE_BUCKETS = [2.0**p for p in range(12, 34, 2)]
# A cross-region copy: tens of milliseconds to seconds, minutes when the queue backs up.
_LATENCY_BUCKETS = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]


class EgressMetrics:
    """Every metric the egress exports, created once per controller."""

    def __init__(self, metrics: Metrics, home_region: str = "") -> None:
        self.registry = metrics
        self.messages = metrics.counter(
            "egress_messages_total", "Messages consumed from the source.", _PART)
        self.bytes = metrics.counter(
            "egress_bytes_total", "Raw record bytes (key + value + headers) consumed.", _PART)
        self.segments = metrics.counter(
            "egress_segments_total", "Segments made durable and committed, by close reason.",
            (*_PART, "reason"))
        self.segment_bytes = metrics.counter(
            "egress_segment_bytes_total", "Stored bytes of committed segments.", _PART)
        self.segment_size = metrics.histogram(
            "egress_segment_size_bytes", "Stored size of committed segments.",
            ("region", "topic"), buckets=_SIZE_BUCKETS)
        self.selected_topics = metrics.gauge(
            "egress_selected_topics", "Source topics subscribed: the explicit ones plus "
            "those [egress.select] matches now.", ("region",))
        self.groups_exported = metrics.gauge(
            "egress_groups_exported", "Source consumer groups whose offsets for the "
            "replicated topics the last export round found ([egress.group_export]).",
            ("region",))
        self.group_exports = metrics.counter(
            "egress_group_exports_total", "Group-offset objects written to S3 (only when "
            "a group's committed offsets for a topic changed).", ("region", "topic"))
        self.group_export_failures = metrics.counter(
            "egress_group_export_failures_total", "Export rounds or groups whose offsets "
            "could not be read or written (retried at the next interval).", ("region",))
        self.lag = metrics.gauge(
            "egress_consumer_lag", "High watermark minus the next offset to consume.", _PART)
        self.lost = metrics.counter(
            "egress_source_lost_messages_total",
            "Offset positions deleted at the source (retention) before egress read them.",
            _PART)
        self.unattributed = metrics.counter(
            "egress_recreate_unattributed_positions_total",
            "Offset positions fetched across a source topic deleted and created again that "
            "could be either topic's (fetched after the earlier topic's id was last read, "
            "past its last known high watermark): dropped, and read again from the new "
            "topic's oldest record; lost only if they were the earlier topic's "
            "(docs/architecture.md, 'Topic incarnations').", _PART)
        self.log_start_stalled = metrics.gauge(
            "egress_log_start_stalled_partitions",
            "Partitions stopped because their fetch position left the source log and their "
            "log start could not be read for a minute: not replicating; /readyz is false "
            "while any is.", ("region",))
        self.log_start_failures = metrics.counter(
            "egress_log_start_read_failures_total",
            "Reads of a partition's log start (after its position left the source log) that "
            "failed or did not answer in time (each is asked again).", ("region",))
        self.failures = metrics.counter(
            "egress_segment_failures_total",
            "Segments that could not be made durable (aborted; the partition rewinds).",
            (*_PART, "step"))
        self.aborted = metrics.counter(
            "egress_segments_aborted_total",
            "Segments aborted (revoke/shutdown timeout, lost partitions, after a failure).",
            _PART)
        self.temp_leftovers = metrics.counter(
            "egress_temp_delete_failures_total",
            "Temporary objects that could not be deleted (left for the lifecycle rule).",
            ("region",))
        self.commit_failures = metrics.counter(
            "egress_commit_failures_total", "Offset commits that failed after a durable segment.",
            _PART)
        self.dropped = metrics.counter(
            "egress_messages_dropped_total",
            "Messages dropped because their partition is rewinding or no longer assigned "
            "(they are consumed again).", _PART)
        self.seek_failures = metrics.counter(
            "egress_seek_failures_total",
            "Seeks back to a failed segment's start that failed (retried after a backoff).",
            ("region",))
        self.throttled = metrics.counter(
            "egress_throttled_seconds_total", "Seconds the poll loop waited instead of "
            "fetching, held to [egress] max_bytes_per_second.", ("region",))
        self.consume_errors = metrics.counter(
            "egress_consume_errors_total", "Errors reported by the consumer.", ("region",))
        self.buffered = metrics.gauge(
            "egress_buffered_bytes", "Bytes the memory budget charges: open and closing "
            "segments, and the encoders' working memory (what running encodes reserved, or "
            "Arrow's allocations when more).", ("region",))
        self.buffered_peak = metrics.gauge(
            "egress_buffered_bytes_peak", "The most egress_buffered_bytes has been since "
            "the process started (with what encodes reserved between two counts); compare "
            "with [egress] max_buffered_bytes (docs/services.md, \"Egress memory\").", ("region",))
        self.encode_reserved = metrics.gauge(
            "egress_encode_reserved_bytes", "Working memory reserved by the encodes running "
            "now; an encode waits while segments and reservations fill the budget.",
            ("region",))
        self.open_segments = metrics.gauge(
            "egress_open_segments", "Segments open or closing.", ("region",))
        self.build_info = build_info(metrics, "egress", home_region)
        self.heartbeats = metrics.counter(
            "egress_heartbeats_total", "Heartbeat objects written ([egress.topics] "
            "heartbeat_interval; docs/architecture.md, \"Heartbeats\").", ("region", "topic"))
        self.heartbeat_failures = metrics.counter(
            "egress_heartbeat_failures_total", "Heartbeats that could not be written (the "
            "next interval writes again).", ("region",))
        self.assigned = metrics.gauge(
            "egress_assigned_partitions", "Partitions assigned to this process.", ("region",))
        self.paused = metrics.gauge(
            "egress_paused_partitions", "Partitions paused (back-pressure or rewinding).",
            ("region",))
        self.rebalances = metrics.counter(
            "egress_rebalance_events_total", "Partitions assigned, revoked or lost.",
            ("region", "event"))
        self.origin_skipped = metrics.counter(
            "egress_origin_skipped_total",
            "Records not copied because their origin header names a region in "
            "[egress] skip_origins (replicated from there: holes in position space, not "
            "loss).", ("region", "topic", "origin"))
        self.topic_meta_writes = metrics.counter(
            "egress_topic_metadata_writes_total", "_topic.json objects written.",
            ("region", "topic"))
        self.incarnations = metrics.counter(
            "egress_topic_incarnations_total",
            "Source topics found deleted and created again (a new topic id): the new "
            "incarnation's segments go to a location of their own "
            "(docs/architecture.md, \"Topic incarnations\").", ("region", "topic"))

        self.mirror_copies = metrics.counter(
            "egress_mirror_copies_total", "Segments copied into the destination region's "
            "bucket by [egress.mirror] (the low-RPO mode).", ("region", "topic"))
        self.mirror_failures = metrics.counter(
            "egress_mirror_failures_total", "Segment copies into the destination bucket "
            "([egress.mirror]) that failed; each is logged at WARNING with its key and "
            "delivered by S3 replication instead.", ("region", "topic"))
        self.mirror_dropped = metrics.counter(
            "egress_mirror_dropped_total", "Segments not copied into the destination bucket "
            "because max_pending copies were waiting, or abandoned at shutdown ([egress.mirror]); "
            "S3 replication delivers them.", ("region", "topic"))
        self.mirror_pending = metrics.gauge(
            "egress_mirror_pending", "Segment copies into the destination bucket queued or "
            "running ([egress.mirror]).", ("region",))
        self.mirror_seconds = metrics.histogram(
            "egress_mirror_copy_seconds", "From a segment's publish to its copy in the "
            "destination bucket, queueing included ([egress.mirror]).", ("region",),
            buckets=_LATENCY_BUCKETS)

    def for_partition(self, region: str, topic: str, partition: int) -> PartitionMetrics:
        """Label-bound children for one partition (binding once keeps the hot path cheap)."""
        lab = (region, topic, str(partition))
        return PartitionMetrics(
            messages=self.messages.labels(*lab),
            bytes=self.bytes.labels(*lab),
            segment_bytes=self.segment_bytes.labels(*lab),
            segment_size=self.segment_size.labels(region, topic),
            lag=self.lag.labels(*lab),
            lost=self.lost.labels(*lab),
            unattributed=self.unattributed.labels(*lab),
            aborted=self.aborted.labels(*lab),
            commit_failures=self.commit_failures.labels(*lab),
            dropped=self.dropped.labels(*lab),
            temp_leftovers=self.temp_leftovers.labels(region),
            _segments=self.segments,
            _failures=self.failures,
            _labels=lab,
        )


@dataclass
class PartitionMetrics:
    """One partition's metric children."""

    messages: Any
    bytes: Any
    segment_bytes: Any
    segment_size: Any
    lag: Any
    lost: Any
    unattributed: Any
    aborted: Any
    commit_failures: Any
    dropped: Any
    temp_leftovers: Any
    _segments: Any
    _failures: Any
    _labels: tuple[str, str, str]

    def segment_committed(self, reason: str, size: int) -> None:
        self._segments.labels(*self._labels, reason).inc()
        self.segment_bytes.inc(size)
        self.segment_size.observe(size)

    def segment_failed(self, step: str) -> None:
        self._failures.labels(*self._labels, step).inc()
