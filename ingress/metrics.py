"""Ingress metrics (docs/metrics.md), created once per ``Metrics`` registry.

Per source partition (labels ``region``, ``topic``, ``partition`` of the *source*):
messages produced, replication lag, checkpoint offset, segments waiting/late/lost,
messages lost, missing and corrupt segments. Per process: SQS events received, ignored
and invalid, segment events read, source errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ingress.replica_stall import stalled_gauge
from replicator.core.metrics import Metrics, build_info

PART = ("region", "topic", "partition")
SOURCE = ("region", "topic")


@dataclass
class IngressMetrics:
    """The metric objects of one ingress controller."""

    messages_produced: Any
    replication_lag: Any
    last_progress: Any
    checkpoint_offset: Any
    source_not_started: Any
    segments_waiting: Any
    segments_late: Any
    first_position_waiting: Any
    late_gaps: Any
    segments_lost: Any
    messages_lost: Any
    messages_skipped: Any
    late_after_lost: Any
    segments_replayed: Any
    segments_missing: Any
    segments_corrupt: Any
    transactions_aborted: Any
    worker_errors: Any
    sqs_received: Any
    sqs_events: Any
    sqs_ignored: Any
    sqs_invalid: Any
    events_read: Any
    events_invalid: Any
    source_errors: Any
    source_stopped: Any
    sources_refused: Any
    destination_config_mismatch: Any
    partition_stalled: Any
    partition_refused: Any
    records_refused: Any
    transactions: Any
    offset_map_entries: Any
    offset_map_unmapped: Any
    build_info: Any
    heartbeat_age: Any
    throttled: Any
    topic_incarnations: Any
    destination_stalled: Any
    series_owners: dict[tuple[str, ...], object] = field(default_factory=dict)
    """Which ``PartitionFreshness`` owns a partition's lag and progress series: a worker
    that ends after its successor started (a missed revoke deadline) leaves them alone."""

    @classmethod
    def create(cls, m: Metrics, home_region: str = "") -> IngressMetrics:
        """Register every ingress metric in ``m``."""
        return cls(
            messages_produced=m.counter("ingress_messages_produced_total",
                                        "Records produced to the destination.", PART),
            replication_lag=m.gauge(
                "ingress_replication_lag_seconds",
                "Now (at the scrape) minus the time the destination is known fresh "
                "through: the source timestamp of the last record produced (after a "
                "restart, until one is: the resumed checkpoint's time), or the newest "
                "egress heartbeat this partition has replayed up to; grows while nothing "
                "arrives (docs/operations.md, \"Alerts: lag and progress\").", PART),
            last_progress=m.gauge(
                "ingress_last_progress_timestamp_seconds",
                "When the partition's replay position last moved (or its worker started), "
                "seconds since the epoch.", PART),
            source_not_started=m.gauge(
                "ingress_source_not_started",
                "1 while a source topic has no _topic.json in this region's bucket (egress "
                "never wrote one, or bucket replication does not bring it: a replication "
                "rule's filter, a KMS key it cannot use), 0 once it has; exported for every "
                "source from ingress's start, before any record arrives.", SOURCE),
            checkpoint_offset=m.gauge("ingress_checkpoint_offset",
                                      "Last source offset checkpointed.", PART),
            segments_waiting=m.gauge("ingress_segments_waiting",
                                     "Known segments not yet replayed.", PART),
            first_position_waiting=m.gauge(
                "ingress_first_position_waiting",
                "1 while a partition without a checkpoint has segments but egress has not "
                "recorded where its history begins (first_positions in _topic.json): nothing "
                "is replayed meanwhile (then ERROR, and the replay starts at the earliest "
                "segment known: docs/configuration.md, \"Where replication starts\").",
                PART),
            segments_late=m.gauge("ingress_segments_late",
                                  "Positions of the gap currently waited for (0: none).", PART),
            late_gaps=m.counter("ingress_late_gaps_total",
                                "Gaps (late segments) detected.", PART),
            segments_lost=m.counter("ingress_segments_lost_total",
                                    "Ranges declared lost after lost_segment_timeout.", PART),
            messages_lost=m.counter("ingress_messages_lost_total",
                                    "Offset positions declared lost (an upper bound of the "
                                    "messages lost).", PART),
            messages_skipped=m.counter("ingress_messages_skipped_total",
                                       "Positions of segments that arrived below where the "
                                       "first replay without a checkpoint started (never "
                                       "replayed).", PART),
            late_after_lost=m.counter(
                "ingress_late_after_lost_messages_total",
                "Positions of segments that arrived after their range was declared lost "
                "(not replayed; the ERROR line gives the replicator restore command that "
                "brings them back).", PART),
            segments_replayed=m.counter("ingress_segments_replayed_total",
                                        "Segments replayed to their end.", PART),
            segments_missing=m.counter("ingress_segments_missing_total",
                                       "Segments gone when read (compacted or deleted).", PART),
            segments_corrupt=m.counter("ingress_segments_corrupt_total",
                                       "Segments that could not be read (skipped).", PART),
            transactions_aborted=m.counter("ingress_transactions_aborted_total",
                                           "Transactions aborted (redone from the checkpoint).",
                                           PART),
            worker_errors=m.counter("ingress_worker_errors_total",
                                    "Replay sessions ended by an error, by kind.",
                                    (*PART, "kind")),
            sqs_received=m.counter("ingress_sqs_messages_received_total",
                                   "SQS messages received."),
            sqs_events=m.counter("ingress_sqs_events_received_total",
                                 "Segment events received from SQS, by kind.", ("kind",)),
            sqs_ignored=m.counter("ingress_sqs_events_ignored_total",
                                  "S3 event records that are not ours, by reason.", ("reason",)),
            sqs_invalid=m.counter("ingress_sqs_events_invalid_total",
                                  "SQS messages or records that could not be parsed, by reason.",
                                  ("reason",)),
            events_read=m.counter("ingress_segment_events_read_total",
                                  "Events read from the segment-events topic."),
            events_invalid=m.counter("ingress_segment_events_invalid_total",
                                     "Segment-events topic records that could not be parsed."),
            source_errors=m.counter("ingress_source_errors_total",
                                    "Sources that cannot be replayed, by reason.",
                                    (*SOURCE, "reason")),
            source_stopped=m.gauge("ingress_source_stopped",
                                   "1 while a source is stopped by an error.", SOURCE),
            sources_refused=m.counter(
                "ingress_sources_refused_total",
                "Topics a topic_pattern matched that are not replicated: a named source of "
                "the same region feeds their destination, or another topic of the region "
                "matches into it too (all of them are refused; one replicated until then "
                "stops), or it is no legal topic name (counted when a topic becomes "
                "refused).", SOURCE),
            partition_stalled=m.gauge(
                "ingress_partition_stalled",
                "1 while a partition's producer keeps being fenced although this process "
                "owns it (retrying; /readyz is false meanwhile).", PART),
            partition_refused=m.gauge(
                "ingress_partition_refused",
                "1 while a partition is stopped at a record its destination refuses for good "
                "(larger than max.message.bytes, invalid, not authorised): nothing after it "
                "is produced; retried on a slow backoff and when the destination topic's "
                "configs change.", PART),
            records_refused=m.counter(
                "ingress_records_refused_total",
                "Attempts the destination refused a record of the partition for good (each "
                "retry of the stopped partition counts).", PART),
            destination_config_mismatch=m.gauge(
                "ingress_destination_config_mismatch",
                "1 while a destination topic config can lose what its source keeps "
                "(retention, cleanup policy, message size, timestamp type).",
                ("topic", "config")),
            transactions=m.counter(
                "ingress_transactions_total",
                "Transactions of the process's shared producer, by outcome: committed, "
                "aborted (redone), fenced (producer fenced: recreated), generation (the "
                "placement group's generation moved on: never committed), revoked (a "
                "partition of it was revoked before the commit).", ("outcome",)),
            offset_map_entries=m.counter(
                "ingress_offset_map_entries_total",
                "Offset-map entries written with the records they describe "
                "(docs/failover.md)."),
            offset_map_unmapped=m.counter(
                "ingress_offset_map_unmapped_batches_total",
                "Batches whose records did not land at consecutive destination offsets: no "
                "map entry, so consumer groups cannot be translated in that range.",
                ("topic",)),
            build_info=build_info(m, "ingress", home_region),
            heartbeat_age=m.gauge(
                "ingress_heartbeat_age_seconds",
                "Now (at the scrape) minus the newest egress heartbeat of a source topic "
                "in the bucket (sources whose egress writes heartbeats: [egress.topics] "
                "heartbeat_interval); grows when heartbeats stop arriving.", SOURCE),
            throttled=m.counter(
                "ingress_throttled_seconds_total",
                "Seconds the producers waited before producing, held to [ingress] "
                "max_bytes_per_second.", ("region",)),
            topic_incarnations=m.counter(
                "ingress_topic_incarnations_total",
                "Source partitions whose replay moved on to the next incarnation of their "
                "topic (deleted and created again) after the earlier one's records "
                "(docs/architecture.md, \"Topic incarnations\").", PART),
            destination_stalled=stalled_gauge(m),
        )
