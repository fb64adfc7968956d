"""The chaos harness: an embedded stack of its own, the real CLIs as subprocesses, faults.

Layout (all on loopback, started per test module so a frozen broker never stalls another
test's broker; the brokers are Apache Kafka when ``KAFKA_HOME`` is set, else Tansu, as for
the rest of the suite):

```
producer ─► Kafka "source" ─► replicator-egress ─► fault proxy ─► moto: source bucket
                                                                     │ BucketSync (x2)
                               ┌─────────────────────────────────────┴───────────┐
   bucket-eo ─► SQS queue-eo ─► replicator-ingress (exactly-once)  ─► Kafka "destination"
   bucket-alo ─► SQS queue-alo ─► replicator-ingress (at-least-once) ─► (same broker)
```

Each ingress lane has its own destination bucket, queue, topics and consumer group, so both
delivery modes replay the same source topic at the same time under the same faults. S3
traffic of egress and ingress goes through the fault proxy; SQS and the bucket syncs talk
to moto directly (SQS faults are injected by a competing consumer that re-sends,
duplicates and delays messages).

Longer than 400 lines: the stack, the managed processes, the SQS and broker faults and the
verification are one harness that the chaos rounds drive.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from replicator.core import s3, sqs
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, DeliveryReport, Producer, read_to_end
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import KafkaSettings
from replicator.core.wire import parse_checkpoint_key
from replicator.devstack import aws
from replicator.devstack.processes import (
    BrokerKind,
    ServerProcess,
    free_port,
    start_broker,
    start_moto,
    stop_seconds,
)
from replicator.devstack.sample import SampleRecord
from replicator.devstack.toml_writer import write_toml
from replicator.ops.sync import BucketSync
from replicator.ops.verify import digest, read_partition, record_view
from tests.chaos.fault_proxy import FaultProxy
from tests.conftest import APACHE_TEST_PROPERTIES, BROKER_KIND, TANSU_ASSIGNOR

log = logging.getLogger(__name__)

SOURCE_REGION = "us-east-1"
DEST_REGION = "us-west-1"
PREFIX = "data"
PARTITIONS = 3
TOPIC = "chaos.events"
MODES = ("exactly-once", "at-least-once")
BATCH_SIZE = 100  # records per ingress transaction: small, so kills land mid-segment
# A SIGKILLed member holds its partitions until its session expires: keep that short.
GROUP_CONFIG = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 400,
                "topic.metadata.refresh.interval.ms": 1000, **TANSU_ASSIGNOR}
CREDS: dict[str, Any] = {"access_key_id": "test", "secret_access_key": "test"}


# --- processes -------------------------------------------------------------------------


class Managed:
    """One CLI process we start, kill and restart; unexpected exits are recorded."""

    def __init__(self, name: str, exe: str, config: Path, log_path: Path,
                 metrics_port: int) -> None:
        self.name = name
        self.argv = [str(Path(sys.executable).parent / exe), "--config", str(config)]
        self.log_path = log_path
        self.metrics_port = metrics_port
        self.popen: subprocess.Popen[bytes] | None = None
        self.killed_by_us = False
        self.unexpected_exits: list[int] = []
        self.external_terms = 0
        self.kills = 0
        # The round's event loop and kill-point threads both start and kill: one at a time.
        self._lock = threading.RLock()

    def start(self) -> None:
        with self._lock:
            with open(self.log_path, "ab") as out:
                out.write(f"\n===== start {time.strftime('%H:%M:%S')} =====\n".encode())
                self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
            self.killed_by_us = False

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def sigkill(self) -> None:
        with self._lock:
            if self.alive():
                assert self.popen is not None
                self.killed_by_us = True
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
                self.kills += 1

    def ensure_running(self) -> None:
        """Restart when down; an exit we did not cause is recorded (a bug or a fatal)."""
        with self._lock:
            if self.alive():
                return
            if self.popen is not None and not self.killed_by_us:
                code = int(self.popen.returncode)
                if code == 0 and "received SIGTERM" in self.log_tail(20):
                    # A clean drain on a SIGTERM this harness did not send (something else
                    # on the shared machine): correct behaviour, not a crash.
                    self.external_terms += 1
                    log.warning("%s was terminated from outside (SIGTERM, exit 0)", self.name)
                else:
                    self.unexpected_exits.append(code)
                    log.error("%s exited by itself with code %s", self.name, code)
            self.start()

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code."""
        with self._lock:
            if self.popen is None:
                return None
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(10)
            return self.popen.returncode

    def metrics(self) -> str | None:
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def metric_values(text: str, name: str) -> dict[str, float]:
    """``{labels text: value}`` of one metric family in Prometheus text."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def checkpoint_offsets(text: str | None) -> dict[int, int]:
    if text is None:
        return {}
    out = {}
    for labels, v in metric_values(text, "replicator_ingress_checkpoint_offset").items():
        m = re.search(r'partition="(\d+)"', labels)
        if m:
            out[int(m.group(1))] = int(v)
    return out


# --- background helpers ------------------------------------------------------------------


class SyncThread:
    """``BucketSync`` passes in a thread; a failed pass is logged and tried again."""

    def __init__(self, sync: BucketSync, name: str) -> None:
        self.sync = sync
        self.stop_event = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                r = self.sync.run_once()
            except ReplicatorError as e:
                self.errors += 1
                log.warning("bucket sync pass failed (tried again): %s", e)
                self.stop_event.wait(0.5)
                continue
            if not r.changed:
                self.stop_event.wait(0.3)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)


class SqsChaos:
    """A competing consumer on an ingress queue that duplicates, delays and reorders events.

    While ``active``, it takes about half of the messages it can grab and, for each one,
    either re-sends 1-2 copies of the body with random delays (0-4 s) and deletes the
    original, or hides the original for 1-4 s (it comes back later, out of order). It never
    drops an event. The rest it hands back at once (visibility 0).
    """

    def __init__(self, queue: sqs.SqsQueue, name: str) -> None:
        self.queue = queue
        self.active = threading.Event()
        self.stop_event = threading.Event()
        self.rnd = random.Random(0)
        self.duplicated = 0
        self.delayed = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.active.set()
        self.thread.join(30)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            if not self.active.wait(0.5):
                continue
            try:
                self._step()
            except ReplicatorError as e:
                log.warning("SQS chaos step failed: %s", e)
                self.stop_event.wait(0.2)

    def _step(self) -> None:
        msgs = self.queue.receive(max_messages=10, wait_seconds=1, visibility_timeout=30)
        client = self.queue.client
        for m in msgs:
            roll = self.rnd.random()
            if self.stop_event.is_set() or roll < 0.5:
                self.queue.change_visibility(m, 0)
            elif roll < 0.8:
                for _ in range(self.rnd.randint(1, 2)):
                    client.send_message(QueueUrl=self.queue.url, MessageBody=m.body,
                                        DelaySeconds=self.rnd.randint(0, 4))
                    self.duplicated += 1
                self.queue.delete([m])
            else:
                self.queue.change_visibility(m, self.rnd.randint(1, 4))
                self.delayed += 1


class SourceProducer:
    """Produces sample records into the source topic, paced over a few seconds."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.last_offsets: dict[int, int] = {}
        self.produced = 0
        self.errors: list[str] = []

    def produce(self, records: Iterator[SampleRecord], chunks: int, pause: float) -> None:
        recs = list(records)

        def delivered(report: DeliveryReport) -> None:
            if report.error is not None:
                self.errors.append(f"{self.topic}[{report.partition}]: {report.reason}")
                return
            p = report.partition
            self.last_offsets[p] = max(self.last_offsets.get(p, -1), report.offset)

        producer = Producer(self.kafka, overrides={"linger.ms": 5}, on_delivery=delivered)
        size = max(1, -(-len(recs) // chunks))
        for i in range(0, len(recs), size):
            for r in recs[i:i + size]:
                producer.produce(self.topic, r.value, r.key, partition=r.partition,
                                 timestamp=r.timestamp_ms, headers=r.headers)
            producer.poll(0)
            time.sleep(pause)
        left = producer.flush(120)
        if left:
            self.errors.append(f"{left} record(s) not delivered within 120 s")
        self.produced += len(recs)


# --- the stack ----------------------------------------------------------------------


@dataclass
class Lane:
    """One ingress delivery mode with its own bucket, queue and topics."""

    mode: str
    bucket: str
    queue_name: str
    dest_topic: str
    checkpoint_topic: str
    process: Managed
    sync: SyncThread
    sqs_chaos: SqsChaos
    totals: dict[str, int] = field(default_factory=lambda: {"lost": 0, "duplicated": 0,
                                                            "reordered": 0})

    @property
    def short(self) -> str:
        return "eo" if self.mode == "exactly-once" else "alo"


class ChaosStack:
    """Servers, proxy, buckets, queues, topics and the three processes of the chaos suite."""

    def __init__(self, workdir: Path, kind: BrokerKind = BROKER_KIND) -> None:
        self.dir = workdir
        self.kind = kind
        self.servers: dict[str, ServerProcess] = {}
        self.proxy: FaultProxy | None = None
        self.lanes: list[Lane] = []
        self.egress: Managed | None = None
        self.frozen: set[str] = set()
        self.kill_points: Counter[str] = Counter()

    # lifecycle ----------------------------------------------------------------------

    def start(self) -> ChaosStack:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for region in ("source", "destination"):
            self.servers[region] = start_broker(self.kind, f"chaos-{self.kind}-{region}", logs,
                                                extra_properties=APACHE_TEST_PROPERTIES)
        self.servers["moto"] = start_moto(logs, name="chaos-moto")
        moto = self.servers["moto"]
        self.moto_url = f"http://{moto.address}"
        self.proxy = FaultProxy("127.0.0.1", moto.port).start()
        self.source_kafka = KafkaSettings(brokers=self.servers["source"].address,
                                          config=dict(GROUP_CONFIG))
        self.dest_kafka = KafkaSettings(brokers=self.servers["destination"].address,
                                        config=dict(GROUP_CONFIG))
        Admin(self.source_kafka, timeout=20).create_topic(TOPIC, PARTITIONS)
        Admin(self.dest_kafka, timeout=20).list_topics()

        src_client = s3.make_s3_client(endpoint_url=self.moto_url, region=SOURCE_REGION, **CREDS)
        aws.create_bucket(src_client, "chaos-source", SOURCE_REGION)
        self.source_store = S3ObjectStore(src_client, "chaos-source")
        self.egress = self._egress_process(logs)
        for mode in MODES:
            self.lanes.append(self._lane(mode, logs))
        self.egress.start()
        for lane in self.lanes:
            lane.sync.start()
            lane.sqs_chaos.start()
            lane.process.start()
        return self

    def close(self) -> dict[str, int | None]:
        """Stop everything we started; the exit codes of the CLIs on SIGTERM."""
        codes: dict[str, int | None] = {}
        for name in list(self.frozen):
            self.thaw(name)
        for p in self.processes():
            codes[p.name] = p.terminate()
        for lane in self.lanes:
            lane.sqs_chaos.stop()
            lane.sync.stop()
        if self.proxy is not None:
            self.proxy.close()
        for name, server in self.servers.items():
            server.stop(timeout=3 if name == "moto" else stop_seconds(self.kind))
        return codes

    def processes(self) -> list[Managed]:
        assert self.egress is not None
        return [self.egress, *(lane.process for lane in self.lanes)]

    # configs ------------------------------------------------------------------------

    def _s3(self, bucket: str) -> dict[str, Any]:
        assert self.proxy is not None
        return {"bucket": bucket, "prefix": PREFIX, "temp_prefix": "temp",
                "endpoint_url": self.proxy.address, **CREDS}

    def _egress_process(self, logs: Path) -> Managed:
        port = free_port()
        cfg = self.dir / "egress.toml"
        write_toml(cfg, {
            "region": SOURCE_REGION,
            "s3": self._s3("chaos-source"),
            "kafka": {"brokers": self.source_kafka.brokers, "config": GROUP_CONFIG},
            "metrics": {"host": "127.0.0.1", "port": port},
            "egress": {"group_id": "chaos.egress", "shutdown_timeout": "5s",
                       "topic_metadata_interval": "2s", "upload_threads": 2,
                       "topics": {TOPIC: {"max_segment_messages": 400,
                                          "max_segment_size": "256KiB",
                                          "max_segment_age": "1s"}}}})
        return Managed("egress", "replicator-egress", cfg, logs / "egress.log", port)

    def _lane(self, mode: str, logs: Path) -> Lane:
        short = "eo" if mode == "exactly-once" else "alo"
        bucket, queue_name = f"chaos-dest-{short}", f"chaos-queue-{short}"
        client = s3.make_s3_client(endpoint_url=self.moto_url, region=DEST_REGION, **CREDS)
        aws.create_bucket(client, bucket, DEST_REGION)
        sqs_client = sqs.make_sqs_client(endpoint_url=self.moto_url, region=DEST_REGION,
                                         **CREDS)
        aws.create_queue(sqs_client, queue_name, source_bucket=bucket)
        queue = sqs.SqsQueue(sqs_client, queue_name)
        aws.set_bucket_notifications(client, bucket, queue.arn, prefix=f"{PREFIX}/")
        port = free_port()
        cfg = self.dir / f"ingress-{short}.toml"
        dest_topic = f"{TOPIC}.copy-{short}"
        checkpoint_topic = f"chaos.checkpoint.{short}"
        write_toml(cfg, {
            "region": DEST_REGION,
            "s3": self._s3(bucket),
            "kafka": {"brokers": self.dest_kafka.brokers, "config": GROUP_CONFIG},
            "metrics": {"host": "127.0.0.1", "port": port},
            "ingress": {"group_id": f"chaos.ingress.{short}", "sqs_queue": queue_name,
                        "sqs_endpoint_url": self.moto_url,
                        "segment_events_topic": f"chaos.segmentevents.{short}",
                        "checkpoint_topic": checkpoint_topic, "delivery": mode,
                        "batch_size": BATCH_SIZE, "sqs_wait_time": "1s",
                        "topic_check_interval": "2s", "rescan_interval": "60s",
                        "revoke_timeout": "5s",
                        "sources": [{"region": SOURCE_REGION, "topic": TOPIC,
                                  "destination_topic": dest_topic,
                                  # Never declare anything lost during a round: a loss must
                                  # show up as a missing record, not as a skipped range.
                                  "lost_segment_timeout": "10m", "late_segment_retries": 10,
                                  # With no checkpoint yet, replay starts at the earliest
                                  # segment known after this delay (the original's
                                  # semantics: earlier positions may be gone at the source).
                                  # It must outlast the first segment's way here: injected
                                  # S3 outages (up to 4 s), client retries and the sync.
                                  # With 2 s, seed 7 started partitions at their second
                                  # segment. See RELIABILITY.md, "first start".
                                  "first_segment_delay": "15s"}]}})
        dst_store = S3ObjectStore(client, bucket)
        sync = SyncThread(BucketSync(self.source_store, dst_store, PREFIX), f"sync-{short}")
        chaos = SqsChaos(sqs.SqsQueue(sqs.make_sqs_client(
            endpoint_url=self.moto_url, region=DEST_REGION, **CREDS), queue_name),
            f"sqs-chaos-{short}")
        proc = Managed(f"ingress-{short}", "replicator-ingress", cfg,
                       logs / f"ingress-{short}.log", port)
        return Lane(mode, bucket, queue_name, dest_topic, checkpoint_topic, proc, sync, chaos)

    # faults -------------------------------------------------------------------------

    def freeze(self, broker: str) -> None:
        os.kill(self.servers[broker].pid, signal.SIGSTOP)
        self.frozen.add(broker)

    def thaw(self, broker: str) -> None:
        os.kill(self.servers[broker].pid, signal.SIGCONT)
        self.frozen.discard(broker)

    def process(self, name: str) -> Managed:
        for p in self.processes():
            if p.name == name:
                return p
        raise KeyError(name)


# --- verification ---------------------------------------------------------------------


def partition_digests(kafka: KafkaSettings, topic: str, partition: int,
                      isolation: Literal["read_committed", "read_uncommitted"]
                      = "read_committed") -> list[bytes]:
    """Record digests of one partition up to its end (``isolation`` as the consumer's)."""
    return [digest(record_view(m))
            for m in read_to_end(kafka, topic, partitions=[partition], isolation=isolation,
                                 idle_timeout=30, poll_timeout=0.2)]


def missing_ranges(source: list[bytes], destination: list[bytes]) -> list[tuple[int, int]]:
    """Source offsets without a copy, as (first, last) runs."""
    have = set(destination)
    runs: list[tuple[int, int]] = []
    for i, d in enumerate(source):
        if d in have:
            continue
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def checkpoint_history(kafka: KafkaSettings, topic: str) -> dict[int, list[int]]:
    """Source partition -> checkpoint offsets in topic order (aborted ones too, on Tansu)."""
    out: dict[int, list[int]] = {}
    n = Admin(kafka).partition_count(topic) or 0
    for p in range(n):
        for m in read_partition(kafka, topic, p, idle_timeout=30):
            key, value = m.key(), m.value()
            if key is None or value is None:
                continue
            try:
                off = int(json.loads(value)["offset"])
            except (ValueError, KeyError, TypeError):
                continue
            parsed = parse_checkpoint_key(key.decode())
            if parsed is None:
                continue
            out.setdefault(parsed[2], []).append(off)
    return out


@dataclass
class DuplicateRuns:
    """Second copies of source records in a destination partition, as runs of offsets."""

    runs: list[tuple[int, int]] = field(default_factory=list)  # (first, last) source offsets

    @property
    def records(self) -> int:
        return sum(b - a + 1 for a, b in self.runs)


def duplicate_runs(source: list[bytes], destination: list[bytes]) -> DuplicateRuns:
    """Runs of consecutive source offsets whose copies appear more than once.

    Source records are distinct (random trace ids), so a record's index in the source
    partition is its source offset (the producer is not transactional: no gaps).
    """
    index = {d: i for i, d in enumerate(source)}
    seen: set[int] = set()
    dups: list[int] = []
    for d in destination:
        i = index.get(d)
        if i is None:
            continue
        if i in seen:
            dups.append(i)
        seen.add(i)
    runs: list[tuple[int, int]] = []
    for i in dups:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return DuplicateRuns(runs)


def split_duplicates(runs: DuplicateRuns, checkpoints: list[int], batch_size: int
                     ) -> tuple[int, int]:
    """(transaction-shaped, other) duplicate records of an exactly-once partition.

    A re-produced aborted transaction (visible on Tansu, hidden by read_committed on Kafka)
    starts right after a checkpoint (or at the partition start) and is at most one batch
    long, because each transaction carries one batch and its checkpoint. Anything else is
    a real duplicate.
    """
    boundaries = {-1, *checkpoints}
    txn = other = 0
    for a, b in runs.runs:
        n = b - a + 1
        if a - 1 in boundaries and n <= batch_size:
            txn += n
        else:
            other += n
    return txn, other
