"""Segment events: S3 notification parsing, de-duplication and the events-topic codec.

Pure functions only. The S3 → SQS notification JSON (``{"Records": [...]}``) is turned
into ``SegmentEvent`` values for the sources ingress replays; everything else is sorted
into *ignored* (valid but not ours: the test event, other buckets, prefixes, sources, or
keys that are not segment keys) and *invalid* (cannot be understood), each with a reason
that the relay counts in a metric.

On the segment-events topic an event is a JSON value keyed ``{region}:{topic}:{partition}``
(``replicator.core.wire.checkpoint_key`` without a destination), so the events of
one source partition stay in order.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import unquote_plus

from replicator.core.keys import (
    CHAIN_NAME,
    TOPIC_META_NAME,
    PartitionRef,
    SegmentKey,
    parse_heartbeat_key,
)
from replicator.core.wire import checkpoint_key, json_object

EventKind = Literal["created", "removed"]

# Ignore reasons (metric label values).
IGNORED_TEST_EVENT = "test_event"
IGNORED_OTHER_BUCKET = "other_bucket"
IGNORED_OTHER_PREFIX = "other_prefix"
IGNORED_EVENT_TYPE = "event_type"
IGNORED_TOPIC_META = "topic_meta"
IGNORED_HEARTBEAT = "heartbeat"
IGNORED_NOT_SEGMENT = "not_segment"
IGNORED_UNCONFIGURED = "unconfigured_source"

# Invalid reasons (metric label values).
INVALID_JSON = "not_json"
INVALID_SHAPE = "bad_shape"
INVALID_RECORD = "bad_record"


@dataclass(frozen=True)
class SegmentEvent:
    """A segment appeared (``created``) or disappeared (``removed``) in the bucket."""

    kind: EventKind
    key: SegmentKey
    size: int | None = None
    event_time: datetime | None = None

    @property
    def partition_ref(self) -> PartitionRef:
        """The source partition the segment belongs to."""
        return self.key.partition_ref


@dataclass
class ParsedMessage:
    """What one SQS message body contained."""

    events: list[SegmentEvent] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    """(reason, object key or event name) of records that are valid but not ours."""
    invalid: list[str] = field(default_factory=list)
    """Reasons of records (or the whole body) that could not be understood."""


def parse_s3_message(body: str, *, bucket: str, prefix: str,
                     sources: Container[tuple[str, str]]) -> ParsedMessage:
    """Parse one S3 notification message body.

    Args:
        body: the SQS message body (JSON).
        bucket: the bucket ingress reads; events of other buckets are ignored.
        prefix: the data prefix (``s3.prefix``); keys outside it are ignored.
        sources: ``(region, topic)`` pairs that are replayed (a set, or
            ``ingress.discovery.SourceFilter``, which also holds the topics patterns
            match); other segments are ignored.

    Returns:
        The events found, plus the ignored and invalid records with their reasons. A body
        that is not JSON or has no ``Records`` list (other than ``s3:TestEvent``) yields
        one invalid entry.
    """
    out = ParsedMessage()
    try:
        doc = json.loads(body)
    except ValueError:
        out.invalid.append(INVALID_JSON)
        return out
    if not isinstance(doc, dict):
        out.invalid.append(INVALID_SHAPE)
        return out
    if doc.get("Event") == "s3:TestEvent":
        out.ignored.append((IGNORED_TEST_EVENT, str(doc.get("Bucket", ""))))
        return out
    records = doc.get("Records")
    if not isinstance(records, list):
        out.invalid.append(INVALID_SHAPE)
        return out
    for rec in records:
        _parse_record(rec, bucket, prefix, sources, out)
    return out


def _parse_record(rec: Any, bucket: str, prefix: str, sources: Container[tuple[str, str]],
                  out: ParsedMessage) -> None:
    try:
        name = rec["eventName"]
        s3 = rec["s3"]
        rec_bucket = s3["bucket"]["name"]
        raw_key = s3["object"]["key"]
        if not isinstance(name, str) or not isinstance(raw_key, str):
            raise TypeError("eventName and s3.object.key must be strings")
    except (KeyError, TypeError):
        out.invalid.append(INVALID_RECORD)
        return
    key = unquote_plus(raw_key)
    kind: EventKind
    if name.startswith("ObjectCreated:"):
        kind = "created"
    elif name.startswith("ObjectRemoved:"):
        kind = "removed"
    else:
        out.ignored.append((IGNORED_EVENT_TYPE, name))
        return
    if rec_bucket != bucket:
        out.ignored.append((IGNORED_OTHER_BUCKET, f"{rec_bucket}/{key}"))
        return
    if not key.startswith(prefix + "/"):
        out.ignored.append((IGNORED_OTHER_PREFIX, key))
        return
    reason = _metadata_reason(key)
    if reason is not None:
        out.ignored.append((reason, key))
        return
    seg = SegmentKey.try_parse(key)
    if seg is None or seg.prefix != prefix:
        out.ignored.append((IGNORED_NOT_SEGMENT, key))
        return
    if (seg.region, seg.topic) not in sources:
        out.ignored.append((IGNORED_UNCONFIGURED, key))
        return
    size = s3["object"].get("size")
    out.events.append(SegmentEvent(kind, seg, size if isinstance(size, int) else None,
                                   _parse_time(rec.get("eventTime"))))


def _metadata_reason(key: str) -> str | None:
    """Why an object egress writes beside the segments is not an event: ``_topic.json``
    (read by the topic check) and ``_incarnations.json`` (egress's copy of its chain), a
    heartbeat (read by listing, ``ingress.heartbeats``).
    """
    if key.endswith(("/" + TOPIC_META_NAME, "/" + CHAIN_NAME)):
        return IGNORED_TOPIC_META
    if parse_heartbeat_key(key) is not None:
        return IGNORED_HEARTBEAT
    return None


def _parse_time(v: Any) -> datetime | None:
    if not isinstance(v, str):
        return None
    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


class EventDeduper:
    """Drops repeats: an event identical (kind, size, time) to the last one for its key.

    moto sends ``ObjectCreated:Put`` and ``ObjectCreated:CompleteMultipartUpload`` for one
    multipart upload, and SQS redelivers messages. A key that is created, removed and
    created again passes every time, and so does an overwrite (new size or time), so a
    re-uploaded segment is announced again. Memory: ``capacity`` keys (oldest forgotten).

    ``fresh`` only looks; ``remember`` records, so events whose publication failed are
    not mistaken for repeats when SQS delivers them again.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._last: OrderedDict[SegmentKey, _Signature] = OrderedDict()

    def fresh(self, events: list[SegmentEvent]) -> list[SegmentEvent]:
        """The events that are not repeats (of remembered ones or of each other)."""
        local: dict[SegmentKey, _Signature] = {}
        out = []
        for ev in events:
            prev = local.get(ev.key, self._last.get(ev.key))
            sig = _signature(ev)
            local[ev.key] = sig
            if prev != sig:
                out.append(ev)
        return out

    def remember(self, events: list[SegmentEvent]) -> None:
        """Record events as seen (after they were published)."""
        for ev in events:
            self._last[ev.key] = _signature(ev)
            self._last.move_to_end(ev.key)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)

    def admit(self, event: SegmentEvent) -> bool:
        """True if the event is new, remembering it at once."""
        ok = bool(self.fresh([event]))
        self.remember([event])
        return ok


