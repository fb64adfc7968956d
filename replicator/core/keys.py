"""The one module that owns the S3 key layout (docs/architecture.md, "S3 layout").

* final segment: ``{prefix}/{region}/{topic}/{partition}/{level}/{start:020d}-{end:020d}``
  (the topic's first incarnation archived in the bucket); a later incarnation of the topic
  (deleted and created again: a new topic id) has the same shape below
  ``{prefix}/{region}/{topic}/_incarnations/{topic_id}/``
  (``.../_incarnations/{topic_id}/{partition}/{level}/{start:020d}-{end:020d}``), so no
  incarnation ever overwrites or interleaves another's segments
* temporary object: ``{temp_prefix}/{uuid}``
* topic metadata: ``{prefix}/{region}/{topic}/_topic.json`` (its body: ``replicator.core.wire``)
* the topic's incarnation chain, kept by egress beside ``_topic.json`` (its first entry
  written once): ``{prefix}/{region}/{topic}/_incarnations.json``
* exported consumer-group offsets: ``{prefix}/{region}/{topic}/_groups/{group}.json``, the
  group id percent-encoded (``replicator.core.wire.GroupExport``)
* egress heartbeats: ``{prefix}/{region}/{topic}/_heartbeats/{instance}.json``, the egress
  instance percent-encoded (``replicator.core.wire.Heartbeat``)

Nothing else formats or splits key strings.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from urllib.parse import quote, unquote

from replicator.core.errors import KeyFormatError

MAX_OFFSET = 2**63 - 1
OFFSET_DIGITS = 20
TOPIC_META_NAME = "_topic.json"
CHAIN_NAME = "_incarnations.json"
GROUPS_DIR = "_groups"
GROUP_EXPORT_SUFFIX = ".json"
HEARTBEATS_DIR = "_heartbeats"
INCARNATIONS_DIR = "_incarnations"
BASE_INCARNATION = ""
"""The label of the incarnation stored at the documented shape (no ``_incarnations/``)."""

_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_REGION = re.compile(r"[a-zA-Z0-9._-]+")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_RANGE = re.compile(r"([0-9]{20})-([0-9]{20})")
_INCARNATION = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_topic(topic: str) -> str:
    """Return ``topic`` if it is a legal Kafka topic name, else raise ``KeyFormatError``."""
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise KeyFormatError(f"invalid topic name {topic!r} (Kafka allows [a-zA-Z0-9._-], 1-249)")
    return topic


def check_region(region: str) -> str:
    """Return ``region`` if it can be a key component, else raise ``KeyFormatError``."""
    if not _REGION.fullmatch(region) or region == INCARNATIONS_DIR:
        raise KeyFormatError(f"invalid region {region!r} (allowed: [a-zA-Z0-9._-]+, "
                             f"not {INCARNATIONS_DIR!r})")
    return region


def check_incarnation(label: str) -> str:
    """Return ``label`` if it can name an incarnation's directory (``""``: the first one,
    at the documented shape), else raise ``KeyFormatError``.
    """
    if label != BASE_INCARNATION and not _INCARNATION.fullmatch(label):
        raise KeyFormatError(f"invalid incarnation {label!r} (allowed: [A-Za-z0-9_-], 1-64)")
    return label


def incarnation_label(topic_id: str) -> str:
    """The directory name of a topic id (Kafka prints ids in base64: ``+`` and ``/`` of the
    standard alphabet become ``-`` and ``_``, padding is dropped).
    """
    return check_incarnation(topic_id.replace("+", "-").replace("/", "_").rstrip("="))


def _location(topic: str, incarnation: str) -> str:
    return topic if incarnation == BASE_INCARNATION else \
        f"{topic}/{INCARNATIONS_DIR}/{incarnation}"


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a usable key prefix (no leading/trailing or double slash)."""
    if not prefix or prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
        raise KeyFormatError(f"invalid key prefix {prefix!r} (non-empty, no leading, "
                             "trailing or double '/')")
    return prefix


