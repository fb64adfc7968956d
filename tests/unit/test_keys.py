"""SegmentKey and the rest of the S3 key layout (docs/architecture.md, "S3 layout")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.core.errors import KeyFormatError
from replicator.core.keys import (
    MAX_OFFSET,
    PartitionRef,
    SegmentKey,
    check_topic,
    group_export_key,
    is_temp_key,
    new_temp_key,
    parse_group_export_key,
    region_prefix,
    topic_meta_key,
    topic_prefix,
)

TOPIC_CHARS = "abcxyzABCXYZ0189._-"

topics = st.text(alphabet=TOPIC_CHARS, min_size=1, max_size=249).filter(
    lambda t: t not in (".", ".."))
regions = st.sampled_from(["us-east-1", "us-west-1", "eu-central-1", "local_1", "a.b"])
prefixes = st.lists(st.text(alphabet="abc019_-.", min_size=1, max_size=8),
                    min_size=1, max_size=3).map("/".join)
offsets = st.integers(min_value=0, max_value=MAX_OFFSET)
small = st.integers(min_value=0, max_value=100_000)


@st.composite
def segment_keys(draw: st.DrawFn) -> SegmentKey:
    a, b = sorted((draw(offsets), draw(offsets)))
    return SegmentKey(draw(prefixes), draw(regions), draw(topics), draw(small), draw(small),
                      a, b)


@given(segment_keys())
def test_round_trip(key: SegmentKey) -> None:
    text = key.to_key()
    assert SegmentKey.parse(text) == key
    assert SegmentKey.try_parse(text) == key
    assert text.startswith(key.partition_ref.segments_prefix(key.level))
    assert text.startswith(topic_prefix(key.prefix, key.region, key.topic))


@given(st.sampled_from(["sensor.events", "a-b_c.d", "_private", "x" * 249, "..a", "-"]),
       offsets)
def test_round_trip_awkward_topics(topic: str, offset: int) -> None:
    key = SegmentKey("data", "us-east-1", topic, 7, 1, offset, offset)
    assert SegmentKey.parse(key.to_key()) == key


@given(st.lists(st.tuples(offsets, offsets).map(sorted), min_size=2, max_size=20))
def test_lexical_order_is_offset_order(ranges: list[list[int]]) -> None:
    keys = [SegmentKey("data", "us-east-1", "t", 3, 0, a, b) for a, b in ranges]
    by_text = sorted(keys, key=lambda k: k.to_key())
    by_offset = sorted(keys, key=lambda k: (k.start, k.end))
    assert [k.to_key() for k in by_text] == [k.to_key() for k in by_offset]


def test_example_from_spec() -> None:
    text = "data/us-east-1/sensor.events/107/0/00000000000000100000-00000000000000200000"
    key = SegmentKey.parse(text)
    assert key == SegmentKey("data", "us-east-1", "sensor.events", 107, 0, 100000, 200000)
    assert key.span == 100001
    assert str(key) == text


def test_max_offset_is_20_digits() -> None:
    key = SegmentKey("data", "r", "t", 0, 0, 0, MAX_OFFSET)
    assert key.to_key().endswith(f"-{MAX_OFFSET:020d}")
    assert len(str(MAX_OFFSET)) == 19
    assert SegmentKey.parse(key.to_key()).end == MAX_OFFSET


def test_multi_part_prefix() -> None:
    key = SegmentKey.parse("a/b/c/us-east-1/t/0/2/00000000000000000005-00000000000000000009")
    assert (key.prefix, key.region, key.topic, key.level) == ("a/b/c", "us-east-1", "t", 2)


R = "00000000000000000001-00000000000000000002"


@pytest.mark.parametrize(("text", "reason"), [
    ("temp/0b7e8c1e-8a7e-4d5b-9d1b-0d6f0e2e9c11", "expected prefix/region/topic"),
    ("data/us-east-1/sensor.events/_topic.json", "expected prefix/region/topic"),
    ("data/us-east-1/t/0/0", "expected prefix/region/topic"),
    ("", "expected prefix/region/topic"),
    (f"data/us-east-1/t/0/0/{R}/extra", "two 20-digit offsets"),
    ("data/us-east-1/t/0/0/1-2", "two 20-digit offsets"),
    ("data/us-east-1/t/0/0/0000000000000000000a-00000000000000000002", "two 20-digit"),
    ("data/us-east-1/t/0/0/00000000000000000001_00000000000000000002", "two 20-digit"),
    (f"data/us-east-1/t/x/0/{R}", "partition 'x' is not a plain decimal"),
    (f"data/us-east-1/t/0/lvl/{R}", "level 'lvl' is not a plain decimal"),
    (f"data/us-east-1/t/007/0/{R}", "partition '007' is not a plain decimal"),
    (f"data/us-east-1/t/0/01/{R}", "level '01' is not a plain decimal"),
    (f"data/us-east-1/t/-1/0/{R}", "partition '-1' is not a plain decimal"),
    (f"data/us-east-1/t/+1/0/{R}", "partition '+1' is not a plain decimal"),
    ("data/us-east-1/t/0/0/00000000000000000002-00000000000000000001", "after its end"),
    ("data/us-east-1/t/0/0/99999999999999999999-99999999999999999999", "2^63-1"),
    (f"data/us-east-1/bad topic/0/0/{R}", "invalid topic name"),
    (f"data/us-east-1/../0/0/{R}", "invalid topic name"),
    (f"/us-east-1/t/0/0/{R}", "invalid key prefix"),
    (f"data/us east/t/0/0/{R}", "invalid region"),
])
def test_parse_rejects(text: str, reason: str) -> None:
    with pytest.raises(KeyFormatError) as exc:
        SegmentKey.parse(text)
    message = str(exc.value)
    assert reason in message
    assert repr(text) in message  # the error names the offending key
    assert SegmentKey.try_parse(text) is None


@pytest.mark.parametrize("kwargs", [
    {"start": 5, "end": 4},
    {"start": -1},
    {"end": MAX_OFFSET + 1},
    {"partition": -1},
    {"level": True},
    {"topic": ""},
    {"topic": "x" * 250},
    {"region": "a/b"},
    {"prefix": "data/"},
    {"prefix": "a//b"},
])
def test_constructor_validates(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"prefix": "data", "region": "r", "topic": "t", "partition": 0,
                               "level": 0, "start": 0, "end": 0}
    with pytest.raises(KeyFormatError):
        SegmentKey(**{**base, **kwargs})  # type: ignore[arg-type]


def test_covers_and_span() -> None:
    outer = SegmentKey("data", "r", "t", 0, 1, 10, 19)
    assert outer.span == 10
    assert outer.covers(SegmentKey("data", "r", "t", 0, 0, 10, 10))
    assert outer.covers(SegmentKey("data", "r", "t", 0, 0, 12, 19))
    assert not outer.covers(SegmentKey("data", "r", "t", 0, 0, 9, 12))
    assert not outer.covers(SegmentKey("data", "r", "t", 0, 0, 19, 20))


def test_prefix_helpers() -> None:
    ref = PartitionRef("data", "us-east-1", "sensor.events", 3)
    assert ref.segments_prefix() == "data/us-east-1/sensor.events/3/"
    assert ref.segments_prefix(0) == "data/us-east-1/sensor.events/3/0/"
    assert str(ref) == "us-east-1/sensor.events[3]"
    assert region_prefix("data", "us-east-1") == "data/us-east-1/"
    meta = topic_meta_key("data", "us-east-1", "sensor.events")
    assert meta == "data/us-east-1/sensor.events/_topic.json"
    assert SegmentKey.try_parse(meta) is None


def test_temp_keys() -> None:
    a, b = new_temp_key("temp"), new_temp_key("temp")
    assert a != b
    assert a.startswith("temp/")
    assert is_temp_key(a, "temp")
    assert not is_temp_key("temporary/x", "temp")
    assert not is_temp_key("data/us-east-1/t/0/0/" + R, "temp")
    assert SegmentKey.try_parse(a) is None
    with pytest.raises(KeyFormatError):
        new_temp_key("/temp")


@pytest.mark.parametrize("topic", ["", ".", "..", "a b", "a/b", "ä", "x" * 250])
def test_check_topic_rejects(topic: str) -> None:
    with pytest.raises(KeyFormatError, match="invalid topic name"):
        check_topic(topic)


@pytest.mark.parametrize("group", ["app", "a b", "x/y", "ü-ñ", "%41", ".", "..",
                                   "00000000000000000000-00000000000000000001"])
def test_group_export_keys_round_trip_and_are_never_segments(group: str) -> None:
    key = group_export_key("data/x", "eu", "orders", group)
    assert key.startswith("data/x/eu/orders/_groups/") and key.count("/") == 5
    assert parse_group_export_key(key) == ("data/x", "eu", "orders", group)
    assert SegmentKey.try_parse(key) is None


def test_other_keys_are_not_group_exports() -> None:
    assert parse_group_export_key("data/eu/orders/_topic.json") is None
    assert parse_group_export_key("data/eu/orders/0/0/" + "0" * 20 + "-" + "0" * 20) is None
    assert parse_group_export_key("data/eu/orders/_groups/bad%ff.json") is None


def test_a_later_incarnations_keys_round_trip_below_its_own_directory() -> None:
    from replicator.core.keys import PartitionRef
    k = SegmentKey("a/b", "r1", "t", 3, 1, 0, 9, "Id_-x")
    assert k.to_key() == "a/b/r1/t/_incarnations/Id_-x/3/1/" \
        "00000000000000000000-00000000000000000009"
    assert SegmentKey.parse(k.to_key()) == k
    assert k.partition_ref == PartitionRef("a/b", "r1", "t", 3, "Id_-x")
    assert k.partition_ref.base == PartitionRef("a/b", "r1", "t", 3)
    assert k.to_key().startswith(k.partition_ref.segments_prefix())
    base = SegmentKey("a/b", "r1", "t", 3, 1, 0, 9)
    assert SegmentKey.parse(base.to_key()) == base and base.incarnation == ""
    assert not base.to_key().startswith(k.partition_ref.segments_prefix())
    with pytest.raises(KeyFormatError):
        SegmentKey("p", "_incarnations", "t", 0, 0, 0, 1)
    with pytest.raises(KeyFormatError):
        SegmentKey("p", "r", "t", 0, 0, 0, 1, "a/b")
