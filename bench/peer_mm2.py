"""Peer benchmark: kafka-s3-replicator against Apache Kafka's MirrorMaker 2, same records.

    .venv/bin/python bench/peer_mm2.py              # full: 3 rounds, 1 KiB and 100 B, 4 and 64
                                                    # partitions, latency trickles (~1 h)
    .venv/bin/python bench/peer_mm2.py --quick      # smoke run: one round, small data (~6 min)
    .venv/bin/python bench/peer_mm2.py --only latency --rounds 1

Two single-node Apache Kafka clusters (KRaft, ``replicator.devstack.processes.start_kafka``
from ``KAFKA_HOME``, default ``../shared/kafka`` beside the repository) on this machine.
Each source topic is filled once with the same records (distinct text-like values, see
``peer_lib.DistinctText``); then, per round and back to back, it is copied

* by MirrorMaker 2 in dedicated mode (``bin/connect-mirror-maker.sh``): ``tasks.max`` =
  cores, target producer ``acks=all`` and the same codec and level as our segments,
  ``-Xmx1g``, everything else default (``peer_lib.mm2_properties``);
* by ours, as processes: ``replicator-egress`` → S3 bucket (moto) → ``replicator sync
  --follow`` → destination bucket → S3 events → SQS → ``replicator-ingress``, once
  exactly-once and once at-least-once, 10 000-message / 64 MiB / 1 s segments, everything
  else default.

Measured per copy: steady-state records/s and MB/s (10-90 % of the records arrived, from
the destination's end offsets, read_committed), CPU seconds per GB of the replicating
processes from ready to the last record (MM2: the JVM from its first record; ours: egress
+ ingress from egress's ``/healthz``), the S3 side apart (moto + the sync process: a
remote service in production), peak RSS, start-up apart. Completeness: MM2 every record
(count and an order-insensitive digest per partition), ours record for record
(``replicator.ops.verify``). Latency: a 1 MB/s trickle of 1 KiB records, p50/p99 of
CreateTime → a read_committed reader on the destination, for MM2 and our profiles; the S3
requests per GB of each profile from moto's request log. Ratios are ours/MM2 per round,
medians over rounds. Method and settings: bench/README.md; results: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from cost import cost_per_gb, count_operations, load_prices, log_bytes, request_cost_per_gb
from lib import MB, write_toml
from peer_lib import (
    PEER_METRICS,
    DistinctText,
    MultisetDigest,
    ProcSampler,
    Sample,
    first_at_final,
    latency_stats,
    medians,
    mm2_properties,
    named_thread_cpu,
    ratio_verdict,
    raw_consumer,
    raw_producer,
    render_table,
    round_ratios,
    steady_rate,
    steady_window,
    task_cpu,
    thread_cpu,
    value_seq,
)

HERE = Path(__file__).parent
ROOT = HERE.parent
SOURCE_REGION, DEST_REGION = "us-east-1", "us-west-1"
CREDS: dict[str, Any] = {"access_key_id": "test", "secret_access_key": "test"}
GB = 1e9

PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"rounds": 1, "sizes": [1024, 100], "partitions": [4],
              "records": {1024: 200_000, 100: 600_000},
              "latency_seconds": 20.0, "latency_warmup": 3.0,
              "latency_variants": ["mm2", "default", "low-latency"]},
    "full": {"rounds": 3, "sizes": [1024, 100], "partitions": [4, 64],
             "records": {1024: 1_000_000, 100: 3_000_000},
             "latency_seconds": 60.0, "latency_warmup": 5.0,
             "latency_variants": ["mm2", "default", "default+sync", "low-latency",
                                  "low-latency+sync"]},
}

SYSTEMS = ("mm2", "ours-eos", "ours-alo")

# Our two profiles. Segment thresholds are the peer comparison's (10 000 messages or
# 64 MiB); everything not named here is the product default (docs/configuration.md).
OUR_PROFILES: dict[str, dict[str, Any]] = {
    "default": {"max_segment_age": "1s", "sync_interval": 1.0},
    "low-latency": {"max_segment_age": "250ms", "sync_interval": 0.2},
}
SEGMENT_MESSAGES = 10_000
SEGMENT_SIZE = "64MiB"

# Goals of ours/MM2 (the project's targets), by value size: (rate >=, CPU per GB or record <=).
GOALS = {1024: {"records_per_s": 4.0, "cpu_s_per_gb": 0.3},
         100: {"records_per_s": 2.0, "cpu_us_per_record": 0.4}}
LATENCY_GOALS = {"low-latency": 1.0, "default": 2.5}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def resolve_kafka_home(value: str | None) -> Path:
    """``--kafka-home``, else ``$KAFKA_HOME``, else ``../shared/kafka`` beside the repo."""
    from replicator.devstack.processes import kafka_home

    if value or os.environ.get("KAFKA_HOME"):
        return kafka_home(value)
    default = ROOT.parent / "shared" / "kafka"
    if (default / "bin" / "connect-mirror-maker.sh").is_file():
        return default
    raise SystemExit(f"peer_mm2: no Apache Kafka distribution: set KAFKA_HOME (or pass "
                     f"--kafka-home) to an unpacked Apache Kafka (>= 3.8, with "
                     f"bin/connect-mirror-maker.sh); {default} does not exist")


def http_get(port: int, path: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return str(r.read().decode()) if r.status == 200 else None
    except OSError:
        return None


def wait_for(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.05,
             alive: Callable[[], str | None] | None = None) -> float:
    """Poll ``pred``; the time it became true. ``alive`` returns why to give up early."""
    deadline = time.monotonic() + timeout
    while not pred():
        if alive is not None and (why := alive()) is not None:
            raise RuntimeError(f"{what}: {why}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(interval)
    return time.time()


# --- processes ----------------------------------------------------------------------


@dataclass
class Proc:
    """A child process we started (its own session) and its log."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> str | None:
        code = self.popen.poll()
        if code is None:
            return None
        return f"{self.name} exited with code {code}; log tail:\n{self.tail()}"

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait; SIGKILL after ``timeout``. The exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{self.name} (pid {self.pid}) did not exit on SIGTERM, killing it")
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode


def spawn(name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> Proc:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env=env if env is not None else dict(os.environ))
    return Proc(name, popen, log_path)


def cli(name: str) -> str:
    return str(Path(sys.executable).parent / name)


# --- arrivals -----------------------------------------------------------------------


class Arrivals:
    """Polls a destination topic's end offsets (read_committed: the last stable offset).

    ``samples`` is the timeline of their sum; ``ends`` the latest per partition. A topic
    that does not exist yet counts 0.
    """

    def __init__(self, brokers: str, topic: str, partitions: int, interval: float) -> None:
        self.topic, self.partitions, self.interval = topic, partitions, interval
        self.consumer = raw_consumer(brokers, f"peer-arrivals-{uuid.uuid4().hex[:6]}",
                                     {"isolation.level": "read_committed"})
        self.samples: list[Sample] = []
        self.ends = [0] * partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="arrivals")

    def _sweep(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        ends = []
        for p in range(self.partitions):
            try:
                _, hi = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                            timeout=5, cached=False)
            except KafkaException:
                hi = 0
            ends.append(max(0, int(hi or 0)))
        self.ends = [max(a, b) for a, b in zip(self.ends, ends, strict=True)]
        self.samples.append((time.time(), float(sum(self.ends))))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sweep()
            self._stop.wait(self.interval)

    def __enter__(self) -> Arrivals:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sweep()
        self.consumer.close()

    def first_arrival(self) -> float | None:
        return next((t for t, v in self.samples if v > 0), None)