@dataclass(frozen=True, order=True)
class PartitionRef:
    """One source partition: where its segments live."""

    prefix: str
    region: str
    topic: str
    partition: int
    incarnation: str = BASE_INCARNATION
    """Which incarnation of the topic (``BASE_INCARNATION``: the documented shape)."""

    def segments_prefix(self, level: int | None = None) -> str:
        """Key prefix (ending in ``/``) of this partition's segments, optionally one level."""
        base = (f"{self.prefix}/{self.region}/{_location(self.topic, self.incarnation)}/"
                f"{self.partition}/")
        return base if level is None else f"{base}{level}/"

    @property
    def base(self) -> PartitionRef:
        """The same partition, whatever the incarnation (the first one's location)."""
        return PartitionRef(self.prefix, self.region, self.topic, self.partition)

    def of_incarnation(self, incarnation: str) -> PartitionRef:
        """The same partition in another incarnation's location."""
        return PartitionRef(self.prefix, self.region, self.topic, self.partition,
                            check_incarnation(incarnation))

    def starting_from(self, level: int, start: int) -> str:
        """A ``start_after`` for listing this partition's segments of ``level`` whose start
        is at least ``start`` (and, after them, every higher level): it sorts just before
        the first key with that start.
        """
        return f"{self.segments_prefix(level)}{start:020d}"

    def after_level(self, level: int) -> str:
        """A ``start_after`` past every key of ``level`` (the next levels follow)."""
        return f"{self.segments_prefix(level)}~"

    def __str__(self) -> str:
        inc = "" if self.incarnation == BASE_INCARNATION else f"@{self.incarnation}"
        return f"{self.region}/{self.topic}{inc}[{self.partition}]"


