"""S3 notification parsing, de-duplication and the segment-events codec."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import quote_plus

from ingress.events import (
    IGNORED_EVENT_TYPE,
    IGNORED_NOT_SEGMENT,
    IGNORED_OTHER_BUCKET,
    IGNORED_OTHER_PREFIX,
    IGNORED_TEST_EVENT,
    IGNORED_TOPIC_META,
    IGNORED_UNCONFIGURED,
    INVALID_JSON,
    INVALID_RECORD,
    INVALID_SHAPE,
    EventDeduper,
    SegmentEvent,
    decode_event,
    encode_event,
    parse_s3_message,
)
from replicator.core.keys import SegmentKey

KEY = SegmentKey("data", "us-east-1", "sensor.events", 7, 0, 100, 199)
SOURCES = {("us-east-1", "sensor.events")}


def record(key: str, name: str = "ObjectCreated:Put", bucket: str = "dest",
           size: int = 123, encode: bool = True) -> dict[str, object]:
    return {
        "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-west-1",
        "eventTime": "2026-01-01T00:00:01.500Z", "eventName": name,
        "s3": {"bucket": {"name": bucket},
               "object": {"key": quote_plus(key) if encode else key, "size": size}},
    }


def parse(*records: dict[str, object]):  # type: ignore[no-untyped-def]
    return parse_s3_message(json.dumps({"Records": list(records)}), bucket="dest",
                            prefix="data", sources=SOURCES)


def test_created_and_removed_events_with_decoded_keys() -> None:
    # moto encodes '/' as %2F and spaces as '+'; unquote_plus undoes both.
    p = parse(record(KEY.to_key()), record(KEY.to_key(), "ObjectRemoved:Delete"),
              record(KEY.to_key(), "ObjectCreated:CompleteMultipartUpload", encode=False))
    assert [e.kind for e in p.events] == ["created", "removed", "created"]
    assert all(e.key == KEY for e in p.events)
    assert p.events[0].size == 123
    assert p.events[0].event_time == datetime(2026, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)
    assert not p.ignored and not p.invalid


def test_test_event_is_ignored() -> None:
    p = parse_s3_message(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent",
                                     "Bucket": "dest"}), bucket="dest", prefix="data",
                         sources=SOURCES)
    assert p.ignored == [(IGNORED_TEST_EVENT, "dest")] and not p.events and not p.invalid


def test_not_ours_is_ignored_with_a_reason() -> None:
    other_src = SegmentKey("data", "eu-west-1", "sensor.events", 0, 0, 0, 9).to_key()
    p = parse(record(KEY.to_key(), bucket="other"),
              record("elsewhere/us-east-1/sensor.events/7/0/" + KEY.to_key().rsplit("/")[-1]),
              record("data/us-east-1/sensor.events/_topic.json"),
              record("data/us-east-1/sensor.events/7/0/garbage"),
              record(other_src),
              record(KEY.to_key(), "ObjectRestore:Completed"))
    assert [r for r, _ in p.ignored] == [IGNORED_OTHER_BUCKET, IGNORED_OTHER_PREFIX,
                                         IGNORED_TOPIC_META, IGNORED_NOT_SEGMENT,
                                         IGNORED_UNCONFIGURED, IGNORED_EVENT_TYPE]
    assert not p.events and not p.invalid


def test_malformed_bodies_are_invalid() -> None:
    kw = {"bucket": "dest", "prefix": "data", "sources": SOURCES}
    assert parse_s3_message("not json", **kw).invalid == [INVALID_JSON]  # type: ignore[arg-type]
    assert parse_s3_message("[1]", **kw).invalid == [INVALID_SHAPE]  # type: ignore[arg-type]
    assert parse_s3_message('{"x": 1}', **kw).invalid == [INVALID_SHAPE]  # type: ignore[arg-type]
    p = parse({"eventName": "ObjectCreated:Put"}, record(KEY.to_key()))
    assert p.invalid == [INVALID_RECORD] and len(p.events) == 1  # good records still count


def test_deduper_drops_repeats_but_not_recreation() -> None:
    d = EventDeduper()
    c, r = SegmentEvent("created", KEY), SegmentEvent("removed", KEY)
    # moto: Put + CompleteMultipartUpload for one upload
    assert d.fresh([c, c]) == [c]
    d.remember([c])
    assert d.fresh([c]) == []            # SQS redelivery
    assert d.fresh([r, c]) == [r, c]     # deleted and created again
    assert d.admit(r) and not d.admit(r) and d.admit(c)


def test_deduper_forgets_oldest_beyond_capacity() -> None:
    d = EventDeduper(capacity=2)
    keys = [SegmentKey("data", "r", "t", 0, 0, i * 10, i * 10 + 9) for i in range(3)]
    for k in keys:
        d.remember([SegmentEvent("created", k)])
    assert d.fresh([SegmentEvent("created", keys[0])])  # forgotten
    assert not d.fresh([SegmentEvent("created", keys[2])])


def test_unpublished_events_are_not_remembered() -> None:
    d = EventDeduper()
    c = SegmentEvent("created", KEY)
    assert d.fresh([c]) == [c]
    assert d.fresh([c]) == [c]  # publish failed, nothing remembered: redelivery passes


def test_codec_round_trip_and_kafka_key() -> None:
    ev = SegmentEvent("created", KEY, 42, datetime(2026, 1, 1, tzinfo=UTC))
    key, value = encode_event(ev)
    assert key == b"us-east-1:sensor.events:7"
    assert decode_event(value) == ev
    assert decode_event(encode_event(SegmentEvent("removed", KEY))[1]) == \
        SegmentEvent("removed", KEY)


def test_codec_refuses_garbage() -> None:
    import pytest

    for bad in (None, b"x", b"[]", b'{"kind":"moved","key":"a"}', b'{"kind":"created"}',
                b'{"kind":"created","key":"data/x"}'):
        with pytest.raises(ValueError):
            decode_event(bad)


def test_deduper_passes_overwrites() -> None:
    d = EventDeduper()
    t1, t2 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    assert d.admit(SegmentEvent("created", KEY, 10, t1))
    assert not d.admit(SegmentEvent("created", KEY, 10, t1))   # redelivered
    assert d.admit(SegmentEvent("created", KEY, 12, t2))       # re-uploaded
