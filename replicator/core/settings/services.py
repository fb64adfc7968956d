"""The service sections: ``[egress]``, ``[ingress]``, ``[compaction]`` and their per-topic
and per-source tables.
"""

from __future__ import annotations

import re
import string
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, Field, field_validator, model_validator

from replicator.core.errors import KeyFormatError
from replicator.core.keys import check_region, check_topic
from replicator.core.settings.fields import Duration, Model, Size, at_least

# --- egress --------------------------------------------------------------------------



def _topic_name(name: str) -> str:
    """``name`` if it is a legal Kafka topic name, else ``ValueError`` (pydantic names the key)."""
    try:
        return check_topic(name)
    except KeyFormatError as e:
        raise ValueError(str(e)) from e


ORIGIN_HEADER = "replicator.origin"
"""Default name of the origin marker header (docs/architecture.md, "Origin marker")."""

_ORIGIN_HEADER_HELP = (
    "Name of the record header that names the region a record was replicated from "
    "(docs/architecture.md, \"Origin marker\"); ingress's [ingress] origin_header and "
    "egress's [egress] origin_header must be the same.")


def _header_name(name: str) -> str:
    if not name:
        raise ValueError("must not be empty")
    return name


def _region_name(name: str) -> str:
    try:
        return check_region(name)
    except KeyFormatError as e:
        raise ValueError(str(e)) from e


