"""End-to-end heartbeats: the key layout (never a segment), the JSON, what egress counts as
caught up, and at the destination a quiet topic told apart from a replication that stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.heartbeat import HeartbeatPublisher, caught_up
from egress.metrics import EgressMetrics
from ingress.events import IGNORED_HEARTBEAT, parse_s3_message
from ingress.heartbeats import HeartbeatReader, newest_per_partition
from replicator.core.keys import (
    SegmentKey,
    heartbeat_key,
    parse_group_export_key,
    parse_heartbeat_key,
)
from replicator.core.metrics import Metrics
from replicator.core.settings import load_settings
from replicator.core.storage import MemoryObjectStore, ObjectInfo
from replicator.core.wire import Heartbeat
from replicator.ops.sync import plan_sync
from tests.promql import fires, scrape
from tests.unit.test_ingress_freshness import FakeClock, rule
from tests.unit.test_ingress_worker import Harness, key, rec, write

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


@settings(max_examples=200, deadline=None)
@given(prefix=st.sampled_from(["data", "a/b", "x/y/z"]),
       region=st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True),
       topic=st.from_regex(r"[a-zA-Z0-9._-]{1,30}", fullmatch=True).filter(
           lambda t: t not in (".", "..")),
       instance=st.text(min_size=1, max_size=40))
def test_heartbeat_keys_round_trip_and_are_never_segments_nor_group_exports(
        prefix: str, region: str, topic: str, instance: str) -> None:
    k = heartbeat_key(prefix, region, topic, instance)
    assert parse_heartbeat_key(k) == (prefix, region, topic, instance)
    assert SegmentKey.try_parse(k) is None
    assert parse_group_export_key(k) is None


def test_heartbeat_json_round_trips_and_refuses_garbage() -> None:
    hb = Heartbeat("t", "us-east-1", "egress-0", T0, {0: 99, 3: 1234})
    assert Heartbeat.parse(hb.encode(), where="k") == hb
    assert json.loads(hb.encode())["caught_up"] == {"0": 99, "3": 1234}
    with pytest.raises(ValueError, match="k: 'written_at'"):
        Heartbeat.parse(b'{"topic": "t", "region": "r", "instance": "i"}', where="k")


@dataclass
class W:
    expected: int | None = 100
    segment: object | None = None
    closing: list[object] = field(default_factory=list)
    failed: object | None = None


def test_only_partitions_with_nothing_more_to_write_are_caught_up() -> None:
    writers = {0: W(), 1: W(segment=object()), 2: W(closing=[object()]), 3: W(failed=object()),
               4: W(expected=None), 5: W(), 6: W(), 7: W(expected=0)}
    positions = {0: 102, 1: 50, 2: 50, 3: 50, 4: 10, 5: 90, 7: 0}
    # 0: at the high watermark (a transaction marker after the last record); 5: behind it;
    # 6: no position known.
    highs = {0: 102, 1: 60, 2: 60, 3: 60, 4: 10, 5: 100, 6: 100, 7: 0}
    assert caught_up(writers, positions, highs) == {0: 99}


def test_publisher_writes_each_topic_at_its_interval() -> None:
    store = MemoryObjectStore("b")
    m = EgressMetrics(Metrics())
    intervals = {"quiet": timedelta(seconds=60)}
    pub = HeartbeatPublisher(store, prefix="data", region="us-east-1", instance="pod/0",
                             interval_of=intervals.get, metrics=m, wall=lambda: T0)
    assert pub.may_be_due(1000.0)
    assert pub.due(["quiet", "busy"], 1000.0) == ["quiet"]
    assert not pub.may_be_due(1000.5)         # the poll loop looks at most once a second
    assert pub.due(["quiet", "busy"], 1030.0) == []
    assert pub.due(["quiet"], 1060.0) == ["quiet"]
    pub.write("quiet", {0: 41})
    body = store.get(heartbeat_key("data", "us-east-1", "quiet", "pod/0"))
    assert Heartbeat.parse(body, where="x") == Heartbeat("quiet", "us-east-1", "pod/0", T0,
                                                         {0: 41})
    assert m.registry.value("replicator_egress_heartbeats_total",
                            {"region": "us-east-1", "topic": "quiet"}) == 1


def test_newest_heartbeat_per_partition_wins_over_an_older_owner() -> None:
    old = Heartbeat("t", "r", "pod-a", T0, {0: 10, 1: 20})
    new = Heartbeat("t", "r", "pod-b", T0 + timedelta(minutes=1), {0: 15})
    got = newest_per_partition([new, old])
    assert got[0].position == 15 and got[0].written_at == new.written_at
    assert got[1].position == 20


def test_heartbeat_objects_are_not_segment_events_and_sync_copies_them() -> None:
    k = heartbeat_key("data", "us-east-1", "t", "pod-0")
    body = json.dumps({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": "dest"}, "object": {"key": k, "size": 10}}}]})
    parsed = parse_s3_message(body, bucket="dest", prefix="data", sources={("us-east-1", "t")})
    assert parsed.ignored == [(IGNORED_HEARTBEAT, k)] and not parsed.events
    now = T0
    src = [ObjectInfo(k, 10, now, etag="new")]
    dst = [ObjectInfo(k, 10, now, etag="old")]
    assert [o.key for o in plan_sync(src, dst, "data").copy] == [k]   # rewritten in place
    assert plan_sync([], dst, "data").delete == []                    # never deleted


def test_a_quiet_topic_with_heartbeats_stays_fresh_and_a_stopped_one_alerts() -> None:
    """The destination tells "no records" from "no replication": heartbeats keep arriving
    for a quiet topic, and its lag stays small; when they stop (the bucket sync stopped),
    the lag grows and the alert fires.
    """
    h = Harness()
    last = rec(9).timestamp_ms / 1000.0        # records from 2023: a long-quiet topic
    clock = FakeClock(datetime.fromtimestamp(last, UTC) + timedelta(days=3))
    reader = HeartbeatReader(h.store, "data", h.m, clock)
    pub = HeartbeatPublisher(h.store, prefix="data", region="us-east-1", instance="egress-0",
                             interval_of=lambda t: timedelta(seconds=60),
                             metrics=EgressMetrics(Metrics()), wall=clock)
    expr = rule("ReplicatorReplicationLagHigh")
    try:
        write(h.store, key(0, 9))
        h.start(clock)
        h.wait(lambda: h.offsets()[-1:] == [9])
        worker = h.worker
        assert worker is not None

        def beat_and_read() -> None:
            # What the ingress controller does every topic_check_interval.
            reader.refresh([("us-east-1", "t")])
            beat = reader.caught_up(("us-east-1", "t"), 3)
            if beat is not None and worker.position is not None \
                    and worker.position >= beat.position:
                worker.freshness.heartbeat(beat.written_at)

        pub.write("t", {3: 9})                       # egress: nothing after position 9
        clock.now += timedelta(seconds=20)           # replicated, read 20 s later
        beat_and_read()
        samples = scrape(h.metrics.render().decode())
        assert h.metric("replicator_ingress_replication_lag_seconds") == pytest.approx(20)
        assert h.metrics.value("replicator_ingress_heartbeat_age_seconds",
                               {"region": "us-east-1", "topic": "t"}) == pytest.approx(20)
        assert not fires(expr, samples, clock.now.timestamp())
        for _ in range(60):                          # an hour of a quiet topic
            clock.now += timedelta(seconds=40)
            pub.write("t", {3: 9})
            clock.now += timedelta(seconds=20)
            beat_and_read()
        assert not fires(expr, scrape(h.metrics.render().decode()), clock.now.timestamp())
        # The bucket sync stops: no heartbeat arrives any more.
        for _ in range(45):
            clock.now += timedelta(minutes=1)
            beat_and_read()
        assert h.metrics.value("replicator_ingress_heartbeat_age_seconds",
                               {"region": "us-east-1", "topic": "t"}) == pytest.approx(45 * 60 + 20)
        assert fires(expr, scrape(h.metrics.render().decode()), clock.now.timestamp())
    finally:
        h.stop()


def test_a_heartbeat_ahead_of_the_replay_does_not_make_it_fresh() -> None:
    h = Harness()
    clock = FakeClock(T0)
    reader = HeartbeatReader(h.store, "data", h.m, clock)
    try:
        write(h.store, key(0, 9))
        h.start(clock)
        h.wait(lambda: h.offsets()[-1:] == [9])
        h.store.put(heartbeat_key("data", "us-east-1", "t", "e"),
                    Heartbeat("t", "us-east-1", "e", T0, {3: 50}).encode())
        reader.refresh([("us-east-1", "t")])
        beat = reader.caught_up(("us-east-1", "t"), 3)
        assert beat is not None and beat.position == 50
        assert h.worker is not None and h.worker.position == 9   # behind it: not applied
        lag = h.metric("replicator_ingress_replication_lag_seconds")
        assert lag == pytest.approx(T0.timestamp() - rec(9).timestamp_ms / 1000.0)
    finally:
        h.stop()


def test_heartbeat_interval_is_off_by_default_and_validated() -> None:
    base = {"region": "r", "s3": {"bucket": "b"}, "kafka": {"brokers": "x:1"},
            "egress": {"topics": {"t": {}}}}
    s = load_settings(data=base, environ={})
    assert s.egress is not None and s.egress.topic_settings("t").heartbeat_interval is None
    base["egress"] = {"topics": {"t": {"heartbeat_interval": "30s"}}}
    s = load_settings(data=base, environ={})
    assert s.egress is not None
    assert s.egress.topic_settings("t").heartbeat_interval == timedelta(seconds=30)
    from replicator.core.errors import ConfigErrors
    base["egress"] = {"topics": {"t": {"heartbeat_interval": "10ms"}}}
    with pytest.raises(ConfigErrors, match="heartbeat_interval"):
        load_settings(data=base, environ={})
