"""The formats egress, ingress and the operator tools exchange, encoded and parsed here only.

* ``_topic.json`` (``TopicMetadata``): written by egress next to a topic's segments, read by
  ingress to create the destination topic (docs/architecture.md, "Topic metadata").
* Checkpoints (``Checkpoint``, ``checkpoint_key``): the key
  ``{source_region}:{source_topic}:{partition}:{destination_topic}`` and JSON value on the
  checkpoint topic, written by ingress, read by ingress and ``replicator checkpoints show``
  (docs/architecture.md, "Checkpoints").
* Exported consumer-group offsets (``GroupExport``): what a source group has committed for
  one topic, written by egress under ``{prefix}/{region}/{topic}/_groups/``, read by the
  failover tools in the destination region (docs/architecture.md, "Group offsets").

Every type round-trips: ``parse(encode(x)) == x`` (``tests/unit/test_wire.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from replicator.core.errors import TopicError

# Source topic configs recorded in ``_topic.json`` (egress writes them, ingress copies what
# it can to the destination topic), when they are set on the source topic itself (cluster
# defaults stay behind: the destination cluster has its own).
TOPIC_META_CONFIGS = frozenset({
    "cleanup.policy",
    "compression.type",
    "delete.retention.ms",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.ms",
})


def rfc3339(t: datetime) -> str:
    """``t`` in UTC as ``2026-01-02T03:04:05.000000Z`` (the form every format here uses)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    """Parse what ``rfc3339`` writes (and any ISO 8601 time with a zone or ``Z``).

    Raises:
        ValueError: not such a time.
    """
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def json_object(value: bytes | None, what: str, *, if_null: str) -> dict[str, Any]:
    """Decode a value that must be a JSON object.

    Raises:
        ValueError: ``if_null`` for a null value; otherwise naming ``what`` and showing the
            first 200 bytes.
    """
    if value is None:
        raise ValueError(if_null)
    try:
        doc = json.loads(value)
    except ValueError as e:
        raise ValueError(f"{what} is not JSON: {value[:200]!r}") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is not a JSON object: {value[:200]!r}")
    return doc


# --- _topic.json ---------------------------------------------------------------------


@dataclass(frozen=True)
class Incarnation:
    """One incarnation of a source topic (created, deleted and created again: each time a
    new Kafka topic id), as ``_topic.json`` lists them, oldest first.

    ``label`` names where its segments live: ``""`` for the first one archived (the
    documented key shape), else its topic id (``{topic}/_incarnations/{label}/``).
    ``previous_ends`` and ``first_positions`` are written for a partition before its first
    segment of this incarnation is visible: the last position the previous incarnation's
    segments of that partition reach (``None``: it has none), and this incarnation's first
    position there. Ingress replays this incarnation after the previous one's records up
    to that end (docs/architecture.md, "Topic incarnations").
    """

    topic_id: str
    label: str
    previous_ends: dict[int, int | None] = field(default_factory=dict)
    first_positions: dict[int, int] = field(default_factory=dict)
    created_at: datetime | None = None
    partitions: int | None = None
    """The most partitions egress saw this incarnation have (``None``: not recorded, an
    egress of an earlier release). Ingress keeps a replay worker for every partition any
    incarnation had: a topic recreated with fewer partitions still has the earlier one's
    tail of its higher partitions to replay."""
    later: tuple[str, ...] = ()
    """Topic ids the writer that recorded this incarnation read after its id (topics
    created after it, whatever any clock says), sorted: a merge of two members' chains
    places the entries by them (``egress.incarnation_chain.place``)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this entry."""
        doc: dict[str, Any] = {
            "topic_id": self.topic_id,
            "label": self.label,
            "previous_ends": {str(p): e for p, e in sorted(self.previous_ends.items())},
            "first_positions": {str(p): e for p, e in sorted(self.first_positions.items())},
        }
        if self.created_at is not None:
            doc["created_at"] = rfc3339(self.created_at)
        if self.partitions is not None:
            doc["partitions"] = self.partitions
        if self.later:
            doc["later"] = sorted(self.later)
        return doc

    @classmethod
    def from_json(cls, doc: object, where: str) -> Incarnation:
        """Parse one entry of ``incarnations``.

        Raises:
            TopicError: naming ``where`` and what is wrong.
        """
        if not isinstance(doc, dict) or not isinstance(doc.get("topic_id"), str) \
                or not isinstance(doc.get("label"), str):
            raise TopicError(f"{where}: an 'incarnations' entry needs string 'topic_id' and "
                             f"'label', got {doc!r}")
        ends_raw = doc.get("previous_ends") or {}
        if not isinstance(ends_raw, dict) or not all(
                e is None or _position(e) for e in ends_raw.values()):
            raise TopicError(f"{where}: 'previous_ends' must map partitions to positions or "
                             f"null, got {ends_raw!r}")
        firsts = _first_positions(doc.get("first_positions") or {}, where) or {}
        try:
            ends = {int(k): v for k, v in ends_raw.items()}
        except ValueError:
            raise TopicError(f"{where}: 'previous_ends' keys must be partition "
                             "numbers") from None
        created: datetime | None = None
        if isinstance(doc.get("created_at"), str):
            try:
                created = parse_rfc3339(doc["created_at"])
            except ValueError:
                created = None
        count = doc.get("partitions")
        partitions = count if isinstance(count, int) and not isinstance(count, bool) \
            and count > 0 else None
        later_raw = doc.get("later") or []
        later = tuple(sorted({t for t in later_raw if isinstance(t, str)})) \
            if isinstance(later_raw, list) else ()
        return cls(doc["topic_id"], doc["label"], ends, firsts, created, partitions, later)


