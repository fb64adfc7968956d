"""Shared helpers of the benchmark scripts: data, stack, S3 request counting.

Nothing here is timed; the measurements live in ``run_all.py`` and the ``measure_*``
modules. Pure helpers (``text_value``, ``median``, ``summarize_requests``,
``parse_prometheus``, ``percentile``) have smoke tests in ``tests/unit/test_bench_lib.py``.
"""

from __future__ import annotations

import math
import os
import random
import re
import statistics
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cost import PRICES

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

WORDS = [b"sensor", b"temperature", b"humidity", b"pressure", b"reading", b"device",
         b"region", b"value", b"status", b"ok", b"warning", b"error", b"level", b"battery",
         b"signal", b"gateway", b"firmware"]
FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
              "topic.metadata.refresh.interval.ms": 1000}
MB = 1e6
GB = 1e9

PUT_CLASS = ("PutObject", "CopyObject", "CreateMultipartUpload", "UploadPart",
             "UploadPartCopy", "CompleteMultipartUpload", "ListObjectsV2", "ListObjects",
             "ListMultipartUploads", "ListParts")
GET_CLASS = ("GetObject", "HeadObject")
FREE = ("DeleteObject", "DeleteObjects", "AbortMultipartUpload")


def text_value(rng: random.Random, size: int) -> bytes:
    """A text-like value of exactly ``size`` bytes (compresses about 3x, like logs/JSON)."""
    out = bytearray()
    while len(out) < size:
        out += rng.choice(WORDS) + b" " + str(rng.randint(0, 99999)).encode() + b" "
    return bytes(out[:size])


def median(xs: Iterable[float]) -> float:
    """Median of the repeats (the machine is shared: medians, not best runs)."""
    values = list(xs)
    return float(statistics.median(values)) if values else float("nan")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of an ascending list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> metric name -> sum over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if m is None:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


# --- S3 request counting -------------------------------------------------------------


_SEGMENT_KEY = re.compile(r"/\d{20}-\d{20}$")


def _body_len(body: Any) -> int:
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if isinstance(body, memoryview):
        return body.nbytes
    try:  # file-like
        pos = body.tell()
        body.seek(0, 2)
        n = int(body.tell()) - int(pos)
        body.seek(pos)
        return n
    except (AttributeError, OSError, ValueError):
        return 0


@dataclass
class S3Counter:
    """Counts S3 API calls and bytes through botocore event hooks on a client.

    The hooks only read the request parameters and the parsed response: the code path
    being measured (our ``S3ObjectStore`` and its client) is unchanged.
    """

    calls: Counter[str] = field(default_factory=Counter)
    first_call: dict[str, float] = field(default_factory=dict)   # op -> perf_counter()
    bytes_up: int = 0
    bytes_down: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, client: Any) -> S3Counter:
        uid = f"bench-counter-{id(self)}"
        client.meta.events.register("before-parameter-build.s3", self._before,
                                    unique_id=uid + "-b")
        client.meta.events.register("after-call.s3", self._after, unique_id=uid + "-a")
        return self

    def _before(self, params: Mapping[str, Any], model: Any, **_: Any) -> None:
        n = _body_len(params["Body"]) if params.get("Body") is not None else 0
        key = params.get("Key")
        with self._lock:
            self.calls[model.name] += 1
            self.first_call.setdefault(model.name, time.perf_counter())
            if isinstance(key, str) and _SEGMENT_KEY.search(key):
                self.first_call.setdefault(model.name + ":segment", time.perf_counter())
            self.bytes_up += n

    def _after(self, parsed: Mapping[str, Any] | None = None, model: Any = None,
               **_: Any) -> None:
        if model is not None and model.name == "GetObject" and parsed:
            with self._lock:
                self.bytes_down += int(parsed.get("ContentLength") or 0)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"calls": dict(self.calls), "bytes_up": self.bytes_up,
                    "bytes_down": self.bytes_down}

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.first_call.clear()
            self.bytes_up = self.bytes_down = 0


