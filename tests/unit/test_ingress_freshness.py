"""Alerts that see a stall: the lag grows while nothing arrives, and the rules of
deploy/prometheus/replicator-alerts.yaml, evaluated on what ``/metrics`` serves, fire.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ingress.events import SegmentEvent
from ingress.freshness import PartitionFreshness
from ingress.metrics import IngressMetrics
from replicator.core.metrics import Metrics, MetricsServer
from tests.promql import fires, scrape
from tests.unit.test_ingress_worker import LABELS, Harness, key, rec, topic_json, write

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the alert rules")

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "replicator-alerts.yaml"


def rule(name: str) -> str:
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for r in group["rules"]:
            if r.get("alert") == name:
                return str(r["expr"])
    raise AssertionError(f"no alert {name} in {ALERTS}")


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[Harness, MetricsServer]]:
    h = Harness(timeout="24h")
    server = MetricsServer(h.metrics, "127.0.0.1", 0, healthy=lambda: True, ready=lambda: True)
    server.start()
    yield h, server
    h.stop()
    server.close()


def get_metrics(server: MetricsServer) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
        return scrape(r.read().decode())


def test_lag_grows_while_no_segment_arrives_and_the_lag_alert_fires(
        served: tuple[Harness, MetricsServer]) -> None:
    h, server = served
    last = rec(99).timestamp_ms / 1000.0
    clock = FakeClock(datetime.fromtimestamp(last + 60, UTC))
    write(h.store, key(0, 99))
    h.start(clock)
    h.wait(lambda: h.offsets()[-1:] == [99])
    expr = rule("ReplicatorReplicationLagHigh")
    samples = get_metrics(server)
    lag = samples["replicator_ingress_replication_lag_seconds"][frozenset(LABELS.items())]
    assert lag == pytest.approx(60)
    assert not fires(expr, samples, clock.now.timestamp())
    # The bucket sync stops: no segment, no event. Before, the gauge stayed at 60 s.
    clock.now += timedelta(minutes=45)
    samples = get_metrics(server)
    lag = samples["replicator_ingress_replication_lag_seconds"][frozenset(LABELS.items())]
    assert lag == pytest.approx(60 + 45 * 60)
    assert fires(expr, samples, clock.now.timestamp())
    # Replication resumes: fresh records bring the lag down again.
    write(h.store, key(100, 109))      # found by the worker's rescan
    h.wait(lambda: h.offsets()[-1:] == [109])
    assert h.metric("replicator_ingress_replication_lag_seconds") == pytest.approx(
        clock.now.timestamp() - rec(109).timestamp_ms / 1000.0)


def test_no_progress_while_segments_wait_fires_and_a_quiet_partition_does_not(
        served: tuple[Harness, MetricsServer]) -> None:
    h, server = served
    clock = FakeClock(datetime(2026, 11, 25, 12, 0, tzinfo=UTC))
    write(h.store, key(0, 9))
    write(h.store, key(20, 29))      # 10-19 did not arrive: a gap waited for
    h.start(clock)
    h.wait(lambda: h.offsets()[-1:] == [9] and h.metric("replicator_ingress_segments_late")
           == 10)
    expr = rule("ReplicatorIngressNoProgress")
    assert not fires(expr, get_metrics(server), clock.now.timestamp())
    clock.now += timedelta(minutes=31)
    assert fires(expr, get_metrics(server), clock.now.timestamp())


def test_a_caught_up_partition_reports_no_progress_alert(
        served: tuple[Harness, MetricsServer]) -> None:
    h, server = served
    clock = FakeClock(datetime(2026, 11, 25, 12, 0, tzinfo=UTC))
    write(h.store, key(0, 9))
    h.start(clock)
    h.wait(lambda: h.offsets()[-1:] == [9])
    h.wait(lambda: h.metric("replicator_ingress_segments_waiting") == 0)
    clock.now += timedelta(hours=3)
    assert not fires(rule("ReplicatorIngressNoProgress"), get_metrics(server),
                     clock.now.timestamp())


def test_absent_rules_see_a_process_from_its_start() -> None:
    empty = Metrics()
    m = Metrics()
    IngressMetrics.create(m)
    expr = rule("ReplicatorIngressAbsent")
    assert fires(expr, scrape(empty.render().decode()), 0)
    assert not fires(expr, scrape(m.render().decode()), 0)


def test_freshness_sources_and_series_removal() -> None:
    m = Metrics()
    im = IngressMetrics.create(m)
    clock = FakeClock(datetime(2026, 11, 25, 12, 0, tzinfo=UTC))
    f = PartitionFreshness(im, LABELS, clock)
    lag = "replicator_ingress_replication_lag_seconds"
    assert m.value(lag, LABELS) is None            # nothing known: no series
    f.resumed(clock.now - timedelta(minutes=10))   # a checkpoint: a lower bound
    assert m.value(lag, LABELS) == 600
    f.delivered(int((clock.now - timedelta(hours=1)).timestamp() * 1000))
    assert m.value(lag, LABELS) == 3600            # records replace the checkpoint's time
    f.heartbeat(clock.now - timedelta(seconds=30))  # egress had nothing newer
    assert m.value(lag, LABELS) == 30
    f.heartbeat(clock.now - timedelta(minutes=5))   # an older heartbeat changes nothing
    assert m.value(lag, LABELS) == 30
    clock.now += timedelta(minutes=1)
    assert m.value(lag, LABELS) == 90
    f.close()
    f.close()
    assert m.value(lag, LABELS) is None
    assert m.value("replicator_ingress_last_progress_timestamp_seconds", LABELS) is None


def test_a_worker_ending_after_its_successor_started_leaves_the_series_alone() -> None:
    m = Metrics()
    im = IngressMetrics.create(m)
    clock = FakeClock(datetime(2026, 11, 25, 12, 0, tzinfo=UTC))
    old = PartitionFreshness(im, LABELS, clock)
    old.resumed(clock.now)
    new = PartitionFreshness(im, LABELS, clock)     # the old one missed its deadline
    new.resumed(clock.now - timedelta(seconds=5))
    old.close()
    assert m.value("replicator_ingress_replication_lag_seconds", LABELS) == 5
    assert m.value("replicator_ingress_last_progress_timestamp_seconds", LABELS) is not None
    new.close()
    assert m.value("replicator_ingress_replication_lag_seconds", LABELS) is None


def test_a_partition_waiting_for_its_first_position_fires_only_once_it_has_segments() -> None:
    # Egress (an earlier release) never recorded where the partition begins: the source
    # produces, segments arrive, and nothing is replayed. The alert must see it (the lag
    # series of a partition that never replayed anything does not exist yet).
    h = Harness(first_delay="1h")
    server = MetricsServer(h.metrics, "127.0.0.1", 0, healthy=lambda: True, ready=lambda: True)
    server.start()
    expr = rule("ReplicatorIngressWaitingForFirstPosition")
    try:
        topic_json(h.store, {"0": 0})           # first_positions written; ours is not
        w = h.start()
        h.wait(lambda: w.replaying)
        assert not fires(expr, get_metrics(server), 0)      # nothing to replay yet
        write(h.store, key(2500, 2549))
        w.offer(SegmentEvent("created", key(2500, 2549)))
        h.wait(lambda: fires(expr, get_metrics(server), 0))
        assert h.offsets() == []
    finally:
        h.stop()
        server.close()
    # A partition whose worker ended leaves no firing series behind.
    assert not fires(expr, scrape(h.metrics.render().decode()), 0)