# --- the bench ----------------------------------------------------------------------


@dataclass
class Dataset:
    """One filled source topic."""

    name: str
    topic: str
    partitions: int
    value_size: int
    records: int
    raw_bytes: int
    counts: list[int]
    digest: MultisetDigest | None = None
    values: str = "text"


class RandomValues:
    """Random values (incompressible), each starting with its sequence number like
    ``DistinctText``'s (``SEQ_DIGITS`` digits and a space), so the checks read them alike."""

    def __init__(self, seed: int = 11) -> None:
        import random

        self.rng = random.Random(seed)

    def value(self, seq: int, size: int) -> bytes:
        head = b"%012d " % seq
        return (head + self.rng.randbytes(max(0, size - len(head))))[:size]


@dataclass
class Peer:
    work: Path
    kafka_home: Path
    args: argparse.Namespace
    profile: dict[str, Any]
    servers: dict[str, Any] = field(default_factory=dict)
    data: DistinctText = field(default_factory=DistinctText)
    results: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    prices: dict[str, float] = field(default_factory=lambda: load_prices(None))

    # --- clusters ---------------------------------------------------------------------

    def start_clusters(self) -> None:
        from replicator.devstack.processes import start_kafka

        t0 = time.perf_counter()
        for name in ("source", "destination"):
            self.servers[name] = start_kafka(f"peer-kafka-{name}", self.work / "logs",
                                             home=self.kafka_home)
        log(f"Apache Kafka source {self.src} and destination {self.dst} up in "
            f"{time.perf_counter() - t0:.1f}s")

    def stop_all(self) -> None:
        for s in self.servers.values():
            s.stop(timeout=20)

    @property
    def src(self) -> str:
        return str(self.servers["source"].address)

    @property
    def dst(self) -> str:
        return str(self.servers["destination"].address)

    def kafka(self, which: str) -> Any:
        from replicator.core.settings import KafkaSettings

        return KafkaSettings(brokers=self.src if which == "source" else self.dst)

    def admin(self, which: str) -> Any:
        from replicator.core.kafka import Admin

        return Admin(self.kafka(which), timeout=60)

    # --- data -------------------------------------------------------------------------

    def fill(self, value_size: int, partitions: int, records: int, values: str = "text"
             ) -> Dataset:
        name = f"{'1KiB' if value_size == 1024 else f'{value_size}B'}-{partitions}p"
        if values != "text":
            name += f"-{values}"
        topic = f"peer.{name}.{uuid.uuid4().hex[:6]}"
        self.admin("source").create_topic(topic, partitions)
        t0 = time.perf_counter()
        p = raw_producer(self.src, {"linger.ms": 20})
        raw = 0
        counts = [0] * partitions
        value = self.data.value if values == "text" else RandomValues().value
        for i in range(records):
            key = b"device-%05d" % (i % 5000)
            v = value(i, value_size)
            raw += len(key) + len(v)
            part = i % partitions
            counts[part] += 1
            while True:
                try:
                    p.produce(topic, v, key, part)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 10_000 == 0:
                p.poll(0)
        left = p.flush(300)
        if left:
            raise RuntimeError(f"{left} records of {topic} not delivered")
        log(f"filled {topic}: {records:,} records, {raw / MB:.0f} MB raw in "
            f"{time.perf_counter() - t0:.0f}s")
        return Dataset(name, topic, partitions, value_size, records, raw, counts,
                       values=values)

    def source_digest(self, ds: Dataset) -> MultisetDigest:
        if ds.digest is None:
            ds.digest = self.topic_digest("source", ds.topic, ds.partitions)
        return ds.digest

    def topic_digest(self, which: str, topic: str, partitions: int) -> MultisetDigest:
        from replicator.ops.verify import digest, read_partition, record_view

        d = MultisetDigest()
        for p in range(partitions):
            for m in read_partition(self.kafka(which), topic, p, idle_timeout=60):
                d.add(p, digest(record_view(m)))
        return d

    # --- MirrorMaker 2 ----------------------------------------------------------------

    def mm2_config(self, run: str, topic: str) -> tuple[Path, str]:
        alias = f"s{run}"
        props = mm2_properties(source_alias=alias, target_alias=f"t{run}",
                               source_bootstrap=self.src, target_bootstrap=self.dst,
                               topic=topic, tasks=self.args.mm2_tasks,
                               compression=self.args.mm2_compression,
                               compression_level=self.args.mm2_compression_level)
        path = self.work / run / "mm2.properties"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(props)
        return path, f"{alias}.{topic}"

    def mm2_start(self, run: str, props: Path) -> Proc:
        env = {**os.environ, "KAFKA_HEAP_OPTS": f"-Xmx{self.args.mm2_heap}",
               "KAFKA_JMX_OPTS": " ", "LOG_DIR": str(self.work / run / "mm2-logs")}
        return spawn("mirrormaker2", [str(self.kafka_home / "bin" / "connect-mirror-maker.sh"),
                                      str(props)], self.work / run / "mm2.log", env)

    def new_topics_cleanup(self, before: dict[str, set[str]], keep: set[str]) -> None:
        for which in ("source", "destination"):
            a = self.admin(which)
            new = sorted(set(a.list_topics()) - before[which] - keep)
            try:
                a.delete_topics(new)
            except Exception as e:  # noqa: BLE001 - cleanup only
                log(f"  deleting topics {new} on {which} failed: {e}")

    def topics_now(self) -> dict[str, set[str]]:
        return {w: set(self.admin(w).list_topics()) for w in ("source", "destination")}

    def mm2_copy(self, ds: Dataset) -> dict[str, Any]:
        run = uuid.uuid4().hex[:6]
        props, dest = self.mm2_config(run, ds.topic)
        before = self.topics_now()
        timeout = self.copy_timeout(ds)
        with ProcSampler() as sampler, Arrivals(self.dst, dest, ds.partitions,
                                                self.poll_interval(ds)) as arr:
            self.watch_brokers(sampler)
            t_launch = time.time()
            mm2 = self.mm2_start(run, props)
            sampler.watch("mm2", mm2.pid)
            try:
                self.wait_copied(arr, ds, timeout, mm2.exited)
                sampler.sample_now()
            finally:
                code = mm2.stop()
        t_first, t_done = arr.first_arrival(), first_at_final(arr.samples)
        assert t_first is not None and t_done is not None
        final = arr.samples[-1][1]
        rate = steady_rate(arr.samples, final, ds.records, ds.raw_bytes)
        cpu = sampler.cpu_between("mm2", t_first, t_done)
        w = steady_window(arr.samples, final)
        cpu_window = sampler.cpu_between("mm2", w.t_lo, w.t_hi) if w else float("nan")
        problems = self.source_digest(ds).differences(
            self.topic_digest("destination", dest, ds.partitions))
        self.new_topics_cleanup(before, keep=set())
        r: dict[str, Any] = {
            **rate, "system": "mm2", "exit_code": code,
            "startup_s": t_first - t_launch,
            "startup_cpu_s": sampler.cpu_between("mm2", t_launch, t_first),
            "copy_s": t_done - t_first,
            "cpu_s": cpu, **per_volume(cpu, ds),
            "cpu_s_per_gb_steady": cpu_window / (0.8 * ds.raw_bytes / GB) if w else None,
            "peak_rss_mb": sampler.peak_rss(["mm2"]) / 2**20,
            **whole_run(sampler, ["mm2"], t_launch, t_done, ds),
            **broker_cpu(sampler, t_first, t_done, ds),
            "complete": not problems, "problems": problems[:5],
            "destination_records": final,
        }
        # MM2 fetches the source batches across the regions: the source log files' bytes.
        fetched = log_bytes(Path(self.servers["source"].data_dir), ds.topic)
        r["cost"] = cost_per_gb(source_bytes=ds.raw_bytes, cpu_s=cpu, requests={},
                                stored_bytes=0, cross_region_bytes=fetched,
                                prices=self.prices)
        self.check_complete(r, f"MM2 {ds.name}")
        return r

    # --- ours -------------------------------------------------------------------------

    def our_stack(self, run: str, topic: str, dest_topic: str, *, delivery: str,
                  segment_age: str, sync_interval: float | None) -> OurStack:
        """Moto, buckets, queue, notifications and the configs of one of our copies.

        With ``sync_interval`` egress writes to a source bucket and ``replicator sync``
        copies to the destination bucket; without, egress writes straight into the
        destination bucket (the bucket replication hop is left out).
        """
        from replicator.core import s3, sqs
        from replicator.devstack import aws
        from replicator.devstack.processes import free_port, start_moto

        d = self.work / run
        moto = start_moto(d / "logs", name=f"moto-{run}")
        url = f"http://{moto.address}"
        src_bucket, dst_bucket = f"peer-src-{run}", f"peer-dst-{run}"
        dst_client = s3.make_s3_client(endpoint_url=url, region=DEST_REGION, **CREDS)
        aws.create_bucket(dst_client, dst_bucket, DEST_REGION)
        aws.set_lifecycle_for_temp(dst_client, dst_bucket, "temp", days=1)
        if sync_interval is not None:
            src_client = s3.make_s3_client(endpoint_url=url, region=SOURCE_REGION, **CREDS)
            aws.create_bucket(src_client, src_bucket, SOURCE_REGION)
            aws.set_lifecycle_for_temp(src_client, src_bucket, "temp", days=1)
        sqs_client = sqs.make_sqs_client(endpoint_url=url, region=DEST_REGION, **CREDS)
        queue = f"peer-q-{run}"
        aws.create_queue(sqs_client, queue, source_bucket=dst_bucket)
        aws.set_bucket_notifications(dst_client, dst_bucket, sqs.SqsQueue(sqs_client, queue).arn,
                                    prefix="data/")
        eg_port, in_port = free_port(), free_port()
        common = {"metrics": {"host": "127.0.0.1", "port": 0},
                  "log": {"level": "INFO", "format": "json"}}
        eg = {"region": SOURCE_REGION,
              "s3": {"bucket": src_bucket if sync_interval is not None else dst_bucket,
                     "endpoint_url": url, **CREDS},
              "kafka": {"brokers": self.src}, **common,
              "egress": {"group_id": f"peer-egress-{run}",
                         "topics": {topic: {"max_segment_messages": self.args.segment_messages,
                                            "max_segment_size": SEGMENT_SIZE,
                                            "max_segment_age": segment_age}}}}
        eg["metrics"] = {"host": "127.0.0.1", "port": eg_port}
        ing = {"region": DEST_REGION,
               "s3": {"bucket": dst_bucket, "endpoint_url": url, **CREDS},
               "kafka": {"brokers": self.dst}, **common,
               "ingress": {"group_id": f"peer-ingress-{run}", "sqs_queue": queue,
                           "sqs_endpoint_url": url, "delivery": delivery,
                           "segment_events_topic": f"peer.segmentevents.{run}",
                           "checkpoint_topic": f"peer.checkpoint.{run}",
                           "sources": [{"region": SOURCE_REGION, "topic": topic,
                                        "destination_topic": dest_topic,
                                        # The copy starts at offset 0: nothing earlier can
                                        # arrive late (the default waits 5 minutes).
                                        "first_segment_delay": "0s"}]}}
        ing["metrics"] = {"host": "127.0.0.1", "port": in_port}
        apply_settings(eg, self.args.egress_set)
        apply_settings(ing, self.args.ingress_set)
        return OurStack(run, d, moto, url, src_bucket, dst_bucket, eg_port, in_port,
                        write_toml(d / "egress.toml", eg), write_toml(d / "ingress.toml", ing),
                        sync_interval)

    def ours_copy(self, ds: Dataset, delivery: str, profile_dir: Path | None = None
                  ) -> dict[str, Any]:
        run = uuid.uuid4().hex[:6]
        dest = f"{ds.topic}.copy-{run}"
        before = self.topics_now()
        st = self.our_stack(run, ds.topic, dest, delivery=delivery,
                            segment_age=OUR_PROFILES["default"]["max_segment_age"],
                            sync_interval=OUR_PROFILES["default"]["sync_interval"])
        timeout = self.copy_timeout(ds)
        spies: list[Proc] = []
        threads: dict[str, dict[str, float]] = {}
        tasks: dict[str, Any] = {}
        egress_metrics: str | None = None
        try:
            with ProcSampler() as sampler, Arrivals(self.dst, dest, ds.partitions,
                                                    self.poll_interval(ds)) as arr:
                sampler.watch("moto", st.moto.pid)
                self.watch_brokers(sampler)
                t_launch = time.time()
                log_start = st.moto_log_size()
                ingress, _sync, egress = st.launch(sampler)
                alive = st.why_down
                t_ready = wait_for(lambda: http_get(st.eg_port, "/healthz") is not None, 120,
                                   "egress /healthz", 0.02, alive)
                sampler.sample_now()
                threads_ready = {p.name: thread_cpu(p.pid) for p in (egress, ingress)}
                tasks_ready = {p.name: task_cpu(p.pid) for p in (egress, ingress)}
                if profile_dir is not None:
                    spies = [self.py_spy(p, profile_dir, f"{ds.name}-{delivery}")
                             for p in (egress, ingress)]
                self.wait_copied(arr, ds, timeout, alive, ingress_port=st.in_port)
                sampler.sample_now()
                for spy in spies:   # the profile ends with the copy, not with the shutdown
                    spy.popen.send_signal(signal.SIGINT)
                threads = {p.name: diff_threads(thread_cpu(p.pid), threads_ready[p.name])
                           for p in (egress, ingress)}
                tasks = {p.name: (tasks_ready[p.name], task_cpu(p.pid))
                         for p in (egress, ingress)}
                egress_metrics = http_get(st.eg_port, "/metrics")
        finally:
            codes = st.stop()
            for s in spies:
                s.stop(30)
        # Every request of the copy (egress, sync, ingress, SQS), start-up and drain included.
        requests = count_operations(st.moto_log_slice(log_start, st.moto_log_size()),
                                    copy_prefixes=(f"/{st.src_bucket}/data/",))
        t_first, t_done = arr.first_arrival(), first_at_final(arr.samples)
        assert t_first is not None and t_done is not None
        final = arr.samples[-1][1]
        rate = steady_rate(arr.samples, final, ds.records, ds.raw_bytes)
        cpu = {n: sampler.cpu_between(n, t_ready, t_done) for n in sampler.pids}
        ours_cpu = cpu["egress"] + cpu["ingress"]
        s3_cpu = cpu["moto"] + cpu.get("sync", 0.0)
        w = steady_window(arr.samples, final)
        stored = segments = None
        if egress_metrics:
            from lib import parse_prometheus

            m = parse_prometheus(egress_metrics)
            stored = m.get("replicator_egress_segment_bytes_total")
            segments = m.get("replicator_egress_segments_total")
        from replicator.ops.verify import verify_topics

        report = verify_topics(self.kafka("source"), ds.topic, self.kafka("destination"), dest,
                               idle_timeout=60)
        self.new_topics_cleanup(before, keep=set())
        r = {
            **rate, "system": f"ours-{'eos' if delivery == 'exactly-once' else 'alo'}",
            "exit_codes": codes,
            "startup_s": t_first - t_launch, "ready_s": t_ready - t_launch,
            "startup_cpu_s": sum(sampler.cpu_between(n, t_launch, t_ready)
                                 for n in ("egress", "ingress")),
            "copy_s": t_done - t_first,
            "cpu_s": ours_cpu, **per_volume(ours_cpu, ds),
            "egress_cpu_s": cpu["egress"], "ingress_cpu_s": cpu["ingress"],
            "moto_cpu_s": cpu["moto"], "sync_cpu_s": cpu.get("sync", 0.0),
            "s3_side_cpu_s_per_gb": s3_cpu / (ds.raw_bytes / GB),
            "cpu_s_per_gb_steady": (sum(sampler.cpu_between(n, w.t_lo, w.t_hi)
                                        for n in ("egress", "ingress"))
                                    / (0.8 * ds.raw_bytes / GB)) if w else None,
            "peak_rss_mb": sampler.peak_rss(["egress", "ingress"]) / 2**20,
            "peak_rss_egress_mb": sampler.peak_rss(["egress"]) / 2**20,
            "peak_rss_ingress_mb": sampler.peak_rss(["ingress"]) / 2**20,
            "thread_cpu": threads, "task_cpu": tasks,
            **whole_run(sampler, ["egress", "ingress"], t_launch, t_done, ds),
            **broker_cpu(sampler, t_ready, t_done, ds),
            "compression_ratio": ds.raw_bytes / stored if stored else None,
            "segments": segments,
            "complete": report.ok, "verify": report.totals(),
            "problems": report.problems[:5],
            "destination_positions": final,
            "profiled": profile_dir is not None,
            # Ours: each segment object crosses once (S3 Replication / replicator sync).
            "cost": cost_per_gb(source_bytes=ds.raw_bytes, cpu_s=ours_cpu,
                                requests=requests, stored_bytes=stored or 0,
                                cross_region_bytes=stored or 0, prices=self.prices),
        }
        self.check_complete(r, f"ours {delivery} {ds.name}")
        return r

    def py_spy(self, target: Proc, out_dir: Path, label: str) -> Proc:
        """``py-spy record`` of a running process (raw collapsed stacks, native frames)."""
        exe = Path(sys.executable).parent / "py-spy"
        out_dir.mkdir(parents=True, exist_ok=True)
        raw = out_dir / f"{target.name}-{label}.raw"
        argv = [str(exe), "record", "--pid", str(target.pid), "--rate", "100", "--format",
                "raw", "--threads", "-o", str(raw)]
        # --native unwinds C frames too (zstd, Arrow, librdkafka calls); it needs to pause
        # the process for each sample, so without it py-spy does not (--nonblocking).
        argv.insert(-2, "--native" if self.args.profile_native else "--nonblocking")
        return spawn(f"py-spy-{target.name}", argv, out_dir / f"{target.name}-{label}.spy.log")

    # --- shared -----------------------------------------------------------------------

    def watch_brokers(self, sampler: ProcSampler) -> None:
        for name in ("source", "destination"):
            sampler.watch(f"kafka-{name}", self.servers[name].pid)

    def copy_timeout(self, ds: Dataset) -> float:
        return 300.0 + ds.raw_bytes / (2 * MB)   # a floor of 2 MB/s, plus start-up

    def poll_interval(self, ds: Dataset) -> float:
        return 0.1 if ds.partitions <= 8 else 0.25

    def wait_copied(self, arr: Arrivals, ds: Dataset, timeout: float,
                    alive: Callable[[], str | None], ingress_port: int | None = None) -> None:
        """Until every partition's end offset covers the source's records (and, for ours,
        every checkpoint is at the source's end); fails on a stall or an exit."""
        deadline = time.monotonic() + timeout
        last, last_change = -1.0, time.monotonic()
        target_checkpoints = sum(c - 1 for c in ds.counts)
        while True:
            time.sleep(0.2)
            if (why := alive()) is not None:
                raise RuntimeError(why)
            now_sum = arr.samples[-1][1] if arr.samples else 0.0
            if now_sum != last:
                last, last_change = now_sum, time.monotonic()
            elif time.monotonic() - last_change > 180:
                raise TimeoutError(f"no progress for 180 s at {now_sum:.0f} positions")
            if time.monotonic() > deadline:
                raise TimeoutError(f"copy not complete within {timeout:.0f}s")
            if not all(e >= c for e, c in zip(arr.ends, ds.counts, strict=True)):
                continue
            if ingress_port is None:
                return
            from lib import parse_prometheus

            text = http_get(ingress_port, "/metrics")
            if text and parse_prometheus(text).get(
                    "replicator_ingress_checkpoint_offset", -1) >= target_checkpoints:
                return

    def check_complete(self, r: dict[str, Any], what: str) -> None:
        if not r["complete"]:
            msg = f"{what}: copy NOT complete: {r.get('problems') or r.get('verify')}"
            log(msg)
            self.failures.append(msg)

    # --- latency ----------------------------------------------------------------------

    def trickle(self, variant: str) -> dict[str, Any]:
        """``rate`` MB/s of 1 KiB records through MM2 or one of our profiles."""
        from confluent_kafka import TopicPartition

        run = uuid.uuid4().hex[:6]
        partitions, size = 4, 1024
        topic = f"peer.trickle.{run}"
        self.admin("source").create_topic(topic, partitions)
        before = self.topics_now()
        before["source"].add(topic)
        procs: list[Proc] = []
        st: OurStack | None = None
        if variant == "mm2":
            props, dest = self.mm2_config(run, topic)
            procs.append(self.mm2_start(run, props))
            alive: Callable[[], str | None] = procs[0].exited
        else:
            prof = OUR_PROFILES[variant.removesuffix("+sync")]
            dest = f"{topic}.copy-{run}"
            st = self.our_stack(run, topic, dest, delivery="exactly-once",
                                segment_age=prof["max_segment_age"],
                                sync_interval=prof["sync_interval"]
                                if variant.endswith("+sync") else None)
            st.launch(None)
            alive = st.why_down
        seqs: dict[int, tuple[int, int, float]] = {}    # seq -> partition, offset, produced
        arrived: dict[int, float] = {}
        stop = threading.Event()
        consumer = raw_consumer(self.dst, f"peer-lat-{run}",
                                {"fetch.wait.max.ms": 10, "fetch.min.bytes": 1})
        t_start = 0.0
        log_marks: tuple[int, int] = (0, 0)
        try:
            wait_for(lambda: (self.admin("destination").partition_count(dest) or 0)
                     == partitions, 300, f"destination topic {dest}", 0.5, alive)
            consumer.assign([TopicPartition(dest, p, 0) for p in range(partitions)])

            def read() -> None:
                while not stop.is_set():
                    for m in consumer.consume(num_messages=1000, timeout=0.05):
                        if m.error() is None:
                            s = value_seq(m.value())
                            if s is not None:
                                arrived.setdefault(s, time.time())

            reader = threading.Thread(target=read, daemon=True, name="lat-reader")
            reader.start()

            def delivered(err: Any, msg: Any) -> None:
                if err is None:
                    s = value_seq(msg.value())
                    if s is not None and s in seqs:
                        seqs[s] = (msg.partition(), msg.offset(), seqs[s][2])

            producer = raw_producer(self.src, {"linger.ms": 5})
            value = self.data.value
            # Probes, one per partition, until they arrive: the pipeline is up end to end.
            probe_seq = 10**11 + int(run, 16) % 10**9 * 10
            for p in range(partitions):
                producer.produce(topic, value(probe_seq + p, size), b"probe", p)
            producer.flush(30)
            wait_for(lambda: all(probe_seq + p in arrived for p in range(partitions)), 300,
                     "probe records at the destination", 0.1, alive)
            if st is not None:
                log_marks = (st.moto_log_size(), 0)
            per_record = size + 12
            per_tick = self.args.latency_rate_mb * MB / per_record / 100.0
            seconds = self.profile["latency_seconds"]
            base = 10**10 + int(run, 16) % 10**9 * 1000
            n, sent = 0, 0.0
            t_start = time.time()
            while (now := time.time()) - t_start < seconds:
                target = (now - t_start) * 100.0 * per_tick
                while sent < target:
                    s = base + n
                    ts = time.time()
                    seqs[s] = (n % partitions, -1, ts)
                    producer.produce(topic, value(s, size), b"device-%05d" % (n % 5000),
                                     n % partitions, timestamp=int(ts * 1000),
                                     on_delivery=delivered)
                    n += 1
                    sent += 1
                producer.poll(0)
                time.sleep(0.01)
            produce_s = time.time() - t_start
            if producer.flush(30):
                raise RuntimeError("trickle records not delivered to the source")
            wait_for(lambda: all(base + i in arrived for i in range(n)), 120,
                     "every trickle record at the destination", 0.1, alive)
            if st is not None:
                log_marks = (log_marks[0], st.moto_log_size())
        finally:
            stop.set()
            for proc in procs:
                proc.stop()
            codes = st.stop() if st is not None else None
            consumer.close()
        warm = t_start + self.profile["latency_warmup"]
        lags = [arrived[s] - t for s, (_, _, t) in seqs.items() if t >= warm and s in arrived]
        raw = n * per_record
        r: dict[str, Any] = {"variant": variant, "records": n,
                             "rate_mb_per_s": raw / MB / produce_s,
                             **latency_stats(lags),
                             "max_incl_warmup_s": max((arrived[s] - t for s, (_, _, t)
                                                       in seqs.items() if s in arrived),
                                                      default=float("nan")),
                             "exit_codes": codes}
        if st is not None:
            counts = count_operations(st.moto_log_slice(*log_marks),
                                      copy_prefixes=(f"/{st.src_bucket}/data/",))
            r["requests"] = dict(counts)
            r["request_cost"] = request_cost_per_gb(counts, raw, self.prices)
            r["stages"] = stage_breakdown(st, topic, seqs, arrived, warm)
        self.new_topics_cleanup(before, keep={topic})
        self.admin("source").delete_topics([topic])
        return r

    # --- rounds -----------------------------------------------------------------------

    def throughput(self) -> None:
        p = self.profile
        systems = [s for s in SYSTEMS if s in self.args.systems]
        datasets = [self.fill(size, parts, p["records"][size], values)
                    for values in self.args.values
                    for size in p["sizes"] for parts in p["partitions"]]
        out: dict[str, Any] = {}
        self.results["throughput"] = out
        for ds in datasets:
            out[ds.name] = {"dataset": {k: getattr(ds, k) for k in (
                "topic", "partitions", "value_size", "records", "raw_bytes", "values")},
                "runs": {s: [] for s in systems}}
        for i in range(p["rounds"]):
            for ds in datasets:
                # Rotate the order each round so no system always runs first.
                order = systems[i % len(systems):] + systems[:i % len(systems)]
                for system in order:
                    log(f"round {i + 1}, {ds.name}, {system} (load {load_average()})")
                    try:
                        if system == "mm2":
                            r = self.mm2_copy(ds)
                        else:
                            r = self.ours_copy(ds, "exactly-once" if system == "ours-eos"
                                               else "at-least-once")
                    except Exception as e:  # noqa: BLE001 - a failed copy is reported
                        msg = f"round {i + 1} {ds.name} {system}: {type(e).__name__}: {e}"
                        log(msg + "\n" + traceback.format_exc())
                        self.failures.append(msg)
                        r = {"failed": msg}
                    r["round"] = i + 1
                    r["load_before"] = load_average()
                    out[ds.name]["runs"][system].append(r)
                    if "failed" not in r:
                        log(f"  {system}: {r['records_per_s']:,.0f} records/s "
                            f"{r['mb_per_s']:.1f} MB/s, {r['cpu_s_per_gb']:.1f} CPU-s/GB, "
                            f"peak RSS {r['peak_rss_mb']:.0f} MB, start-up "
                            f"{r['startup_s']:.1f}s, complete {r['complete']}")
            self.save()
        for ds in datasets:
            self.admin("source").delete_topics([ds.topic])
        for entry in out.values():
            summarize(entry)

    def latency(self) -> None:
        variants = [v for v in self.profile["latency_variants"]
                    if v in self.args.latency_variants]
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        self.results["latency"] = {"runs": runs}
        for i in range(self.profile["rounds"]):
            for v in variants:
                log(f"round {i + 1}, latency {v} (load {load_average()})")
                try:
                    r = self.trickle(v)
                except Exception as e:  # noqa: BLE001 - a failed run is reported
                    msg = f"round {i + 1} latency {v}: {type(e).__name__}: {e}"
                    log(msg + "\n" + traceback.format_exc())
                    self.failures.append(msg)
                    r = {"failed": msg}
                r["round"] = i + 1
                r["load_before"] = load_average()
                runs[v].append(r)
                if "failed" not in r:
                    log(f"  p50 {r['p50_s']:.2f}s p99 {r['p99_s']:.2f}s max {r['max_s']:.2f}s "
                        f"at {r['rate_mb_per_s']:.2f} MB/s")
            self.save()
        self.results["latency"]["median"] = {
            v: medians([r for r in rs if "failed" not in r]) for v, rs in runs.items()}

    def profile_runs(self, out_dir: Path) -> None:
        """One profiled exactly-once copy per value size and partition count: py-spy on
        egress and ingress from their /healthz to the last record; SVG + top frames."""
        import flame

        p = self.profile
        res: dict[str, Any] = {}
        self.results["profiles"] = res
        for size in p["sizes"]:
            for parts in p["partitions"]:
                ds = self.fill(size, parts, p["records"][size])
                for delivery in self.args.profile_deliveries:
                    log(f"profiling {ds.name} {delivery} (load {load_average()})")
                    try:
                        r = self.ours_copy(ds, delivery, profile_dir=out_dir)
                    except Exception as e:  # noqa: BLE001 - reported
                        self.failures.append(f"profile {ds.name} {delivery}: {e}")
                        log(traceback.format_exc())
                        continue
                    short = "eos" if delivery == "exactly-once" else "alo"
                    entry = {"records_per_s": r["records_per_s"], "mb_per_s": r["mb_per_s"],
                             "cpu_s_per_gb": r["cpu_s_per_gb"],
                             "egress_cpu_s": r["egress_cpu_s"],
                             "ingress_cpu_s": r["ingress_cpu_s"],
                             "thread_cpu": r["thread_cpu"]}
                    for proc in ("egress", "ingress"):
                        raw = out_dir / f"{proc}-{ds.name}-{delivery}.raw"
                        if not raw.exists():
                            continue
                        stacks = flame.parse(raw.read_text().splitlines())
                        start, end = r["task_cpu"][proc]
                        entry[f"{proc}_thread_cpu_s"] = named_thread_cpu(
                            start, end, flame.thread_names(stacks))
                        # Only running threads: --native samples waiting ones too.
                        stacks = flame.busy(stacks)
                        svg = out_dir / f"{proc}-{ds.name}-{short}.svg"
                        svg.write_text(flame.render_svg(
                            stacks, f"{proc}, {ds.name}, {delivery}: py-spy, {r['mb_per_s']:.0f}"
                                    f" MB/s, load {load_average()}"))
                        (out_dir / f"{proc}-{ds.name}-{short}.txt").write_text(
                            flame.top_table(stacks, 40) + "\n\npy-spy samples by thread: "
                            + ", ".join(f"{k} {v:.1%}"
                                        for k, v in flame.by_thread(stacks).items())
                            + "\nCPU seconds by thread (/proc, ready -> last record): "
                            + ", ".join(f"{k} {v}" for k, v in
                                        entry[f"{proc}_thread_cpu_s"].items()) + "\n")
                        entry[proc] = str(svg)
                    res[f"{ds.name}-{short}"] = entry
                self.admin("source").delete_topics([ds.topic])
                self.save()

    def save(self) -> None:
        path = self.args.json
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": self.meta(), "results": self.results,
                                    "failures": self.failures}, indent=2, default=str))

    def meta(self) -> dict[str, Any]:
        return {"command": "bench/peer_mm2.py " + " ".join(sys.argv[1:]),
                "profile": self.args.mode, "cpus": os.cpu_count(),
                "python": platform.python_version(), "kafka_home": str(self.kafka_home),
                "mm2": {"tasks.max": self.args.mm2_tasks, "heap": f"-Xmx{self.args.mm2_heap}",
                        "compression": self.args.mm2_compression,
                        "compression_level": self.args.mm2_compression_level},
                "ours": {"segments": f"{self.args.segment_messages} messages / {SEGMENT_SIZE}",
                         "profiles": OUR_PROFILES, "egress_set": self.args.egress_set,
                         "ingress_set": self.args.ingress_set},
                "latency_rate_mb": self.args.latency_rate_mb,
                "load_at_start": self.load_at_start, "load_now": load_average(),
                "started": self.started}

    load_at_start: str = ""
    started: str = ""