def summarize_requests(snapshot: Mapping[str, Any], raw_bytes: float) -> dict[str, Any]:
    """Requests per GB of raw record bytes, grouped the way S3 bills them."""
    calls: Mapping[str, int] = snapshot["calls"]
    per_gb = GB / raw_bytes if raw_bytes else 0.0
    put = sum(calls.get(k, 0) for k in PUT_CLASS)
    get = sum(calls.get(k, 0) for k in GET_CLASS)
    other = {k: v for k, v in calls.items() if k not in PUT_CLASS + GET_CLASS + FREE}
    return {
        "calls": dict(sorted(calls.items())),
        "calls_per_gb": {k: round(v * per_gb, 1) for k, v in sorted(calls.items())},
        "put_class_per_gb": round(put * per_gb, 1),
        "get_class_per_gb": round(get * per_gb, 1),
        "delete_per_gb": round(sum(calls.get(k, 0) for k in FREE) * per_gb, 1),
        "uncategorized": other,
        "bytes_uploaded_per_gb": round(snapshot["bytes_up"] * per_gb),
        "bytes_downloaded_per_gb": round(snapshot["bytes_down"] * per_gb),
        "request_cost_usd_per_gb": round((put * PRICES["s3_put_per_1000"]
                                          + get * PRICES["s3_get_per_1000"]) / 1000
                                         * per_gb, 6),
    }


# --- process sampling ----------------------------------------------------------------


class RssSampler:
    """Samples a process's RSS (and its peak) every ``interval`` seconds on a thread."""

    def __init__(self, pid: int | None = None, interval: float = 0.02) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = self.proc.memory_info().rss
        self.baseline = self.peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class CpuTimeline:
    """Samples (perf_counter, this process's CPU time) every ``interval`` seconds, so the
    CPU used since a moment known only afterwards (e.g. the first GET) can be looked up."""

    def __init__(self, interval: float = 0.005) -> None:
        self.samples: list[tuple[float, float]] = []
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-timeline")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), time.process_time()))
            self._stop.wait(self.interval)

    def __enter__(self) -> CpuTimeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_at(self, t: float) -> float:
        """Process CPU seconds at wall time ``t`` (the last sample at or before it)."""
        before = [c for (w, c) in self.samples if w <= t]
        return before[-1] if before else (self.samples[0][1] if self.samples else 0.0)


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process (and its threads)."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def wait_until(pred: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(interval)


# --- data ----------------------------------------------------------------------------


def fill_topic(kafka: Any, topic: str, partitions: int, records: int, value_size: int,
               *, seed: int = 1, timestamp_ms: int | None = None) -> int:
    """Produce ``records`` keyed text-like records round-robin; returns raw key+value bytes."""
    from replicator.core.kafka import Producer

    rng = random.Random(seed)
    values = [text_value(rng, value_size) for _ in range(997)]
    p = Producer(kafka, overrides={"linger.ms": 20})
    raw = 0
    for i in range(records):
        key = b"device-%05d" % (i % 5000)
        v = values[i % len(values)]
        raw += len(key) + len(v)
        p.produce(topic, v, key, partition=i % partitions,
                  timestamp=0 if timestamp_ms is None else timestamp_ms + i)
        if i % 5000 == 0:
            p.poll(0)
    left = p.flush(180)
    if left:
        raise RuntimeError(f"{left} records of {topic} not delivered")
    return raw


# --- the embedded stack --------------------------------------------------------------


