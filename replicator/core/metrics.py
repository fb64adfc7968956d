"""The metrics seam: the only module that imports ``prometheus_client``.

``Metrics`` owns a registry and creates counters/gauges/histograms whose names start with
``replicator_``. ``MetricsServer`` serves ``/metrics``, ``/healthz`` and ``/readyz`` from a
daemon thread.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import prometheus_client as prom

log = logging.getLogger(__name__)

PREFIX = "replicator_"


@dataclass(frozen=True)
class MetricDefinition:
    """What a metric is, for the generated reference (docs/metrics.md)."""

    name: str
    kind: str
    doc: str
    labels: tuple[str, ...]


class Metrics:
    """A metric registry; one per controller (tests create as many as they like)."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry(auto_describe=True)
        self.definitions: list[MetricDefinition] = []

    def _define(self, name: str, kind: str, doc: str, labels: Sequence[str]) -> str:
        full = self._name(name)
        self.definitions.append(MetricDefinition(full, kind, doc, tuple(labels)))
        return full

    @staticmethod
    def _name(name: str) -> str:
        return name if name.startswith(PREFIX) else PREFIX + name

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Any:
        """A counter (``.labels(...).inc(n)``)."""
        return prom.Counter(self._define(name, "counter", doc, labels), doc, list(labels),
                            registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Any:
        """A gauge (``.labels(...).set(v)``)."""
        return prom.Gauge(self._define(name, "gauge", doc, labels), doc, list(labels),
                          registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Sequence[str] = (),
                  buckets: Sequence[float] | None = None) -> Any:
        """A histogram (``.labels(...).observe(v)``)."""
        kw: dict[str, Any] = {}
        if buckets is not None:
            kw["buckets"] = list(buckets)
        return prom.Histogram(self._define(name, "histogram", doc, labels), doc, list(labels),
                              registry=self.registry, **kw)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return bytes(prom.generate_latest(self.registry))

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """Current value of one sample (tests, summaries); ``None`` if absent."""
        v = self.registry.get_sample_value(self._name(name), labels or {})
        return None if v is None else float(v)

    def total(self, name: str, **match: str) -> float:
        """Sum of a metric's samples whose labels include ``match``."""
        full = self._name(name)
        total = 0.0
        for fam in self.registry.collect():
            for s in fam.samples:
                if s.name == full and all(s.labels.get(k) == v for k, v in match.items()):
                    total += s.value
        return total


def build_info(metrics: Metrics, controller: str, home_region: str = "") -> Any:
    """``replicator_{controller}_build_info{version,home_region}``, set to 1 at once: a
    series every running process exports from its start, for ``absent()`` alerts and, with
    the process's own region in ``home_region``, for rules that see one region's
    controllers vanish on a Prometheus that scrapes both regions.
    """
    try:
        version = importlib.metadata.version("kafka-s3-replicator")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    gauge = metrics.gauge(f"{controller}_build_info",
                          f"1 while the {controller} process runs (label: its version); "
                          "absent() of it means none is scraped.", ("version", "home_region"))
    gauge.labels(version=version, home_region=home_region).set(1)
    return gauge


class MetricsServer:
    """``/metrics``, ``/healthz`` (process alive and not failed), ``/readyz`` (working)."""

    def __init__(self, metrics: Metrics, host: str, port: int, *,
                 healthy: Callable[[], bool], ready: Callable[[], bool]) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.healthy = healthy
        self.ready = ready
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread (port 0 in settings means: don't serve)."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body, status, ctype = outer.metrics.render(), 200, prom.CONTENT_TYPE_LATEST
                elif path in ("/healthz", "/readyz"):
                    ok = outer.healthy() if path == "/healthz" else outer.ready()
                    body = b"ok\n" if ok else b"not ok\n"
                    status, ctype = (200 if ok else 503), "text/plain"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds would flood the log

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="metrics-http", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    def close(self) -> None:
        """Stop serving; idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