def summarize(entry: dict[str, Any]) -> None:
    """Medians per system and the ours/MM2 ratios (paired by round) of one dataset."""
    runs = entry["runs"]
    entry["median"] = {s: medians([r for r in rs if "failed" not in r])
                       for s, rs in runs.items()}
    if "mm2" not in runs:
        return
    for s in runs:
        if s == "mm2":
            continue
        pairs = [(o, m) for o, m in zip(runs[s], runs["mm2"], strict=False)
                 if "failed" not in o and "failed" not in m]
        entry.setdefault("ratio", {})[s] = round_ratios(
            [o for o, _ in pairs], [m for _, m in pairs],
            [m.key for m in PEER_METRICS] + ["whole_run_records_per_s",
                                             "whole_run_cpu_s_per_gb"])


def apply_settings(cfg: dict[str, Any], assignments: list[str]) -> None:
    """``a.b.c=value`` into a nested config (value: JSON if it parses, else a string)."""
    for item in assignments:
        key, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        *path, last = key.split(".")
        node = cfg
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value


def diff_threads(end: dict[str, float], start: dict[str, float]) -> dict[str, float]:
    """CPU seconds per thread group between two ``thread_cpu`` snapshots."""
    return {k: round(v - start.get(k, 0.0), 2) for k, v in end.items()}


