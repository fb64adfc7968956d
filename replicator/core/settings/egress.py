"""The ``[egress]`` section and its tables: per-topic segment thresholds, topic selection
by pattern, consumer-group export and the low-RPO mirror.

Separate from the ``[ingress]`` and ``[compaction]`` sections (``ingress.py``,
``compaction.py``): each service reads only its own section.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, Field, field_validator, model_validator

from replicator.core.settings.fields import Duration, Model, Size, at_least
from replicator.core.settings.names import (
    ORIGIN_HEADER,
    ORIGIN_HEADER_HELP,
    header_name,
    region_name,
    topic_name,
)


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
    origin_header: str = Field(ORIGIN_HEADER, description=ORIGIN_HEADER_HELP)
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
            region_name(region)
        return v

    @field_validator("origin_header")
    @classmethod
    def _origin_header_ok(cls, v: str) -> str:
        return header_name(v)

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
            topic_name(t)
        return v

    @model_validator(mode="after")
    def _something_selected(self) -> EgressSettings:
        if not self.topics and not self.select.include:
            raise ValueError("topics: name at least one topic, or give select.include")
        return self

    def topic_settings(self, topic: str) -> EgressTopicSettings:
        """The segment thresholds of ``topic``: its table, else ``topic_defaults``."""
        return self.topics.get(topic, self.topic_defaults)