@dataclass(frozen=True)
class TopicMetadata:
    """What ``{prefix}/{region}/{topic}/_topic.json`` says about a source topic.

    ``partitions`` and ``configs`` are what ingress needs; ``topic``, ``region`` and
    ``updated_at`` are written for people and tools (a reader does not require them).
    """

    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    topic: str = ""
    region: str = ""
    updated_at: datetime | None = None
    first_positions: dict[int, int] | None = None
    """Where each partition's segment history in this bucket begins (the start of the
    first segment egress published for it), written before that segment is visible and
    never changed. ``None``: written by an egress that does not record them (ingress then
    falls back to its delay); a partition absent from the object: not recorded yet."""
    incarnations: tuple[Incarnation, ...] = ()
    """The topic's incarnations archived in the bucket, oldest first, the live one last
    (empty: written by an egress that did not know the topic id)."""
    partitions_at_start: int | None = None
    """The partition count when egress first wrote the file (when the topic's ``start``
    was first applied), never changed: a partition numbered from it was added to the
    topic later, and egress copies it from its oldest record whatever ``start`` says.
    ``None``: written by an egress that did not record it."""

    def added_later(self, partition: int) -> bool:
        """Whether ``partition`` was added to the topic after egress first applied its
        ``start`` (``partitions_at_start``).
        """
        return self.partitions_at_start is not None and partition >= self.partitions_at_start

    @property
    def partitions_ever(self) -> int:
        """The most partitions the topic had in any incarnation recorded (``partitions``
        when none is): what ingress replays and sizes the destination for.
        """
        counts = [i.partitions for i in self.incarnations if i.partitions is not None]
        return max([self.partitions, *counts])

    @property
    def live(self) -> Incarnation | None:
        """The live incarnation (the newest one egress saw), if any is recorded."""
        return self.incarnations[-1] if self.incarnations else None

    def incarnation(self, label_or_id: str) -> Incarnation | None:
        """The entry with this label or topic id."""
        for inc in self.incarnations:
            if label_or_id in (inc.label, inc.topic_id):
                return inc
        return None

    @classmethod
    def of(cls, topic: str, region: str, partitions: int, configs: Mapping[str, str],
           now: datetime, first_positions: Mapping[int, int] | None = None
           ) -> TopicMetadata:
        """The metadata egress writes: only the configs ingress may copy
        (``TOPIC_META_CONFIGS``).
        """
        return cls(partitions, {k: configs[k] for k in sorted(TOPIC_META_CONFIGS)
                                if k in configs}, topic, region, now,
                   None if first_positions is None else dict(first_positions))

    def encode(self) -> bytes:
        """The JSON body (keys: topic, region, partitions, configs, updated_at, and
        first_positions when recorded).
        """
        body: dict[str, Any] = {
            "topic": self.topic,
            "region": self.region,
            "partitions": self.partitions,
            "configs": dict(self.configs),
        }
        if self.updated_at is not None:
            body["updated_at"] = rfc3339(self.updated_at)
        if self.first_positions is not None:
            body["first_positions"] = {str(p): pos for p, pos
                                       in sorted(self.first_positions.items())}
        if self.incarnations:
            body["incarnations"] = [i.to_json() for i in self.incarnations]
            body["topic_id"] = self.incarnations[-1].topic_id
        if self.partitions_at_start is not None:
            body["partitions_at_start"] = self.partitions_at_start
        return json.dumps(body, indent=2, sort_keys=True).encode("utf-8")

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> TopicMetadata:
        """Parse ``_topic.json``.

        Raises:
            TopicError: naming ``where``: not JSON, no positive ``partitions``,
                ``configs`` not an object, or ``first_positions`` not an object of
                partition numbers to non-negative positions.
        """
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise TopicError(f"{where} is not JSON: {e}") from e
        parts = doc.get("partitions") if isinstance(doc, dict) else None
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
            raise TopicError(f"{where}: 'partitions' must be a positive int, got {parts!r}")
        configs = doc.get("configs", {})
        if configs is None:
            configs = {}
        if not isinstance(configs, dict):
            raise TopicError(f"{where}: 'configs' must be an object")
        updated: datetime | None = None
        if isinstance(doc.get("updated_at"), str):
            try:
                updated = parse_rfc3339(doc["updated_at"])
            except ValueError:
                updated = None  # informational only: never a reason to refuse the file
        incs = doc.get("incarnations") or []
        if not isinstance(incs, list):
            raise TopicError(f"{where}: 'incarnations' must be a list")
        at_start = doc.get("partitions_at_start")
        if at_start is not None and (isinstance(at_start, bool) or not isinstance(at_start, int)
                                     or at_start < 1):
            raise TopicError(f"{where}: 'partitions_at_start' must be a positive int, got "
                             f"{at_start!r}")
        return cls(parts, {str(k): str(v) for k, v in configs.items()},
                   str(doc.get("topic") or ""), str(doc.get("region") or ""), updated,
                   _first_positions(doc.get("first_positions"), where),
                   tuple(Incarnation.from_json(i, where) for i in incs), at_start)