def whole_run(sampler: ProcSampler, names: list[str], t_launch: float, t_done: float,
              ds: Dataset) -> dict[str, float]:
    """Rate and CPU per GB from the launch to the last record, start-up included."""
    cpu = sum(sampler.cpu_between(n, t_launch, t_done) for n in names)
    return {"whole_run_records_per_s": ds.records / (t_done - t_launch),
            "whole_run_cpu_s_per_gb": cpu / (ds.raw_bytes / GB)}


def broker_cpu(sampler: ProcSampler, t0: float, t1: float, ds: Dataset) -> dict[str, float]:
    """CPU per GB of the two Kafka brokers over the copy (not counted for either side)."""
    return {f"broker_{n}_cpu_s_per_gb": sampler.cpu_between(f"kafka-{n}", t0, t1)
            / (ds.raw_bytes / GB) for n in ("source", "destination")}


def per_volume(cpu: float, ds: Dataset) -> dict[str, float]:
    return {"cpu_s_per_gb": cpu / (ds.raw_bytes / GB),
            "cpu_us_per_record": cpu / ds.records * 1e6}


@dataclass
class OurStack:
    """One copy's moto server, buckets and configs, and its processes once launched."""

    run: str
    dir: Path
    moto: Any
    url: str
    src_bucket: str
    dst_bucket: str
    eg_port: int
    in_port: int
    egress_toml: Path
    ingress_toml: Path
    sync_interval: float | None
    procs: list[Proc] = field(default_factory=list)

    def launch(self, sampler: ProcSampler | None) -> tuple[Proc, Proc | None, Proc]:
        """Ingress (waits for its /healthz), the sync (if any), then egress."""
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_EC2_METADATA_DISABLED": "true"}
        ingress = spawn("ingress", [cli("replicator-ingress"), "--config",
                                    str(self.ingress_toml)], self.dir / "ingress.log", env)
        self.procs.append(ingress)
        if sampler is not None:
            sampler.watch("ingress", ingress.pid)
        wait_for(lambda: http_get(self.in_port, "/healthz") is not None, 120,
                 "ingress /healthz", 0.05, ingress.exited)
        sync = None
        if self.sync_interval is not None:
            sync = spawn("sync", [cli("replicator"), "sync", "--from-bucket", self.src_bucket,
                                  "--to-bucket", self.dst_bucket, "--endpoint-url", self.url,
                                  "--from-region", SOURCE_REGION, "--to-region", DEST_REGION,
                                  "--follow", "--interval", str(self.sync_interval)],
                         self.dir / "sync.log", env)
            self.procs.append(sync)
            if sampler is not None:
                sampler.watch("sync", sync.pid)
        egress = spawn("egress", [cli("replicator-egress"), "--config", str(self.egress_toml)],
                       self.dir / "egress.log", env)
        self.procs.append(egress)
        if sampler is not None:
            sampler.watch("egress", egress.pid)
        return ingress, sync, egress

    def why_down(self) -> str | None:
        for p in self.procs:
            if (why := p.exited()) is not None:
                return why
        return None

    def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for p in reversed(self.procs):   # egress, sync, ingress
            codes[p.name] = p.stop()
        self.moto.stop(timeout=5)
        return codes

    @property
    def moto_log(self) -> Path:
        return Path(self.moto.log_path)

    def moto_log_size(self) -> int:
        try:
            return self.moto_log.stat().st_size
        except OSError:
            return 0

    def moto_log_slice(self, start: int, end: int) -> list[str]:
        with open(self.moto_log, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start)).decode(errors="replace").splitlines()

    def json_log(self, name: str) -> Iterator[tuple[float, str]]:
        """(unix time, message) of a JSON-format process log."""
        for line in (self.dir / f"{name}.log").read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
                t = datetime.fromisoformat(rec["time"]).timestamp()
            except (ValueError, KeyError):
                continue
            yield t, str(rec.get("message", ""))