_Signature = tuple[str, int | None, datetime | None]


def _signature(ev: SegmentEvent) -> _Signature:
    return (ev.kind, ev.size, ev.event_time)


# --- events topic codec --------------------------------------------------------------


def encode_event(event: SegmentEvent) -> tuple[bytes, bytes]:
    """``(kafka key, kafka value)`` of an event on the segment-events topic."""
    k = event.key
    value = {
        "kind": event.kind,
        "key": k.to_key(),
        "size": event.size,
        "event_time": None if event.event_time is None else
        event.event_time.astimezone(UTC).isoformat().replace("+00:00", "Z"),
    }
    return (checkpoint_key(k.region, k.topic, k.partition).encode(),
            json.dumps(value, separators=(",", ":")).encode())


def decode_event(value: bytes | None) -> SegmentEvent:
    """Parse a segment-events topic value.

    Raises:
        ValueError: naming what is wrong (not JSON, unknown kind, not a segment key).
    """
    doc = json_object(value, "event value", if_null="empty event value")
    kind = doc.get("kind")
    if kind not in ("created", "removed"):
        raise ValueError(f"unknown event kind {kind!r}")
    key = doc.get("key")
    if not isinstance(key, str):
        raise ValueError(f"event without a key: {(value or b'')[:200]!r}")
    seg = SegmentKey.parse(key)  # KeyFormatError is a ValueError
    size = doc.get("size")
    return SegmentEvent(kind, seg, size if isinstance(size, int) else None,
                        _parse_time(doc.get("event_time")))