@dataclass(frozen=True, order=True)
class SegmentKey:
    """The identity of a final segment object. ``start`` and ``end`` are inclusive."""

    prefix: str
    region: str
    topic: str
    partition: int
    level: int
    start: int
    end: int
    incarnation: str = BASE_INCARNATION
    """The topic incarnation the segment belongs to (``BASE_INCARNATION``: the first one
    archived, at the documented shape; otherwise its topic id, under ``_incarnations/``)."""

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        check_region(self.region)
        check_topic(self.topic)
        check_incarnation(self.incarnation)
        for name in ("partition", "level"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise KeyFormatError(f"segment {name} must be a non-negative int, got {v!r}")
        for name in ("start", "end"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_OFFSET:
                raise KeyFormatError(f"segment {name} offset must be in [0, 2^63-1], got {v!r}")
        if self.start > self.end:
            raise KeyFormatError(f"segment start {self.start} is after its end {self.end}")

    @property
    def partition_ref(self) -> PartitionRef:
        """The partition this segment belongs to."""
        return PartitionRef(self.prefix, self.region, self.topic, self.partition,
                            self.incarnation)

    @property
    def span(self) -> int:
        """Number of offset positions covered (``end - start + 1``)."""
        return self.end - self.start + 1

    def covers(self, other: SegmentKey) -> bool:
        """True if this segment's range contains ``other``'s range."""
        return self.start <= other.start and other.end <= self.end

    def to_key(self) -> str:
        """The S3 key of this segment."""
        return (f"{self.prefix}/{self.region}/{_location(self.topic, self.incarnation)}/"
                f"{self.partition}/{self.level}/{self.start:020d}-{self.end:020d}")

    def __str__(self) -> str:
        return self.to_key()

    @classmethod
    def parse(cls, key: str) -> SegmentKey:
        """Parse a final segment key.

        Raises:
            KeyFormatError: naming the key, if it is not a segment key (a temp key,
                ``_topic.json``, wrong part count, non-numeric or non-canonical parts).
        """
        parts = key.split("/")
        if len(parts) < 6:
            raise KeyFormatError(f"not a segment key (expected prefix/region/topic/partition/"
                                 f"level/start-end): {key!r}")
        incarnation = BASE_INCARNATION
        if len(parts) >= 8 and parts[-5] == INCARNATIONS_DIR:
            incarnation = parts[-4]
            parts = parts[:-5] + parts[-3:]
        *prefix_parts, region, topic, partition, level, rng = parts
        m = _RANGE.fullmatch(rng)
        if not m:
            raise KeyFormatError(f"not a segment key (last part must be two 20-digit offsets "
                                 f"'start-end'): {key!r}")
        for name, v in (("partition", partition), ("level", level)):
            if not _DECIMAL.fullmatch(v):
                raise KeyFormatError(f"not a segment key ({name} {v!r} is not a plain "
                                     f"decimal): {key!r}")
        try:
            return cls("/".join(prefix_parts), region, topic, int(partition), int(level),
                       int(m.group(1)), int(m.group(2)), incarnation)
        except KeyFormatError as e:
            raise KeyFormatError(f"not a segment key ({e}): {key!r}") from e

    @classmethod
    def try_parse(cls, key: str) -> SegmentKey | None:
        """``parse`` that returns ``None`` instead of raising."""
        try:
            return cls.parse(key)
        except KeyFormatError:
            return None


def topic_prefix(prefix: str, region: str, topic: str) -> str:
    """Key prefix (ending in ``/``) under which one topic's partitions live."""
    return f"{check_prefix(prefix)}/{check_region(region)}/{check_topic(topic)}/"


def region_prefix(prefix: str, region: str) -> str:
    """Key prefix (ending in ``/``) of one region's data."""
    return f"{check_prefix(prefix)}/{check_region(region)}/"


def incarnations_prefix(prefix: str, region: str, topic: str) -> str:
    """Key prefix (ending in ``/``) under which a topic's later incarnations live."""
    return f"{topic_prefix(prefix, region, topic)}{INCARNATIONS_DIR}/"


def chain_key(prefix: str, region: str, topic: str) -> str:
    """Key of the topic's incarnation chain egress keeps beside ``_topic.json``
    (``egress.incarnation_chain``).
    """
    return topic_prefix(prefix, region, topic) + CHAIN_NAME


def topic_meta_key(prefix: str, region: str, topic: str) -> str:
    """Key of the ``_topic.json`` metadata object egress writes for a topic."""
    return topic_prefix(prefix, region, topic) + TOPIC_META_NAME


def new_temp_key(temp_prefix: str) -> str:
    """A fresh ``{temp_prefix}/{uuid}`` key for an object still being written."""
    return f"{check_prefix(temp_prefix)}/{uuid.uuid4()}"


def is_temp_key(key: str, temp_prefix: str) -> bool:
    """True if ``key`` lies under the temporary prefix."""
    return key.startswith(check_prefix(temp_prefix) + "/")


def group_exports_prefix(prefix: str, region: str, topic: str) -> str:
    """Key prefix (ending in ``/``) of a topic's exported consumer-group offsets."""
    return f"{topic_prefix(prefix, region, topic)}{GROUPS_DIR}/"


def group_export_key(prefix: str, region: str, topic: str, group: str) -> str:
    """Key of one group's exported offsets for one topic.

    The group id is percent-encoded: every character outside RFC 3986's unreserved set
    (``A-Z a-z 0-9 - . _ ~``) becomes ``%XX`` of its UTF-8 bytes, so any group id is one key
    segment and ``parse_group_export_key`` gives it back unchanged.
    """
    return (f"{group_exports_prefix(prefix, region, topic)}{quote(group, safe='')}"
            f"{GROUP_EXPORT_SUFFIX}")


def parse_group_export_key(key: str) -> tuple[str, str, str, str] | None:
    """``(prefix, region, topic, group)`` of a group-export key; ``None`` for any other key."""
    return _parse_named_json(key, GROUPS_DIR)


def heartbeats_prefix(prefix: str, region: str, topic: str) -> str:
    """Key prefix (ending in ``/``) of a topic's egress heartbeats."""
    return f"{topic_prefix(prefix, region, topic)}{HEARTBEATS_DIR}/"


def heartbeat_key(prefix: str, region: str, topic: str, instance: str) -> str:
    """Key of one egress instance's heartbeat for one topic (the instance percent-encoded
    like a group id, so any name is one key segment).
    """
    return f"{heartbeats_prefix(prefix, region, topic)}{quote(instance, safe='')}.json"


def parse_heartbeat_key(key: str) -> tuple[str, str, str, str] | None:
    """``(prefix, region, topic, instance)`` of a heartbeat key; ``None`` for any other key."""
    return _parse_named_json(key, HEARTBEATS_DIR)


def _parse_named_json(key: str, directory: str) -> tuple[str, str, str, str] | None:
    parts = key.split("/")
    if len(parts) < 5 or parts[-2] != directory or not parts[-1].endswith(GROUP_EXPORT_SUFFIX):
        return None
    *prefix_parts, region, topic, _, name = parts
    prefix = "/".join(prefix_parts)
    try:
        check_prefix(prefix)
        check_region(region)
        check_topic(topic)
        decoded = unquote(name[:-len(GROUP_EXPORT_SUFFIX)], errors="strict")
    except (KeyFormatError, UnicodeDecodeError):
        return None
    return prefix, region, topic, decoded
