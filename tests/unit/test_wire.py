"""The formats both halves exchange round-trip: ``_topic.json`` and checkpoints."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.core.errors import TopicError
from replicator.core.wire import (
    TOPIC_META_CONFIGS,
    Checkpoint,
    GroupExport,
    TopicMetadata,
    checkpoint_key,
    parse_checkpoint_key,
    rfc3339,
)

names = st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True)
# Microsecond precision in UTC: what rfc3339 writes.
times = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 1, 1),
                     timezones=st.just(UTC))
offsets = st.integers(min_value=0, max_value=2**63 - 1)


@given(names, names, st.integers(min_value=1, max_value=100_000),
       st.dictionaries(st.sampled_from(sorted(TOPIC_META_CONFIGS)), st.text(max_size=20)),
       times, st.one_of(st.none(), st.dictionaries(st.integers(0, 10_000), offsets)))
def test_topic_metadata_round_trips(topic: str, region: str, partitions: int,
                                    configs: dict[str, str], now: datetime,
                                    first: dict[int, int] | None) -> None:
    meta = TopicMetadata.of(topic, region, partitions, configs, now, first)
    assert TopicMetadata.parse(meta.encode(), where="t") == meta


def test_first_positions_absent_empty_and_recorded() -> None:
    # Absent: an egress that does not record them; present, even empty: one that does.
    assert TopicMetadata.parse(b'{"partitions": 2}', where="x").first_positions is None
    assert TopicMetadata.parse(b'{"partitions": 2, "first_positions": {}}',
                               where="x").first_positions == {}
    meta = TopicMetadata.of("t", "r1", 2, {}, datetime(2026, 1, 1, tzinfo=UTC), {1: 40})
    assert json.loads(meta.encode())["first_positions"] == {"1": 40}
    for bad in (b'[]', b'{"a": 1}', b'{"0": -1}', b'{"0": "5"}', b'{"0": true}'):
        with pytest.raises(TopicError, match="x: 'first_positions'"):
            TopicMetadata.parse(b'{"partitions": 2, "first_positions": ' + bad + b'}',
                                where="x")


def test_topic_metadata_body_and_old_files() -> None:
    meta = TopicMetadata.of("t", "r1", 3, {"retention.ms": "5", "other": "x"},
                            datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert json.loads(meta.encode()) == {
        "topic": "t", "region": "r1", "partitions": 3, "configs": {"retention.ms": "5"},
        "updated_at": "2026-01-02T03:04:05.000000Z"}
    # Only partitions (and configs) are required of a file.
    assert TopicMetadata.parse(b'{"partitions": 2}', where="x") == TopicMetadata(2)
    with pytest.raises(TopicError, match="x: 'partitions'"):
        TopicMetadata.parse(b'{"partitions": true}', where="x")


def test_topic_metadata_first_positions_parse_tolerantly() -> None:
    assert TopicMetadata.parse(b'{"partitions": 2}', where="x").first_positions is None
    assert TopicMetadata.parse(b'{"partitions": 2, "first_positions": {}}',
                               where="x").first_positions == {}
    meta = TopicMetadata.parse(b'{"partitions": 2, "first_positions": {"0": 0, "1": 500}}',
                               where="x")
    assert meta.first_positions == {0: 0, 1: 500}
    for bad in (b'[]', b'{"0": -1}', b'{"x": 1}', b'{"0": "1"}'):
        with pytest.raises(TopicError, match="first_positions"):
            TopicMetadata.parse(b'{"partitions": 2, "first_positions": ' + bad + b"}",
                                where="x")


@given(offsets, st.text(max_size=80), times,
       st.one_of(st.none(), st.tuples(offsets, offsets)), st.one_of(st.none(), offsets),
       st.one_of(st.none(), st.tuples(offsets, times)))
def test_checkpoint_round_trips(offset: int, segment: str, now: datetime,
                                lost: tuple[int, int] | None, origin: int | None,
                                late: tuple[int, datetime] | None) -> None:
    cp = Checkpoint(offset, segment, now, lost, origin, late)
    assert Checkpoint.decode(cp.encode()) == cp


def test_checkpoint_value_layout() -> None:
    cp = Checkpoint(41, "data/r/t/0/0/x", datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=5), lost=(3, 9))
    assert json.loads(cp.encode()) == {"offset": 41, "segment": "data/r/t/0/0/x",
                                       "updated_at": "2026-01-01T00:00:00.000005Z",
                                       "lost": [3, 9]}
    for bad in (None, b"[]", b"{}", b'{"offset": -1, "updated_at": "2026-01-01T00:00:00Z"}',
                b'{"offset": 1, "updated_at": "yesterday"}'):
        with pytest.raises(ValueError):
            Checkpoint.decode(bad)


@pytest.mark.parametrize("extra", [
    '"lost": [null, 2]', '"lost": ["a", 2]', '"lost": [1]', '"lost": 3', '"lost": [true, 2]',
    '"lost": [-1, 2]', '"lost": [1, 2.5]', '"segment": 5', '"offset": 1.5', '"late": 3',
    '"late": {"first": 3}', '"late": {"first": null, "since": "2026-01-01T00:00:00Z"}',
    '"late": {"first": 3, "since": "2026-01-01T00:00:00"}'])
def test_malformed_checkpoint_fields_are_value_errors(extra: str) -> None:
    # Any malformed field is a ValueError (the documented "invalid checkpoint": ERROR +
    # metric, ignored), never a TypeError that would end the replay session in a loop.
    body = '{"offset": 1, "segment": "s", "updated_at": "2026-01-01T00:00:00Z", ' + extra + "}"
    with pytest.raises(ValueError):
        Checkpoint.decode(body.encode())


def test_checkpoint_time_without_zone_is_invalid() -> None:
    # A naive time would raise TypeError later, when compared with the worker's clock.
    with pytest.raises(ValueError, match="zone"):
        Checkpoint.decode(b'{"offset": 1, "segment": "s", "updated_at": "2026-01-01T00:00:00"}')


@given(names, names, st.integers(min_value=0, max_value=10**6), names)
def test_checkpoint_key_round_trips(region: str, topic: str, partition: int,
                                    destination: str) -> None:
    key = checkpoint_key(region, topic, partition, destination)
    assert key == f"{region}:{topic}:{partition}:{destination}"
    assert parse_checkpoint_key(key) == (region, topic, partition, destination)
    legacy = checkpoint_key(region, topic, partition)
    assert legacy == f"{region}:{topic}:{partition}"
    assert parse_checkpoint_key(legacy) == (region, topic, partition, None)


def test_other_keys_are_not_checkpoint_keys() -> None:
    for key in ("r:t", "r:t:x", ":t:0", "r::0", "a:b:c:0", "r:t:0:", "r:t:0:d:e"):
        assert parse_checkpoint_key(key) is None


def test_rfc3339_is_utc_with_microseconds() -> None:
    t = datetime(2026, 5, 6, 7, 8, 9, 10, tzinfo=UTC)
    assert rfc3339(t) == "2026-05-06T07:08:09.000010Z"


def test_group_export_round_trips_and_refuses_bad_offsets() -> None:
    exp = GroupExport("app", "orders", "eu", {0: 5, 3: 0},
                      datetime(2026, 11, 23, 12, 0, tzinfo=UTC))
    body = exp.encode()
    assert json.loads(body)["offsets"] == {"0": 5, "3": 0}
    assert GroupExport.parse(body, where="k") == exp
    for offsets in ('{"x": 1}', '{"0": -1}', '{"0": true}', '[]'):
        doc = json.loads(body)
        doc["offsets"] = json.loads(offsets)
        with pytest.raises(ValueError, match="k: 'offsets'"):
            GroupExport.parse(json.dumps(doc).encode(), where="k")
    with pytest.raises(ValueError, match="not JSON"):
        GroupExport.parse(b"{", where="k")


def test_partitions_at_start_round_trips_and_is_checked() -> None:
    meta = TopicMetadata.parse(b'{"partitions": 6, "partitions_at_start": 4}', where="x")
    assert meta.partitions_at_start == 4
    assert [meta.added_later(p) for p in (3, 4, 5)] == [False, True, True]
    assert TopicMetadata.parse(meta.encode(), where="x") == meta
    older = TopicMetadata.parse(b'{"partitions": 6}', where="x")
    assert older.partitions_at_start is None and not older.added_later(5)
    assert "partitions_at_start" not in json.loads(older.encode())
    for bad in (b"0", b"-1", b"true", b'"4"'):
        with pytest.raises(TopicError, match="x: 'partitions_at_start'"):
            TopicMetadata.parse(b'{"partitions": 2, "partitions_at_start": ' + bad + b"}",
                                where="x")