def stage_breakdown(st: OurStack, topic: str, seqs: dict[int, tuple[int, int, float]],
                    arrived: dict[int, float], warm: float) -> dict[str, Any]:
    """Where a trickle record's delay goes, from the processes' own log lines.

    Per record (after the warm-up), with its segment found by source offset: produce →
    egress logged the segment committed (age wait, upload, copy to the final key, delete
    the temp object, offset commit) → [sync copied it] → ingress started replaying it
    (S3 event, SQS, relay, segment-events topic, dispatch) → ingress finished it
    (GET, decode, produce, commit) → the reader received the record.
    """
    import bisect
    import re

    from lib import median, percentile

    from replicator.core.keys import SegmentKey

    key_re = re.compile(r"segment (data/\S+?)[ ,:]")
    committed: dict[tuple[int, int], float] = {}
    started: dict[tuple[int, int], float] = {}
    done: dict[tuple[int, int], float] = {}
    for t, msg in st.json_log("egress"):
        m = key_re.search(msg + " ")
        if m and " committed (" in msg:
            k = SegmentKey.try_parse(m.group(1))
            if k is not None and k.topic == topic:
                committed[(k.partition, k.start)] = t
    for t, msg in st.json_log("ingress"):
        m = key_re.search(msg + " ")
        if not m:
            continue
        k = SegmentKey.try_parse(m.group(1))
        if k is None or k.topic != topic:
            continue
        if ": replaying segment " in msg:
            started.setdefault((k.partition, k.start), t)
        elif " done, checkpoint " in msg:
            done[(k.partition, k.start)] = t
    starts: dict[int, list[int]] = {}
    for p, s in committed:
        starts.setdefault(p, []).append(s)
    for v in starts.values():
        v.sort()
    stages: dict[str, list[float]] = {"egress_committed": [], "to_replay_start": [],
                                      "replay": [], "to_reader": []}
    for s, (p, off, t0) in seqs.items():
        if t0 < warm or s not in arrived or off < 0 or p not in starts:
            continue
        i = bisect.bisect_right(starts[p], off) - 1
        if i < 0:
            continue
        key = (p, starts[p][i])
        if key not in started or key not in done:
            continue
        stages["egress_committed"].append(committed[key] - t0)
        stages["to_replay_start"].append(started[key] - committed[key])
        stages["replay"].append(done[key] - started[key])
        stages["to_reader"].append(arrived[s] - done[key])
    out: dict[str, Any] = {"records": len(stages["replay"]), "segments": len(committed)}
    for name, xs in stages.items():
        xs.sort()
        out[name] = {"mean": sum(xs) / len(xs) if xs else float("nan"),
                     "p50": median(xs), "p99": percentile(xs, 99)}
    return out