def _first_positions(value: object, where: str) -> dict[int, int] | None:
    """``first_positions`` of ``_topic.json``: absent or null → ``None`` (an egress that
    does not record them).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TopicError(f"{where}: 'first_positions' must be an object")
    out: dict[int, int] = {}
    for k, v in value.items():
        try:
            p = int(k)
        except ValueError:
            raise TopicError(f"{where}: 'first_positions' key {k!r} is not a partition "
                             "number") from None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or p < 0:
            raise TopicError(f"{where}: 'first_positions'[{k!r}] must be a position >= 0, "
                             f"got {v!r}")
        out[p] = v
    return out


# --- checkpoints ---------------------------------------------------------------------


def checkpoint_key(region: str, topic: str, partition: int,
                   destination: str | None = None) -> str:
    """``{region}:{topic}:{partition}:{destination}``: the Kafka key of a source partition's
    checkpoint for one destination topic.

    Without ``destination``: ``{region}:{topic}:{partition}``, the key of the segment
    events and the checkpoint key of earlier versions (read once on upgrade,
    docs/architecture.md, "Checkpoints").
    """
    base = f"{region}:{topic}:{partition}"
    return base if destination is None else f"{base}:{destination}"


def parse_checkpoint_key(key: str) -> tuple[str, str, int, str | None] | None:
    """``(region, topic, partition, destination)`` of a checkpoint key (``destination`` is
    ``None`` for a key of earlier versions), or ``None`` for another key.

    Neither a topic name nor a region may contain ``:``; so the split is unambiguous.
    """
    parts = key.split(":")
    if len(parts) not in (3, 4) or not parts[2].isdigit() or not parts[0] or not parts[1]:
        return None
    if len(parts) == 4:
        if not parts[3]:
            return None
        return parts[0], parts[1], int(parts[2]), parts[3]
    return parts[0], parts[1], int(parts[2]), None


@dataclass(frozen=True)
class Checkpoint:
    """Progress of one source partition: the last source offset replayed.

    A declared-lost range also moves the checkpoint (to its last position), so a restart
    does not wait for it again; such a record carries ``lost`` and the segment that follows
    the range.
    """

    offset: int
    segment: str
    updated_at: datetime
    lost: tuple[int, int] | None = None
    origin: int | None = None
    """Where the partition's first replay started without a checkpoint (the start of the
    earliest segment then known). A segment below it that arrives later was never
    replayed: the worker reports it as skipped."""
    late: tuple[int, datetime] | None = None
    """A gap being waited for right after ``offset``: its first position and when it was
    first seen, so ``lost_segment_timeout`` spans restarts (JSON ``{"first", "since"}``)."""
    refused: Refusal | None = None
    """The destination refuses the record after ``offset`` for good: the partition is
    stopped at it (for operators: ``replicator topics``, ``replicator checkpoints``)."""
    incarnation: str = ""
    """The source topic's incarnation ``offset`` belongs to (its label in ``_topic.json``;
    ``""``: the first one archived, and every checkpoint written before incarnations)."""

    def encode(self) -> bytes:
        """The JSON value written to the checkpoint topic."""
        doc: dict[str, Any] = {
            "offset": self.offset,
            "segment": self.segment,
            "updated_at": rfc3339(self.updated_at),
        }
        if self.lost is not None:
            doc["lost"] = list(self.lost)
        if self.origin is not None:
            doc["origin"] = self.origin
        if self.late is not None:
            doc["late"] = {"first": self.late[0], "since": rfc3339(self.late[1])}
        if self.refused is not None:
            doc["refused"] = self.refused.as_json()
        if self.incarnation:
            doc["incarnation"] = self.incarnation
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> Checkpoint:
        """Parse a checkpoint value.

        Raises:
            ValueError: naming what is wrong.
        """
        doc = json_object(value, "checkpoint", if_null="checkpoint value is null (tombstone)")
        offset = doc.get("offset")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"checkpoint offset must be a non-negative int, got {offset!r}")
        segment = doc.get("segment", "")
        if not isinstance(segment, str):
            raise ValueError(f"checkpoint segment must be a string, got {segment!r}")
        try:
            updated = parse_rfc3339(str(doc.get("updated_at")))
        except ValueError as e:
            raise ValueError(f"checkpoint updated_at is not RFC 3339: "
                             f"{doc.get('updated_at')!r}") from e
        if updated.tzinfo is None:
            raise ValueError(f"checkpoint updated_at has no time zone: "
                             f"{doc.get('updated_at')!r}")
        lost = doc.get("lost")
        lost_t: tuple[int, int] | None = None
        if lost is not None:
            if not (isinstance(lost, list) and len(lost) == 2
                    and all(_position(x) for x in lost)):
                raise ValueError(f"checkpoint lost must be [first, last] (non-negative ints), "
                                 f"got {lost!r}")
            lost_t = (lost[0], lost[1])
        origin = doc.get("origin")
        origin_i = origin if isinstance(origin, int) and not isinstance(origin, bool) \
            and origin >= 0 else None
        incarnation = doc.get("incarnation", "")
        if not isinstance(incarnation, str):
            raise ValueError(f"checkpoint incarnation must be a string, got {incarnation!r}")
        return cls(offset, segment, updated, lost_t, origin_i, _late(doc.get("late")),
                   refused=Refusal.from_json(doc.get("refused")), incarnation=incarnation)


@dataclass(frozen=True)
class Refusal:
    """A record the destination refuses for good (a checkpoint's ``refused``): its source
    offset, its size in bytes, the destination setting (``max.message.bytes=100000``) and
    the broker's reason. JSON ``{"offset", "bytes", "setting", "reason"}``; a value that
    does not parse is ignored (it only informs operators).
    """

    offset: int
    size: int | None
    setting: str
    reason: str

    def as_json(self) -> dict[str, Any]:
        """The checkpoint's ``refused`` object."""
        return {"offset": self.offset, "bytes": self.size, "setting": self.setting,
                "reason": self.reason}

    @classmethod
    def from_json(cls, value: object) -> Refusal | None:
        """Parse ``refused`` (``None`` when absent or malformed)."""
        if not isinstance(value, dict) or not _position(value.get("offset")):
            return None
        size = value.get("bytes")
        return cls(value["offset"], size if _position(size) else None,
                   str(value.get("setting", "")), str(value.get("reason", "")))


def _late(value: object) -> tuple[int, datetime] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not _position(value.get("first")) \
            or not isinstance(value.get("since"), str):
        raise ValueError(f"checkpoint late must be {{first, since}}, got {value!r}")
    try:
        since = parse_rfc3339(value["since"])
    except ValueError as e:
        raise ValueError(f"checkpoint late.since is not RFC 3339: {value['since']!r}") from e
    if since.tzinfo is None:
        raise ValueError(f"checkpoint late.since has no time zone: {value['since']!r}")
    return value["first"], since


def _position(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


# --- exported consumer-group offsets --------------------------------------------------


def _strings(doc: dict[str, Any], where: str, names: tuple[str, ...]) -> dict[str, str]:
    """The string fields ``names`` of ``doc``.

    Raises:
        ValueError: naming ``where`` and the field that is missing or not a string.
    """
    texts = {}
    for name in names:
        v = doc.get(name)
        if not isinstance(v, str):
            raise ValueError(f"{where}: {name!r} must be a string, got {v!r}")
        texts[name] = v
    return texts


def _time(texts: dict[str, str], name: str, where: str) -> datetime:
    """The RFC 3339 time of field ``name``.

    Raises:
        ValueError: naming ``where`` and the field, when it is not an RFC 3339 time.
    """
    try:
        return parse_rfc3339(texts[name])
    except ValueError as e:
        raise ValueError(f"{where}: {name!r} is not an RFC 3339 time: {e}") from e


@dataclass(frozen=True)
class GroupExport:
    """The committed offsets of one source consumer group for one topic.

    ``offsets`` maps a partition to the group's committed offset there: the source offset of
    the next record the group would read. Partitions the group never committed are absent.
    ``no_records_from`` (JSON ``no_records_from``, only when not empty): for a partition
    where the group committed past the source's last record, the position after that
    record: egress read every position from there up to the committed offset and found no
    record (transaction markers, records it skips), so a group there is at rest, as far as
    the records go, once the record before this position is replicated.
    """

    group: str
    topic: str
    region: str
    offsets: dict[int, int]
    exported_at: datetime
    no_records_from: dict[int, int] = field(default_factory=dict)
    topic_id: str | None = None
    """The source topic's id the offsets belong to (JSON ``topic_id``; absent in exports
    written before it, or when the broker gives none): a topic deleted and created again
    has a new one, and offsets are translated only through its own incarnation's map."""

    def encode(self) -> bytes:
        """The JSON body (keys: group, topic, region, exported_at, offsets and, when known,
        no_records_from).
        """
        doc: dict[str, Any] = {
            "group": self.group,
            "topic": self.topic,
            "region": self.region,
            "exported_at": rfc3339(self.exported_at),
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
        }
        if self.no_records_from:
            doc["no_records_from"] = {str(p): o for p, o in
                                      sorted(self.no_records_from.items())}
        if self.topic_id is not None:
            doc["topic_id"] = self.topic_id
        return json.dumps(doc, indent=2, sort_keys=True).encode("utf-8")

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> GroupExport:
        """Parse an exported group's JSON.

        Raises:
            ValueError: naming ``where``: not a JSON object, ``group``/``topic``/``region``
                not strings, ``exported_at`` not an RFC 3339 time, or ``offsets`` not an
                object of partition numbers to offsets >= 0.
        """
        doc = json_object(data, where, if_null=f"{where} is empty")
        texts = _strings(doc, where, ("group", "topic", "region", "exported_at"))
        exported = _time(texts, "exported_at", where)
        offsets = _partition_offsets(doc.get("offsets"), where, "offsets")
        empty = _partition_offsets(doc.get("no_records_from", {}), where, "no_records_from")
        topic_id = doc.get("topic_id")
        if topic_id is not None and not isinstance(topic_id, str):
            raise ValueError(f"{where}: 'topic_id' must be a string, got {topic_id!r}")
        return cls(texts["group"], texts["topic"], texts["region"], offsets, exported, empty,
                   topic_id)


@dataclass(frozen=True)
class Heartbeat:
    """What one egress instance had of one topic at ``written_at``
    (``{prefix}/{region}/{topic}/_heartbeats/{instance}.json``; docs/architecture.md).

    ``caught_up`` maps each partition the instance owned and had nothing more of to its
    last durable position: no open segment, none being written, and its consumer at the
    high watermark. A destination whose replay of the partition reached that position
    holds everything the source had then. Partitions still being written are absent.
    """

    topic: str
    region: str
    instance: str
    written_at: datetime
    caught_up: dict[int, int]
    topic_ids: dict[int, str] = field(default_factory=dict)
    """Partition → the topic id (incarnation) its ``caught_up`` position belongs to, when
    known: a position of one incarnation says nothing about a replay of another. Absent
    for heartbeats of an earlier release."""

    def encode(self) -> bytes:
        """The JSON body (keys: topic, region, instance, written_at, caught_up, and
        topic_ids when known).
        """
        body: dict[str, Any] = {
            "topic": self.topic, "region": self.region, "instance": self.instance,
            "written_at": rfc3339(self.written_at),
            "caught_up": {str(p): o for p, o in sorted(self.caught_up.items())},
        }
        if self.topic_ids:
            body["topic_ids"] = {str(p): t for p, t in sorted(self.topic_ids.items())}
        return json.dumps(body, indent=2, sort_keys=True).encode("utf-8")

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> Heartbeat:
        """Parse a heartbeat's JSON.

        Raises:
            ValueError: naming ``where``: not a JSON object, a field missing or of the
                wrong type.
        """
        doc = json_object(data, where, if_null=f"{where} is empty")
        texts = _strings(doc, where, ("topic", "region", "instance", "written_at"))
        written = _time(texts, "written_at", where)
        raw_ids = doc.get("topic_ids") or {}
        ids = {int(p): t for p, t in raw_ids.items()
               if isinstance(p, str) and p.isascii() and p.isdigit() and isinstance(t, str)} \
            if isinstance(raw_ids, dict) else {}
        return cls(texts["topic"], texts["region"], texts["instance"], written,
                   _partition_offsets(doc.get("caught_up", {}), where, "caught_up"), ids)


def _partition_offsets(raw: object, where: str, name: str) -> dict[int, int]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: {name!r} must be an object")
    out: dict[int, int] = {}
    for k, v in raw.items():
        if not (isinstance(k, str) and k.isascii() and k.isdigit()) or isinstance(v, bool) \
                or not isinstance(v, int) or v < 0:
            raise ValueError(f"{where}: {name!r}[{k!r}] must map a partition number "
                             f"to an offset >= 0, got {v!r}")
        out[int(k)] = v
    return out