class EgressTopicSettings(Model):
    """Segment thresholds of one source topic (``[egress.topics."name"]``)."""

    max_segment_messages: int = Field(1_000_000, ge=1, description="Close after N messages.")
    max_segment_size: Size = Field(100 * 1024**2, description="Close after N raw record bytes.")
    max_segment_age: Duration = Field(
        timedelta(minutes=5), description="Close this long after the segment's first message.")
    start: Literal["earliest", "latest"] | AwareDatetime = Field(
        "earliest", description="Where a partition without a committed offset starts (a new "
        "deployment on a live cluster, a topic selected later): its oldest record "
        "(earliest: the whole retention window is copied), the end of its log (latest: "
        "only records produced from then on), or the first record at or after a time (a "
        "date-time with its zone, e.g. 2026-11-01T00:00:00Z). A partition with a commit "
        "always resumes from it. A latest or time start is resolved to an offset, "
        "recorded as the partition's first position in _topic.json and committed at once "
        "(marked as a start), so a restart or rebalance before the first segment resumes "
        "there. Ingress starts each partition at that first position (docs/architecture.md, "
        "\"Topic metadata\"), so nothing before it is declared lost; the skipped records "
        "are logged at WARNING with the start offset (docs/configuration.md, \"Where "
        "replication starts\").")
    heartbeat_interval: Duration | None = Field(
        None, description="Write a heartbeat for this topic at this interval (off when "
        "absent): a small object under _heartbeats/ (never a segment) saying which "
        "partitions egress had nothing more of, and up to where, so the destination tells "
        "a quiet topic from a replication that stopped (ingress: "
        "replicator_ingress_heartbeat_age_seconds, the lag gauge; docs/architecture.md, "
        "\"Heartbeats\"). One PUT per interval per egress instance (and its replication).")

    @field_validator("max_segment_size")
    @classmethod
    def _size_ok(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be at least 1 byte")
        return v

    @field_validator("start", mode="before")
    @classmethod
    def _start_ok(cls, v: Any) -> Any:
        # One clear message instead of one per member of the union.
        if v in ("earliest", "latest"):
            return v
        when = v
        if isinstance(v, str):
            try:
                when = datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                when = None
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError('must be "earliest", "latest" or a date-time with its zone '
                             f"(e.g. 2026-11-01T00:00:00Z), got {v!r}")
        return when

    @field_validator("max_segment_age")
    @classmethod
    def _age_ok(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be positive")
        return v

    @field_validator("heartbeat_interval")
    @classmethod
    def _heartbeat_ok(cls, v: timedelta | None) -> timedelta | None:
        if v is not None and v < timedelta(seconds=1):
            raise ValueError("must be at least 1s (or absent: no heartbeats)")
        return v


class EgressSelectSettings(Model):
    """Topics selected by name pattern (``[egress.select]``)."""

    include: list[str] = Field(
        default_factory=list, description="Regular expressions matched against whole topic "
        "names (\"sensor\\\\..*\" selects sensor.a, not my.sensor.a); a topic matching any is "
        "replicated, with [egress.topic_defaults]. Internal topics (__*, _schemas, the "
        "replicator's checkpoint, event and offset-map topics, under their default names "
        "and those this file's [ingress] gives them) are never selected by a pattern, only "
        "by an [egress.topics.\"NAME\"] table; other names starting with _ are ordinary "
        "topics. Ingress's topic_pattern follows the same rule. Checked every "
        "topic_metadata_interval.")
    exclude: list[str] = Field(
        default_factory=list, description="Regular expressions (whole names) of topics that "
        "include must not select. [egress.topics.\"NAME\"] tables win over both lists.")

    @field_validator("include", "exclude")
    @classmethod
    def _patterns_ok(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"{pattern!r} is not a regular expression: {e}") from e
        return v


class GroupExportSettings(Model):
    """Which source consumer groups' committed offsets egress exports to S3
    (``[egress.group_export]``; docs/failover.md).
    """

    enabled: bool = Field(True, description="Export the committed offsets of source consumer "
                                            "groups for the replicated topics, so they can be "
                                            "translated in the destination after a failover.")
    include: list[str] = Field(
        default_factory=lambda: [".*"], description="Regular expressions matched against "
        "whole group ids; a group matching any is exported (default: every group that "
        "committed offsets for a replicated topic, with active members or not). Egress's own "
        "group is never exported.")
    exclude: list[str] = Field(
        default_factory=list, description="Regular expressions (whole group ids) of groups "
        "include must not select, e.g. an ingress group_id of the opposite direction in an "
        "active-active pair.")
    interval: Duration = Field(
        timedelta(seconds=30), description="How often the groups' offsets are read; an "
                                           "export is written only when it changed.")

    @field_validator("include", "exclude")
    @classmethod
    def _patterns_ok(cls, v: list[str]) -> list[str]:
        return EgressSelectSettings._patterns_ok(v)

    @field_validator("interval")
    @classmethod
    def _interval_ok(cls, v: timedelta) -> timedelta:
        if v.total_seconds() < 1:
            raise ValueError(f"must be at least 1s, got {v}")
        return v


class EgressMirrorSettings(Model):
    """The low-RPO mode (``[egress.mirror]``; docs/sizing.md, "Low-RPO mode"): each segment
    is also copied server-side into the destination region's bucket right after it is
    published, without waiting for S3 replication.
    """

    bucket: str = Field(description="The destination region's bucket (the one ingress "
                                    "reads; S3 replication into it stays on as the backstop).")
    region: str = Field(description="AWS region of the destination bucket: the CopyObject "
                                    "requests go to that region's endpoint.")
    endpoint_url: str | None = Field(
        None, description="Endpoint of an S3-compatible store for the destination bucket "
                          "(default: AWS's endpoint of region).")
    threads: int = Field(2, ge=1, le=16, description="Copies running at once (a pool of "
                                                     "its own, apart from upload_threads).")
    max_pending: int = Field(
        1000, ge=1, le=100_000, description="Copies queued or running at most; a segment "
        "published while that many wait is not mirrored (WARNING, "
        "replicator_egress_mirror_dropped_total): S3 replication delivers it. Memory: one "
        "key each.")
    shutdown_timeout: Duration = Field(
        timedelta(seconds=5), description="On shutdown, how long queued copies get to "
        "finish; those still queued then are abandoned (logged with their count; S3 "
        "replication delivers them).")

    @field_validator("bucket")
    @classmethod
    def _bucket_ok(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", v):
            raise ValueError(f"{v!r} is not an S3 bucket name (3-63 characters: lower-case "
                             "letters, digits, dots and hyphens)")
        return v

    @field_validator("region")
    @classmethod
    def _region_ok(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9-]+", v):
            raise ValueError(f"{v!r} is not an AWS region name (e.g. us-west-2)")
        return v

    @field_validator("shutdown_timeout")
    @classmethod
    def _shutdown_ok(cls, v: timedelta) -> timedelta:
        if v < timedelta(0):
            raise ValueError("must not be negative (0: abandon every queued copy at once)")
        return v


class EgressSettings(Model):
    """The egress controller (``[egress]``)."""

    group_id: str = Field("replicator.egress", description="Consumer group of egress workers.")
    topics: dict[str, EgressTopicSettings] = Field(
        default_factory=dict, description="Source topics named explicitly, each with its "
        "segment thresholds: keys a table leaves out come from [egress.topic_defaults]. "
        "Replicated whether or not [egress.select] matches them.")
    select: EgressSelectSettings = Field(
        default_factory=EgressSelectSettings,
        description="Topics selected by pattern (include/exclude).")
    topic_defaults: EgressTopicSettings = Field(
        default_factory=EgressTopicSettings,
        description="Segment thresholds of selected topics, and of [egress.topics.\"NAME\"] "
                    "keys a table leaves out.")
    max_buffered_bytes: Size = Field(
        256 * 1024**2, description="Memory budget of the records this process buffers: "
                                   "librdkafka's prefetch gets 1/32 of it (at least 2 MiB), "
                                   "1/8 (at most 32 MiB) is kept for memory nothing counts, "
                                   "open and closing segments and Arrow's allocations (the "
                                   "Parquet encoders) get the rest (docs/services.md, "
                                   "\"Egress memory\").")
    shutdown_timeout: Duration = Field(
        timedelta(seconds=30), description="On revoke/SIGTERM, open segments that cannot be made "
                                           "durable within this time are aborted (at least "
                                           "1s).")
    topic_metadata_interval: Duration = Field(
        timedelta(minutes=1), description="How often partition counts and topic configs "
                                          "are checked for _topic.json (rewritten when "
                                          "either changed), and topics are matched against "
                                          "[egress.select] (new ones picked up, deleted "
                                          "ones released; at least 1s).")
    upload_threads: int = Field(4, ge=1, le=64, description="Parallel S3 uploads.")
    max_bytes_per_second: Size = Field(
        0, description="Records read from the source cluster by this process, in raw bytes "
        "(key + value + headers) per second, over all its partitions: a token bucket with "
        "one second of burst, so over a minute the rate stays within a few percent of it. "
        "0: unlimited. Time held back: replicator_egress_throttled_seconds_total.")
    group_export: GroupExportSettings = Field(
        default_factory=GroupExportSettings,
        description="Source consumer-group offsets exported next to the segments "
                    "(docs/failover.md).")
    memory_pool: Literal["system", "mimalloc", "jemalloc"] = Field(
        "system", description="Arrow allocator of the egress process, the Parquet encoders' "
                              "included (replicator-egress sets ARROW_DEFAULT_MEMORY_POOL "
                              "before pyarrow loads; a value already in the environment "
                              "wins). 'system' keeps RSS close to max_buffered_bytes "
                              "whatever the partition count; mimalloc keeps freed memory "
                              "per thread.")
    release_freed_memory: bool = Field(
        True, description="Fix glibc's mmap and trim thresholds at 128 KiB, so freed column "
                          "buffers and encoder pages go back to the system instead of "
                          "staying in per-thread arenas: RSS growth stays within about 1.5 "
                          "x max_buffered_bytes, at about a third more egress CPU per GB "
                          "(every large buffer is a fresh mapping). false: glibc's own "
                          "thresholds, faster, RSS growth up to about 1.8 x the budget "
                          "(bench/RESULTS.md, \"Allocators and the flush size\"). "
                          "MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ in the "
                          "environment win.")
    skip_origins: list[str] = Field(
        default_factory=list, description="Regions whose replicated records egress does not "
        "copy: a record is skipped when one of its origin_header headers names one of them "
        "(active-active without loops: list the regions this region's ingress replays "
        "from, with [ingress] mark_origin = true there; docs/topologies.md). A skipped "
        "record is a hole in position space, like a transaction marker, never loss. Empty: "
        "every record is copied and headers are not looked at.")
    origin_header: str = Field(ORIGIN_HEADER, description=_ORIGIN_HEADER_HELP)
    mirror: EgressMirrorSettings | None = Field(
        None, description="Also copy each segment into the destination region's bucket as "
        "soon as it is published (the low-RPO mode; off when absent; docs/sizing.md, "
        "\"Low-RPO mode\").")

    @field_validator("shutdown_timeout")
    @classmethod
    def _shutdown_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(seconds=1), "0 aborts every open segment at a revoke")

    @field_validator("topic_metadata_interval")
    @classmethod
    def _metadata_interval_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(seconds=1), "each check asks Kafka and S3")

    @field_validator("skip_origins")
    @classmethod
    def _origins_ok(cls, v: list[str]) -> list[str]:
        for region in v:
            _region_name(region)
        return v

    @field_validator("origin_header")
    @classmethod
    def _origin_header_ok(cls, v: str) -> str:
        return _header_name(v)

    @field_validator("max_bytes_per_second")
    @classmethod
    def _rate_ok(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"must be 0 (unlimited) or a positive size, got {v}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _apply_topic_defaults(cls, data: Any) -> Any:
        # A [egress.topics."NAME"] table overrides [egress.topic_defaults] key by key.
        if not isinstance(data, dict):
            return data
        defaults, topics = data.get("topic_defaults"), data.get("topics")
        if not isinstance(defaults, dict) or not isinstance(topics, dict):
            return data
        merged = {t: ({**defaults, **table} if isinstance(table, dict) else table)
                  for t, table in topics.items()}
        return {**data, "topics": merged}

    @field_validator("topics")
    @classmethod
    def _topics_ok(cls, v: dict[str, EgressTopicSettings]) -> dict[str, EgressTopicSettings]:
        for t in v:
            _topic_name(t)
        return v

    @model_validator(mode="after")
    def _something_selected(self) -> EgressSettings:
        if not self.topics and not self.select.include:
            raise ValueError("topics: name at least one topic, or give select.include")
        return self

    def topic_settings(self, topic: str) -> EgressTopicSettings:
        """The segment thresholds of ``topic``: its table, else ``topic_defaults``."""
        return self.topics.get(topic, self.topic_defaults)


# --- ingress -------------------------------------------------------------------------


_TEMPLATE_FIELDS = frozenset({"topic", "region"})


class IngressSourceSettings(Model):
    """One replicated source (``[[ingress.sources]]``): a topic, or a set of topics."""

    region: str = Field(description="Region the source topic lives in.")
    topic: str | None = Field(None, description="Source topic name (or give topic_pattern).")
    topic_pattern: str | None = Field(
        None, description="Instead of topic: a regular expression matched against whole "
        "topic names of the source region; every topic of the region whose _topic.json or "
        "segments appear in the bucket and that matches is replicated as if it were named "
        "by topic (found every topic_check_interval, and at once when a segment event of "
        "an unknown topic arrives; no restart). A topic named by an entry with topic wins. "
        "The rule of [egress.select] include: internal topics (__*, _schemas, the "
        "replicator's checkpoint, event and offset-map topics) are never selected by a "
        "pattern, only by an entry with topic; other names starting with _ are.")
    destination_topic: str | None = Field(
        None, description="Destination topic (default: the source topic's name). A "
        "template: {topic} is the source topic's name, {region} the source region "
        "(\"{topic}.copy\", \"{region}.{topic}\"). Several regions may feed one "
        "destination topic (aggregation); two topics of one region may not: two entries "
        "with topic stop the process at start (exit 2, naming both); topics a pattern "
        "finds are refused, with an ERROR and replicator_ingress_sources_refused_total, "
        "when an entry with topic of their region feeds that destination, and all of "
        "them when several share it (decided from the topics in the bucket alone, the same "
        "on every instance; docs/topologies.md).")
    lost_segment_timeout: Duration = Field(
        timedelta(hours=24), description="How long a gap waits before it is declared lost. "
        "The default outlasts a regional incident: S3 replicates what was pending once the "
        "region is back, and a FAILED replication waits for an operator's re-drive; RTC's "
        "15 minutes is a target, not a bound. The partition's later records wait behind "
        "the gap meanwhile (alert ReplicatorIngressNoProgress). A segment that arrives "
        "after its range was declared lost is logged at ERROR with the replicator restore "
        "command that brings it back (docs/runbooks.md, \"What decides RPO and RTO\"). "
        "At least 100ms.")
    late_segment_retries: int = Field(5, description="Segment list reloads within the timeout.")
    first_segment_delay: Duration = Field(
        timedelta(minutes=5), description="Without a checkpoint: how long to wait for "
        "earlier segments when egress records no first positions (or start = "
        "\"earliest-available\"), and, when it does, how long a partition's missing entry is "
        "waited for once its segments are in the bucket and a _topic.json written after "
        "them still lacks it (then ERROR naming the partition, and the replay starts at "
        "the earliest segment known; gauge replicator_ingress_first_position_waiting "
        "meanwhile; docs/configuration.md, \"Where replication starts\").")
    start: Literal["first-position", "earliest-available", "latest"] = Field(
        "first-position", description="Without a checkpoint: start at the partition's first "
                                      "position recorded by egress in _topic.json, waiting "
                                      "for its segment like any gap (first-position), at "
                                      "the earliest segment known after first_segment_delay "
                                      "(earliest-available), or after the newest segment "
                                      "in the bucket when the partition is first replayed "
                                      "(latest: the history is skipped, logged with its "
                                      "range and counted, and checkpointed so a restart "
                                      "does not move it).")

    @field_validator("lost_segment_timeout")
    @classmethod
    def _lost_timeout_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(milliseconds=100),
                        "0 declares every late segment lost at once")

    @field_validator("late_segment_retries")
    @classmethod
    def _retries_ok(cls, v: int) -> int:
        if not 1 <= v <= 50:
            raise ValueError(f"must be between 1 and 50, got {v}")
        return v

    @field_validator("topic")
    @classmethod
    def _topic_ok(cls, v: str | None) -> str | None:
        return None if v is None else _topic_name(v)

    @field_validator("topic_pattern")
    @classmethod
    def _pattern_ok(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"{v!r} is not a regular expression: {e}") from e
        return v

    @field_validator("destination_topic")
    @classmethod
    def _template_ok(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(v) if name is not None}
        except ValueError as e:
            raise ValueError(f"{v!r} is not a valid template: {e}") from e
        unknown = fields - _TEMPLATE_FIELDS
        if unknown:
            raise ValueError(f"{v!r} uses {', '.join(sorted(unknown))}: only {{topic}} and "
                             "{region} can be used")
        # Whatever the names, the fixed parts must be legal in a topic name.
        _topic_name(v.format(topic="t", region="r"))
        return v

    @field_validator("region")
    @classmethod
    def _region_ok(cls, v: str) -> str:
        try:
            return check_region(v)
        except KeyFormatError as e:
            raise ValueError(str(e)) from e

    @model_validator(mode="after")
    def _topic_or_pattern(self) -> IngressSourceSettings:
        if (self.topic is None) == (self.topic_pattern is None):
            raise ValueError("give exactly one of topic and topic_pattern")
        if self.topic is not None:
            self.destination_for(self.topic)   # a ValueError names the entry
        return self

    @property
    def name(self) -> str:
        """The source topic of an entry with ``topic`` (discovered entries have one too)."""
        if self.topic is None:
            raise ValueError(f"source {self.region}/{self.topic_pattern!r} is a pattern")
        return self.topic

    @property
    def destination(self) -> str:
        """The destination topic name of an entry with ``topic``."""
        return self.destination_for(self.name)

    def destination_for(self, topic: str) -> str:
        """The destination of source topic ``topic`` (the template filled in).

        Raises:
            ValueError: the name it gives is not a legal topic name.
        """
        template = self.destination_topic or "{topic}"
        return _topic_name(template.format(topic=topic, region=self.region))

    def matches(self, topic: str) -> bool:
        """True when ``topic`` is this entry's topic, or matches its pattern (whole name)."""
        if self.topic_pattern is None:
            return topic == self.topic
        return re.fullmatch(self.topic_pattern, topic) is not None

    def for_topic(self, topic: str) -> IngressSourceSettings:
        """This pattern entry as an entry naming ``topic`` (a discovered source)."""
        return self.model_copy(update={"topic": topic, "topic_pattern": None,
                                       "destination_topic": self.destination_for(topic)})


class IngressSettings(Model):
    """The ingress controller (``[ingress]``)."""

    group_id: str = Field("replicator.ingress", description="Consumer group of ingress workers.")
    sqs_queue: str = Field(description="SQS queue (name or URL) receiving the bucket's events.")
    sqs_endpoint_url: str | None = Field(None, description="SQS endpoint (default: AWS / "
                                                           "s3.endpoint_url).")
    segment_events_topic: str = Field("replicator.segmentevents", description="Events topic.")
    segment_events_retention: Duration = Field(timedelta(hours=1),
                                               description="Its retention (at least 1m).")
    checkpoint_topic: str = Field("replicator.checkpoint", description="Checkpoint topic.")
    offset_map: bool = Field(
        True, description="Exactly-once only: write, in each transaction, where its "
        "records landed in the destination (the offset map), so consumer groups can be "
        "translated after a failover (docs/failover.md). Costs two delivery callbacks and "
        "about 100 bytes per produced batch.")
    offset_map_topic: str = Field(
        "replicator.offsetmap", description="Compacted topic of the offset map: where each "
        "replayed batch of source records landed in the destination, read by `replicator "
        "groups` to translate consumer-group offsets (docs/failover.md).")
    delivery: Literal["exactly-once", "at-least-once"] = Field(
        "exactly-once", description="Transactional or idempotent replay.")
    batch_size: int = Field(10_000, ge=1, description="Records per produced batch/transaction.")
    batch_bytes: Size = Field(
        4 * 1024**2, ge=1, description="Record bytes (key + value + headers) per produced "
                                       "batch/transaction, whichever of this and batch_size "
                                       "comes first (a larger record goes alone).")
    sources: list[IngressSourceSettings] = Field(description="Sources to replay.")
    sqs_wait_time: Duration = Field(
        timedelta(seconds=20), description="SQS long-poll wait per receive (at most 20s).")
    sqs_max_messages: int = Field(10, ge=1, le=10, description="SQS messages per receive.")
    topic_check_interval: Duration = Field(
        timedelta(seconds=30), description="How often _topic.json of each source is read to "
                                           "create or grow its destination topic (at least "
                                           "100ms).")
    rescan_interval: Duration = Field(
        timedelta(minutes=5), description="An idle worker re-lists its segments this often "
                                          "(a safety net for lost S3 events; at least 100ms).")
    revoke_timeout: Duration = Field(
        timedelta(seconds=30), description="On revoke/SIGTERM, how long workers may take to "
                                           "finish their current batch (at least 100ms).")
    align_destination_configs: bool = Field(
        False, description="Set an existing destination topic's retention, cleanup policy, "
                           "max.message.bytes and timestamp type like its source's when they "
                           "could lose data (a topic fed by one source only); otherwise "
                           "they are reported (ERROR + metric).")
    max_parallel_replays: int = Field(
        8, ge=1, description="Segments read and decoded at once by this process (the replay "
                             "pool has this many + 4 threads), whatever the number of "
                             "partitions. In exactly-once mode a partition whose batch waits "
                             "for its transaction gives its slot back once its segment is "
                             "read, so one transaction carries the batches of many "
                             "partitions.")
    max_bytes_in_flight: Size = Field(
        64 * 1024**2, ge=1, description="Exactly-once: record bytes (key + value + headers) "
                                        "decoded and not yet committed, over all partitions "
                                        "of the process (each partition holds at most the "
                                        "batch in its transaction and one read ahead). A "
                                        "partition waits for bytes before it reads a batch "
                                        "(batch_bytes are asked for, the batch's size kept); "
                                        "a record larger than batch_bytes may pass the bound "
                                        "by itself.")
    mark_origin: bool = Field(
        False, description="Append a header origin_header = the source region's name "
        "(UTF-8) to every replayed record, after its own headers, so the egress of this "
        "region can skip it (skip_origins) and active-active replication never loops "
        "(docs/topologies.md). Off: records are copied byte for byte.")
    origin_header: str = Field(ORIGIN_HEADER, description=_ORIGIN_HEADER_HELP)
    producers: int = Field(
        1, ge=1, le=16, description="Exactly-once: transactional producers of this process "
                                    "(destination partition p is written by producer p % "
                                    "producers). More keep several transactions in flight "
                                    "when broker round trips are slow; each costs a few "
                                    "client threads and connections, not per partition.")
    transaction_linger: Duration = Field(
        timedelta(milliseconds=50),
        description="Exactly-once: how long a transactional producer waits, once a batch "
        "is ready, for more batches before it begins a transaction. The "
        "batches that partitions hand over just after a commit then share one transaction "
        "(one flush, one offsets call, one commit) instead of several; each batch waits up "
        "to this much longer (bench/RESULTS.md, \"Small records and many partitions: "
        "ingress\"). 0: begin at once.")
    max_bytes_per_second: Size = Field(
        0, description="Records produced into the destination cluster by this process, in "
        "raw bytes (key + value + headers) per second, over all its partitions: a token "
        "bucket with one second of burst (exactly-once: a transaction takes only the "
        "batches the tokens cover, at least one, and is never held open while throttled). "
        "0: unlimited. Time held back: replicator_ingress_throttled_seconds_total.")
    instance_id: str | None = Field(
        None, description="Names this process in the transactional.ids of its producers "
                          "({group_id}.{instance_id}.{n}): unique among the group's live "
                          "processes and the same across restarts of one instance, so a "
                          "restarted process fences its own former run at once. Default: "
                          "group.instance.id of kafka.config, else the host name (a pod's "
                          "name).")

    @field_validator("origin_header")
    @classmethod
    def _origin_header_ok(cls, v: str) -> str:
        return _header_name(v)

    @field_validator("max_bytes_per_second")
    @classmethod
    def _rate_ok(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"must be 0 (unlimited) or a positive size, got {v}")
        return v

    @field_validator("topic_check_interval", "rescan_interval")
    @classmethod
    def _intervals_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(milliseconds=100), "0 lists the bucket in a loop")

    @field_validator("revoke_timeout")
    @classmethod
    def _revoke_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(milliseconds=100),
                        "0 purges every batch in flight at a revoke")

    @field_validator("segment_events_retention")
    @classmethod
    def _events_retention_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(minutes=1),
                        "the events must outlive a worker's restart to be read")

    @field_validator("transaction_linger")
    @classmethod
    def _linger_ok(cls, v: timedelta) -> timedelta:
        if not timedelta(0) <= v <= timedelta(seconds=10):
            raise ValueError(f"must be between 0s and 10s, got {v}")
        return v

    @field_validator("instance_id")
    @classmethod
    def _instance_id_ok(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", v):
            raise ValueError("must be 1-200 characters of A-Z a-z 0-9 . _ -")
        return v

    @field_validator("sqs_wait_time")
    @classmethod
    def _sqs_wait_ok(cls, v: timedelta) -> timedelta:
        # SQS long polls 1-20 whole seconds; 0 would make the relay spin on short polls.
        if not timedelta(seconds=1) <= v <= timedelta(seconds=20) or v.microseconds:
            raise ValueError(f"must be whole seconds between 1s and 20s, got {v}")
        return v

    @field_validator("sources")
    @classmethod
    def _one_topic_per_destination(cls, v: list[IngressSourceSettings]
                                   ) -> list[IngressSourceSettings]:
        # Two topics of one region in one destination topic would interleave with no
        # common order (docs/topologies.md); several regions into one topic is fan-in.
        # Pattern entries are decided when their topics are found (core/topic_sets.py).
        feeds: dict[tuple[str, str], tuple[int, IngressSourceSettings]] = {}
        for i, s in enumerate(v):
            if s.topic is None:
                continue
            first = feeds.setdefault((s.region, s.destination), (i, s))
            if first[1] is not s and first[1].topic != s.topic:
                raise ValueError(
                    f"ingress.sources.{first[0]} ({s.region}/{first[1].topic}) and "
                    f"ingress.sources.{i} ({s.region}/{s.topic}) both replicate into "
                    f"destination topic {s.destination!r}: two topics of one region cannot "
                    "share a destination (several regions can); give one of them another "
                    "destination_topic")
        return v

    @model_validator(mode="after")
    def _unique_sources(self) -> IngressSettings:
        seen: set[tuple[str, str | None, str | None]] = set()
        for s in self.sources:
            entry = (s.region, s.topic, s.topic_pattern)
            if entry in seen:
                raise ValueError(f"source {s.region}/{s.topic or s.topic_pattern} is listed "
                                 "twice")
            seen.add(entry)
        if not self.sources:
            raise ValueError("sources: name at least one source")
        return self


# --- compaction ----------------------------------------------------------------------


class CompactionTopicSettings(Model):
    """Compaction thresholds of one topic (``[compaction.topics."name"]``)."""

    min_level: int = Field(0, ge=0, description="Lowest input level.")
    max_level: int = Field(0, ge=0, description="Highest input level.")
    min_segment_age: Duration = Field(timedelta(hours=1), description="Only older inputs.")
    min_segment_count: int = Field(10, ge=1, description="Skip runs with fewer inputs.")
    min_segment_size: Size = Field(1024**3, description="Skip runs with fewer bytes.")
    max_segment_count: int = Field(1000, ge=1, description="Inputs per output, at most.")
    max_segment_size: Size = Field(4 * 1024**3, description="Bytes per output, at most.")
    batch_size: int = Field(10_000, ge=1, description="Records per streamed batch.")
    delete: bool = Field(True, description="Delete inputs after the output is durable.")

    @model_validator(mode="after")
    def _combination_ok(self) -> CompactionTopicSettings:
        if self.min_level > self.max_level:
            raise ValueError(f"min_level ({self.min_level}) > max_level ({self.max_level})")
        if self.min_segment_count > self.max_segment_count:
            raise ValueError(f"min_segment_count ({self.min_segment_count}) > "
                             f"max_segment_count ({self.max_segment_count})")
        if self.min_segment_size > self.max_segment_size:
            raise ValueError(f"min_segment_size ({self.min_segment_size}) > "
                             f"max_segment_size ({self.max_segment_size})")
        return self


class CompactionSettings(Model):
    """The compaction job (``[compaction]``)."""

    schedule: str = Field("0 1 * * *", description="Cron: 5 fields, or 6 fields seconds-first.")
    parallelism: int = Field(8, ge=1, description="Merge tasks run at once.")
    spark_master: str = Field(
        "local[*]", description="Spark master URL (local[*], spark://..., k8s://...); "
                                "\"inline\" merges in this process without Spark; \"\" "
                                "takes the master from spark-submit.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings.")
    lock_ttl: Duration = Field(timedelta(hours=2),
                               description="Expiry of the region lock (at least 1s).")
    replication_grace: Duration | None = Field(
        None, description="Inputs are deleted once their output replicated (S3 "
        "replication status COMPLETED; FAILED is an ERROR and the inputs stay until the "
        "replication is re-driven, docs/deploy.md). On a store that reports no status "
        "(replicator sync, no replication rule), once the output is this old; unset, such "
        "inputs are never deleted. Set it above the sync's lag, or to \"0s\" where nothing "
        "replicates.")
    topics: dict[str, CompactionTopicSettings] = Field(description="Topics to compact.")

    @field_validator("lock_ttl")
    @classmethod
    def _lock_ttl_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(seconds=1), "a lock born expired locks nothing")

    @field_validator("schedule")
    @classmethod
    def _cron_ok(cls, v: str) -> str:
        from replicator.core.cron import parse_cron  # local: croniter only when validating

        parse_cron(v)
        return v

    @field_validator("topics")
    @classmethod
    def _topics_ok(cls, v: dict[str, CompactionTopicSettings]) -> dict[str, Any]:
        for t in v:
            _topic_name(t)
        return v