# --- report -------------------------------------------------------------------------


def _f(v: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt)


def render_cost(entry: dict[str, Any]) -> list[str]:
    """The cost per GB of source records of each system (median run by total $)."""
    rows: list[tuple[str, ...]] = [("cost per GB", "CPU s", "PUT", "COPY", "LIST", "GET",
                                    "HEAD", "DELETE", "SQS", "stored GB", "x-region GB",
                                    "$ CPU", "$ S3 req", "$ SQS", "$ store/mo", "$ x-region",
                                    "$ total")]
    for s, runs in entry["runs"].items():
        costs = sorted((x["cost"] for x in runs if "cost" in x),
                       key=lambda c: c["usd_per_gb_total"])
        if not costs:
            continue
        c = costs[len(costs) // 2]
        q, usd = c["requests_per_gb"], c["usd_per_gb"]
        rows.append((s, _f(c["cpu_s_per_gb"], ".1f"),
                     *(_f(q.get(op, 0), ",.0f") for op in ("PUT", "COPY", "LIST", "GET",
                                                           "HEAD", "DELETE", "SQS")),
                     _f(c["stored_gb_per_gb"], ".3f"), _f(c["cross_region_gb_per_gb"], ".3f"),
                     *(_f(usd[k], ".4f") for k in ("compute", "s3_requests", "sqs",
                                                   "storage_month", "transfer")),
                     _f(c["usd_per_gb_total"], ".4f")))
    return render_table(rows) if len(rows) > 1 else []


def render(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"kafka-s3-replicator versus MirrorMaker 2 ({meta['profile']}, "
             f"{meta['cpus']} cores shared; load average at start {meta['load_at_start']}, "
             f"at the end {meta['load_now']})",
             f"MM2: dedicated mode, tasks.max={meta['mm2']['tasks.max']}, "
             f"{meta['mm2']['heap']}, producer acks=all compression "
             f"{meta['mm2']['compression']} level {meta['mm2']['compression_level']}; "
             f"ours: {meta['ours']['segments']} segments, max_segment_age 1s, zstd; "
             "medians of rounds; ratios = median of per-round ours/MM2", ""]
    tp = results.get("throughput", {})
    for name, entry in tp.items():
        ds = entry["dataset"]
        kind = "random" if ds.get("values") == "random" else "distinct text-like"
        lines.append(f"{name}: {ds['records']:,} records x {ds['value_size']} B {kind} "
                     f"values (+12 B keys), {ds['raw_bytes'] / MB:.0f} MB raw, "
                     f"{ds['partitions']} partitions")
        goals = GOALS.get(ds["value_size"], {})
        rows: list[tuple[str, ...]] = [("system", "records/s", "MB/s", "CPU s/GB", "CPU us/rec",
                                        "S3-side s/GB", "peak RSS MB", "start-up s",
                                        "complete")]
        if "median" not in entry:   # a run saved before its last round ended
            summarize(entry)
        med = entry["median"]
        for s, r in med.items():
            if not r.get("rounds"):
                rows.append((s, "failed", "", "", "", "", "", "", ""))
                continue
            runs = [x for x in entry["runs"][s] if "failed" not in x]
            rows.append((s, _f(r.get("records_per_s"), ",.0f"), _f(r.get("mb_per_s"), ".1f"),
                         _f(r.get("cpu_s_per_gb"), ".1f"), _f(r.get("cpu_us_per_record"), ".2f"),
                         _f(r.get("s3_side_cpu_s_per_gb"), ".1f"),
                         _f(r.get("peak_rss_mb"), ".0f"), _f(r.get("startup_s"), ".1f"),
                         f"{sum(bool(x['complete']) for x in runs)}/{len(runs)}"))
        for s, ratios in entry.get("ratio", {}).items():
            cells = [f"{s}/mm2"]
            for key, fmt in (("records_per_s", ".2f"), ("mb_per_s", ".2f"),
                             ("cpu_s_per_gb", ".2f"), ("cpu_us_per_record", ".2f")):
                cell = _f(ratios.get(key), fmt)
                if key in goals:
                    better = key in ("records_per_s", "mb_per_s")
                    cell += " " + ratio_verdict(ratios.get(key, float("nan")), goals[key],
                                                better)
                cells.append(cell)
            cells += ["", _f(ratios.get("peak_rss_mb"), ".2f"), "", ""]
            rows.append(tuple(cells))
        lines += ["  " + x for x in render_table(rows)]
        lines += ["  " + x for x in render_cost(entry)]
        for s, ratios in entry.get("ratio", {}).items():
            lines.append(f"  {s}/mm2 with start-up included (launch -> last record): rate "
                         f"{_f(ratios.get('whole_run_records_per_s'), '.2f')}, CPU per GB "
                         f"{_f(ratios.get('whole_run_cpu_s_per_gb'), '.2f')}")
        lines.append("")
    lat = results.get("latency", {}).get("median")
    if lat is None and results.get("latency", {}).get("runs"):
        lat = {v: medians([r for r in rs if "failed" not in r])
               for v, rs in results["latency"]["runs"].items()}
    if lat:
        lines.append(f"latency: {meta.get('latency_rate_mb', 1.0)} MB/s of 1 KiB records, "
                     "4 partitions, exactly-once; CreateTime -> read_committed reader")
        rows = [("variant", "p50 s", "p90 s", "p99 s", "max s", "goal p99", "S3 PUT/GB",
                 "S3 GET/GB", "SQS/GB", "$/GB")]
        runs = results["latency"]["runs"]
        for v, r in lat.items():
            if not r.get("rounds"):
                rows.append((v, "failed", "", "", "", "", "", "", "", ""))
                continue
            goal = LATENCY_GOALS.get(v.removesuffix("+sync")) if v != "mm2" else None
            verdict = "-" if goal is None or v.endswith("+sync") else (
                f"<= {goal} {'met' if r['p99_s'] <= goal else 'MISSED'}")
            costs = [x["request_cost"] for x in runs[v] if "request_cost" in x]
            cost = {k: sorted(c[k] for c in costs)[len(costs) // 2] for k in costs[0]} \
                if costs else {}
            rows.append((v, _f(r["p50_s"], ".2f"), _f(r["p90_s"], ".2f"), _f(r["p99_s"], ".2f"),
                         _f(r["max_s"], ".2f"), verdict,
                         _f(cost.get("put_class_per_gb"), ",.0f"),
                         _f(cost.get("get_class_per_gb"), ",.0f"),
                         _f(cost.get("sqs_per_gb"), ",.0f"), _f(cost.get("usd_per_gb"), ".3f")))
        lines += ["  " + x for x in render_table(rows)]
        for v, rs in runs.items():
            st = [x["stages"] for x in rs if "stages" in x]
            if st:
                s = st[len(st) // 2]
                lines.append(f"  {v} stages (mean s): " + ", ".join(
                    f"{k} {s[k]['mean']:.3f}" for k in ("egress_committed", "to_replay_start",
                                                        "replay", "to_reader")))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, small data (smoke run)")
    ap.add_argument("--only", default="throughput,latency",
                    help="comma-separated: throughput, latency, profile (py-spy flame graphs "
                         "of one exactly-once copy per dataset into --profile-dir)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--sizes", default=None, help="value sizes, e.g. 1024,100")
    ap.add_argument("--partitions", default=None, help="partition counts, e.g. 4,64")
    ap.add_argument("--records", default=None,
                    help="records per size, e.g. 1024:1000000,100:3000000")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--values", default="text,random",
                    help="value kinds of the throughput datasets: text (distinct text-like), "
                         "random (incompressible)")
    ap.add_argument("--prices", type=Path, default=None,
                    help="TOML file of prices replacing bench/cost.py's PRICES (same keys)")
    ap.add_argument("--latency-variants",
                    default="mm2,default,default+sync,low-latency,low-latency+sync",
                    help="+sync: through `replicator sync --follow` between two buckets "
                         "(otherwise egress writes into the destination bucket)")
    ap.add_argument("--keep-work", action="store_true",
                    help="keep the work folder (configs, logs) also when nothing failed")
    ap.add_argument("--latency-seconds", type=float, default=None)
    ap.add_argument("--latency-rate-mb", type=float, default=1.0)
    ap.add_argument("--kafka-home", default=None, help="default: $KAFKA_HOME, else "
                    "../shared/kafka beside the repository")
    ap.add_argument("--mm2-tasks", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--mm2-heap", default="1g")
    ap.add_argument("--mm2-compression", default=None,
                    help="MM2 producer compression (default: ours, format.compression)")
    ap.add_argument("--mm2-compression-level", type=int, default=None,
                    help="default: ours (the codec's default in pyarrow: zstd 1)")
    ap.add_argument("--profile-dir", type=Path, default=HERE / "profiles",
                    help="where --only profile writes raw stacks, SVGs and top-frame tables")
    ap.add_argument("--segment-messages", type=int, default=SEGMENT_MESSAGES,
                    help="our max_segment_messages (a settings experiment)")
    ap.add_argument("--egress-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra egress setting, dotted (e.g. egress.upload_threads=2)")
    ap.add_argument("--ingress-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra ingress setting, dotted (e.g. ingress.batch_size=50000)")
    ap.add_argument("--profile-native", action="store_true", help="py-spy --native")
    ap.add_argument("--profile-deliveries", default="exactly-once",
                    help="deliveries to profile: exactly-once,at-least-once")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="print the table of an earlier run's JSON and exit")
    args = ap.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        print(render(saved["results"], saved["meta"]))
        return 0
    args.mode = "quick" if args.quick else "full"
    profile = dict(PROFILES[args.mode])
    if args.rounds:
        profile["rounds"] = args.rounds
    if args.sizes:
        profile["sizes"] = [int(x) for x in args.sizes.split(",")]
    if args.partitions:
        profile["partitions"] = [int(x) for x in args.partitions.split(",")]
    if args.records:
        profile["records"] = {**profile["records"], **{
            int(k): int(v) for k, v in (x.split(":") for x in args.records.split(","))}}
    if args.latency_seconds:
        profile["latency_seconds"] = args.latency_seconds
    args.systems = args.systems.split(",")
    args.values = args.values.split(",")
    args.latency_variants = args.latency_variants.split(",")
    args.profile_deliveries = args.profile_deliveries.split(",")
    if args.mm2_compression is None or args.mm2_compression_level is None:
        from replicator.core.settings import FormatSettings

        fmt = FormatSettings()
        args.mm2_compression = args.mm2_compression or fmt.compression
        if args.mm2_compression_level is None and args.mm2_compression == fmt.compression:
            import pyarrow as pa

            args.mm2_compression_level = fmt.compression_level or \
                pa.Codec.default_compression_level(fmt.compression)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    args.json = args.json or HERE / "results" / f"{stamp}-peer-{args.mode}.json"
    home = resolve_kafka_home(args.kafka_home)
    work = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    peer = Peer(work, home, args, profile, prices=load_prices(args.prices))
    peer.load_at_start = load_average()
    peer.started = datetime.now(UTC).isoformat()
    log(f"work dir {work}; KAFKA_HOME {home}; load average {peer.load_at_start}")
    t0 = time.perf_counter()
    stages = args.only.split(",")
    try:
        peer.start_clusters()
        if "throughput" in stages:
            peer.throughput()
        if "latency" in stages:
            peer.latency()
        if "profile" in stages:
            peer.profile_runs(args.profile_dir)
    finally:
        peer.stop_all()
    meta = peer.meta()
    meta["latency_rate_mb"] = args.latency_rate_mb
    meta["seconds"] = time.perf_counter() - t0
    meta["prices"] = peer.prices
    peer.save()
    print(render(peer.results, meta))
    if peer.failures:
        print("\nFAILURES:\n  " + "\n  ".join(peer.failures))
    if peer.failures or args.keep_work:
        print(f"work folder kept: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    print(f"\ntotal {meta['seconds']:.0f}s; results: {args.json}")
    return 1 if peer.failures else 0


if __name__ == "__main__":
    sys.exit(main())