class BenchStack:
    """``LocalStack`` (two Kafka brokers, moto S3+SQS) plus settings builders.

    ``kafka``: ``tansu`` (the embedded default) or ``apache`` (Apache Kafka from
    ``$KAFKA_HOME``, the broker production runs).
    """

    def __init__(self, directory: Path, kafka: str = "tansu") -> None:
        from replicator.devstack.processes import check_broker_kind
        from replicator.devstack.stack import LocalStack

        self.dir = directory
        self.kafka = check_broker_kind(kafka)
        self.stack = LocalStack.start(directory / "stack", partitions=1, kafka=self.kafka)
        ep = self.stack.endpoints
        self.source_kafka = ep["source_kafka"]
        self.dest_kafka = ep["destination_kafka"]
        self.s3 = ep["s3"]

    def stop(self) -> None:
        self.stack.stop()

    def pid(self, name: str) -> int:
        return self.stack.servers[name].pid

    def broker_pid(self, region: str) -> int:
        """PID of the ``source`` or ``destination`` broker, whatever its kind."""
        from replicator.devstack.servers import broker_names

        source, destination = broker_names(self.kafka)
        return self.pid(source if region == "source" else destination)

    def raw_config(self, role: str) -> dict[str, Any]:
        return tomllib.loads(self.stack.config_paths[role].read_text())  # type: ignore[index]

    def egress_settings(self, topic: str, *, group: str, bucket: str | None = None,
                        segment_age: str = "1h", segment_size: str = "64MiB",
                        segment_messages: int = 10_000_000, metrics_port: int = 0,
                        extra: Mapping[str, Any] | None = None,
                        compression: str | None = None) -> Any:
        from replicator.core.settings import validate_settings

        raw = self.raw_config("egress")
        if compression is not None:
            raw["format"]["compression"] = compression
        raw["metrics"]["port"] = metrics_port
        raw["log"]["level"] = "WARNING"
        if bucket is not None:
            raw["s3"]["bucket"] = bucket
        raw["egress"]["group_id"] = group
        raw["egress"]["topics"] = {topic: {"max_segment_messages": segment_messages,
                                           "max_segment_size": segment_size,
                                           "max_segment_age": segment_age}}
        raw["egress"].update(extra or {})
        return validate_settings(raw)

    def ingress_settings(self, topic: str, dest_topic: str, *, group: str, delivery: str,
                         suffix: str, metrics_port: int = 0,
                         extra: Mapping[str, Any] | None = None) -> Any:
        from replicator.core.settings import validate_settings

        return validate_settings(self.ingress_raw(topic, dest_topic, group=group,
                                                  delivery=delivery, suffix=suffix,
                                                  metrics_port=metrics_port, extra=extra))

    def ingress_raw(self, topic: str, dest_topic: str, *, group: str, delivery: str,
                    suffix: str, metrics_port: int = 0,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raw = self.raw_config("ingress")
        raw["metrics"]["port"] = metrics_port
        raw["log"]["level"] = "WARNING"
        ing = raw["ingress"]
        ing.update(group_id=group, delivery=delivery,
                   segment_events_topic=f"bench.segmentevents.{suffix}",
                   checkpoint_topic=f"bench.checkpoint.{suffix}", sqs_wait_time="1s")
        ing.update(extra or {})
        src = ing["sources"][0]
        src.update(topic=topic, destination_topic=dest_topic, first_segment_delay="0s")
        return raw

    def store(self, settings: Any, counter: S3Counter | None = None) -> Any:
        from replicator.core.s3 import S3ObjectStore

        store = S3ObjectStore.from_settings(settings)
        if counter is not None:
            counter.attach(store.client)
        return store

    def create_bucket(self, name: str, region: str = "us-east-1") -> None:
        from replicator.devstack.aws import create_bucket

        create_bucket(self.stack.s3_client(region), name, region)


def produce_paced(producer: Any, topic: str, values: list[bytes], partitions: int,
                  bytes_per_s: float, seconds: float, *, record_bytes: int,
                  key: Callable[[int], bytes | None] = lambda n: None,
                  timestamps: bool = False) -> tuple[int, float, float]:
    """Produce ``values`` round-robin over ``partitions`` at ``bytes_per_s`` (counted as
    ``record_bytes`` per record) for ``seconds``, in 10 ms ticks, then flush. With
    ``timestamps`` each record carries the wall-clock time it was produced at (latency
    benches). Returns (records, start as ``time.time()``, seconds spent producing).
    """
    per_tick = bytes_per_s / record_bytes / 100.0
    t_start = time.time()
    n = 0
    while (now := time.time()) - t_start < seconds:
        target = (now - t_start) * 100.0 * per_tick
        while n < target:
            value, k, partition = values[n % len(values)], key(n), n % partitions
            if timestamps:
                producer.produce(topic, value, k, partition=partition,
                                 timestamp=int(time.time() * 1000))
            else:
                producer.produce(topic, value, k, partition=partition)
            n += 1
        producer.poll(0)
        time.sleep(0.01)
    produce_s = time.time() - t_start
    assert producer.flush(30) == 0
    return n, t_start, produce_s


def stop_all(procs: Iterable[Any], timeout: float = 30) -> None:
    """SIGTERM every child process still running, then wait ``timeout`` each; SIGKILL
    those that do not exit.
    """
    import signal
    import subprocess

    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def write_toml(path: Path, data: Mapping[str, Any]) -> Path:
    """The config file of a child process (``replicator.devstack.toml_writer``)."""
    from replicator.devstack.toml_writer import write_toml as write

    return write(path, data)
