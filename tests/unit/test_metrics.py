"""Metrics registry and the /metrics, /healthz, /readyz endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from replicator.core.metrics import Metrics, MetricsServer


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metric_names_are_prefixed_and_summed() -> None:
    m = Metrics()
    c = m.counter("segments_committed_total", "Segments.", ["topic", "reason"])
    c.labels(topic="t", reason="size").inc(2)
    c.labels(topic="t", reason="age").inc()
    c.labels(topic="u", reason="age").inc(5)
    g = m.gauge("replicator_lag", "Lag.", ["partition"])
    g.labels(partition="0").set(7)
    h = m.histogram("upload_seconds", "Uploads.", buckets=[0.1, 1])
    h.observe(0.5)
    assert m.value("segments_committed_total", {"topic": "t", "reason": "size"}) == 2
    assert m.value("segments_committed_total", {"topic": "t", "reason": "nope"}) is None
    assert m.total("segments_committed_total") == 8
    assert m.total("segments_committed_total", topic="t") == 3
    assert m.total("segments_committed_total", reason="age") == 6
    assert m.value("lag", {"partition": "0"}) == 7
    assert m.value("upload_seconds_count") == 1
    text = m.render().decode()
    assert "replicator_segments_committed_total{" in text
    assert "replicator_replicator_lag" not in text


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.counter("x_total", "x").inc()
    b.counter("x_total", "x")  # the same name in another registry is fine
    assert a.total("x_total") == 1
    assert b.total("x_total") == 0


class Flags:
    healthy = True
    ready = False


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, Flags]]:
    m = Metrics()
    m.counter("messages_total", "Messages.").inc(3)
    flags = Flags()
    srv = MetricsServer(m, "127.0.0.1", 0, healthy=lambda: flags.healthy,
                        ready=lambda: flags.ready)
    srv.start()
    yield srv, flags
    srv.close()
    srv.close()  # idempotent


def test_server_endpoints(server: tuple[MetricsServer, Flags]) -> None:
    srv, flags = server
    assert srv.port != 0
    base = f"http://127.0.0.1:{srv.port}"
    status, body = get(base + "/metrics")
    assert status == 200
    assert "replicator_messages_total 3.0" in body
    assert get(base + "/healthz") == (200, "ok\n")
    assert get(base + "/readyz") == (503, "not ok\n")
    flags.ready = True
    assert get(base + "/readyz?verbose=1") == (200, "ok\n")
    flags.healthy = False
    assert get(base + "/healthz")[0] == 503
    assert get(base + "/nope")[0] == 404
