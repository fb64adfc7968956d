"""The ``[ingress]`` section and its ``[[ingress.sources]]`` entries (a topic or a topic
pattern per source region, with its destination template and gap timeouts).

Separate from the ``[egress]`` and ``[compaction]`` sections (``egress.py``,
``compaction.py``): each service reads only its own section.
"""

from __future__ import annotations

import re
import string
from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator

from replicator.core.settings.fields import Duration, Model, Size, at_least
from replicator.core.settings.names import (
    ORIGIN_HEADER,
    ORIGIN_HEADER_HELP,
    header_name,
    region_name,
    topic_name,
)

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
        return None if v is None else topic_name(v)

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
        topic_name(v.format(topic="t", region="r"))
        return v

    @field_validator("region")
    @classmethod
    def _region_ok(cls, v: str) -> str:
        return region_name(v)

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
        return topic_name(template.format(topic=topic, region=self.region))

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
    origin_header: str = Field(ORIGIN_HEADER, description=ORIGIN_HEADER_HELP)
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
        return header_name(v)

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
