"""Ingress with many partitions: threads, RSS, start-up and throughput of one process.

One ingress process (a child, so RSS and threads are its own) replays the same records
spread over N partitions from an in-memory bucket into a real broker (Apache Kafka from
``$KAFKA_HOME``, started here, or ``--brokers``), exactly-once or at-least-once, with the
process's one shared producer (the default) or a producer per partition (``KafkaSink``, the
model before; ``--per-partition``). Optionally the checkpoint topic is filled with
``--checkpoint-records`` records of other keys first (what a long-running deployment's
start reads).

Reported per run: records/s and MB/s over the replay, seconds from ``start()`` until every
partition replays (start-up: its checkpoint loaded and its segments listed, replaying or
waiting for a replay slot) and until every partition produced (with one segment per
partition and ``max_parallel_replays`` slots that is most of the replay), peak RSS, peak OS
threads (librdkafka's included) and Python threads. Usage::

    python bench/ingress_partitions.py --partitions 4 256 --records 200000
    python bench/ingress_partitions.py --partitions 256 --per-partition   # the old model
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

VALUE = 100
SEGMENT = 10_000


def proc_status() -> tuple[int, int]:
    """(RSS bytes, OS threads) of this process."""
    rss = threads = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


class NoQueue:
    """The SQS seam with nothing in it (segments are found by listing)."""

    def receive(self, max_messages: int = 10, wait_seconds: int = 20) -> list[Any]:
        time.sleep(min(wait_seconds, 1))
        return []

    def delete(self, messages: Sequence[Any]) -> list[str]:
        return []


def fill_bucket(partitions: int, records: int, topic: str) -> Any:
    import pyarrow as pa

    from formats.base import SEGMENT_SCHEMA, SegmentMetadata, WriterOptions
    from formats.registry import get_format
    from formats.segment_io import SegmentUpload, publish_segment
    from replicator.core.keys import SegmentKey, topic_meta_key
    from replicator.core.storage import MemoryObjectStore

    store = MemoryObjectStore("bench")
    fmt = get_format("parquet")
    now = int(time.time() * 1000)
    value = b"v" * VALUE
    header_type = SEGMENT_SCHEMA.field("headers").type
    per = records // partitions
    for p in range(partitions):
        for start in range(0, per, SEGMENT):
            n = min(SEGMENT, per - start)
            batch = pa.RecordBatch.from_arrays([
                pa.array(range(start, start + n), pa.int64()),
                pa.array([now] * n, pa.timestamp("ms", tz="UTC")),
                pa.array([0] * n, pa.int8()),
                pa.array([b"k%07d" % i for i in range(start, start + n)], pa.binary()),
                pa.array([value] * n, pa.binary()),
                pa.array([[]] * n, header_type),
            ], schema=SEGMENT_SCHEMA)
            up = SegmentUpload(store, fmt, "temp", WriterOptions())
            up.write_batch(batch)
            key = SegmentKey("data", "us-east-1", topic, p, 0, start, start + n - 1)
            temp = up.finish(SegmentMetadata.for_key(key, n))
            publish_segment(store, temp.key, key)
    store.put(topic_meta_key("data", "us-east-1", topic),
              json.dumps({"partitions": partitions, "configs": {}}).encode())
    return store


def fill_checkpoints(brokers: str, topic: str, n: int) -> None:
    from datetime import UTC, datetime

    from replicator.core.compacted_topic import CHECKPOINT_TOPIC_CONFIG
    from replicator.core.kafka import Admin, Producer
    from replicator.core.settings import KafkaSettings
    from replicator.core.wire import Checkpoint

    kafka = KafkaSettings(brokers=brokers)
    Admin(kafka).create_topic(topic, 1, dict(CHECKPOINT_TOPIC_CONFIG))
    p = Producer(kafka, overrides={"linger.ms": 50})
    value = Checkpoint(123, "data/x/y/0/0/0-1", datetime.now(UTC)).encode()
    for i in range(n):
        p.produce(topic, value, b"other:t:%d:dest" % (i % 5000))
    assert p.flush(300) == 0


def warm_destination(brokers: str, topic: str, n: int) -> None:
    """Create the destination topic and write one record to each partition (not part of
    the replayed records): a deployment's destination partitions exist and have been
    written before, a fresh topic's first write to each partition costs the broker more.
    """
    from replicator.core.kafka import Admin, Producer
    from replicator.core.settings import KafkaSettings

    kafka = KafkaSettings(brokers=brokers)
    Admin(kafka).create_topic(topic, n, {})
    p = Producer(kafka, overrides={"linger.ms": 50})
    for i in range(n):
        p.produce(topic, b"warm", None, partition=i)
    assert p.flush(300) == 0


def child(a: argparse.Namespace) -> None:
    a.partitions = a.partitions[0]
    if a.log:
        import logging

        logging.basicConfig(filename=a.log, level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ingress.controller import Ingress
    from ingress.sink import KafkaSink, ReplaySink
    from replicator.core.settings import IngressSourceSettings, load_settings

    topic = f"bench-{uuid.uuid4().hex[:6]}"
    store = fill_bucket(a.partitions, a.records, topic)
    cps = f"{topic}.checkpoints"
    if a.checkpoint_records:
        fill_checkpoints(a.brokers, cps, a.checkpoint_records)
    if a.warm_destination:
        warm_destination(a.brokers, topic + ".copy", a.partitions)
    settings = load_settings(data={
        "region": "us-west-1",
        "s3": {"bucket": "bench"},
        "kafka": {"brokers": a.brokers, "config": {
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            **dict(kv.split("=", 1) for kv in a.kafka_config)}},
        "ingress": {"group_id": f"{topic}-group", "sqs_queue": "none",
                    "segment_events_topic": f"{topic}.events", "checkpoint_topic": cps,
                    "delivery": a.delivery, "topic_check_interval": "1s",
                    "instance_id": "bench", "producers": a.producers,
                    "max_parallel_replays": a.max_parallel_replays,
                    **({"max_bytes_in_flight": a.max_bytes_in_flight}
                       if a.max_bytes_in_flight else {}),
                    **dict(kv.split("=", 1) for kv in a.ingress_set),
                    "sources": [{"region": "us-east-1", "topic": topic,
                                 "destination_topic": topic + ".copy",
                                 "start": "earliest-available",
                                 "first_segment_delay": "0s"}]},
    }, environ={})
    ingress_cfg = settings.require("ingress")
    make_sink = None
    if a.per_partition:
        def make_sink(src: IngressSourceSettings, dest: str, partition: int) -> ReplaySink:
            tid = None if a.delivery != "exactly-once" else \
                f"{ingress_cfg.group_id}.{dest}.{partition}"
            return KafkaSink(settings.kafka, topic=dest, partition=partition,
                             checkpoint_topic=cps, transactional_id=tid)
    ing = Ingress(settings, store=store, queue=NoQueue(), make_sink=make_sink)
    peak = {"rss": 0, "threads": 0, "py": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss, threads = proc_status()
            peak["rss"] = max(peak["rss"], rss)
            peak["threads"] = max(peak["threads"], threads)
            peak["py"] = max(peak["py"], threading.active_count())
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    ing.start()
    runner = threading.Thread(target=ing.run, daemon=True)
    runner.start()
    per = a.records // a.partitions

    def positions() -> dict[int, int | None]:
        return {wid[2]: v for wid, v in ing.positions().items() if wid[1] == topic}

    started_all = None
    replaying_all = None
    first = None
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        pos = positions()
        moving = sum(1 for v in pos.values() if v is not None)
        if first is None and moving:
            first = time.perf_counter()
        if started_all is None and moving >= a.partitions:
            started_all = time.perf_counter()
        if replaying_all is None and sum(1 for w in list(ing.workers.values())
                                         if w.replaying) >= a.partitions:
            replaying_all = time.perf_counter()
        if len(pos) == a.partitions and all((v or -1) >= per - 1 for v in pos.values()):
            break
        time.sleep(0.02)
    else:
        raise SystemExit(f"timed out: {positions()}")
    t1 = time.perf_counter()
    cpu1 = time.process_time()
    transactions = ing.metrics.total("ingress_transactions_total", outcome="committed")
    stop.set()
    ing.stop()
    runner.join(60)
    ing.close()
    records = per * a.partitions
    assert first is not None and started_all is not None and replaying_all is not None
    print(json.dumps({
        "partitions": a.partitions, "records": records, "delivery": a.delivery,
        "producer": "per-partition" if a.per_partition else f"shared x{a.producers}",
        "max_parallel_replays": a.max_parallel_replays,
        "checkpoint_records": a.checkpoint_records,
        "startup_s": round(replaying_all - t0, 2),
        "all_produced_s": round(started_all - t0, 2),
        "replay_s": round(t1 - first, 2),
        "records_per_s": round(records / (t1 - first)),
        "MB_per_s": round(records * (VALUE + 8) / (t1 - first) / 1e6, 1),
        "peak_rss_MiB": round(peak["rss"] / 2**20),
        "peak_os_threads": peak["threads"], "peak_python_threads": peak["py"],
        "peak_bytes_in_flight_MiB": round(ing.budget.peak / 2**20, 1),
        "warm_destination": a.warm_destination,
        # From start() (start-up included): the process's CPU, all threads.
        "cpu_s": round(cpu1 - cpu0, 2),
        "cpu_us_per_record": round((cpu1 - cpu0) / records * 1e6, 1),
        "transactions": transactions,
        "ingress_set": a.ingress_set,
    }))


def start_broker(workdir: Path) -> tuple[str, int]:
    home = os.environ.get("KAFKA_HOME", "/work/shared/kafka")
    out = subprocess.run([f"{home}/start-kraft.sh", str(workdir)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    return fields["BOOTSTRAP"], int(fields["PID"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[4, 256])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--delivery", default="exactly-once",
                    choices=["exactly-once", "at-least-once"])
    ap.add_argument("--per-partition", action="store_true")
    ap.add_argument("--both", action="store_true", help="shared and per-partition")
    ap.add_argument("--checkpoint-records", type=int, default=0)
    ap.add_argument("--brokers")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--producers", type=int, default=1, help="ingress.producers")
    ap.add_argument("--max-parallel-replays", type=int, default=8,
                    help="ingress.max_parallel_replays")
    ap.add_argument("--max-bytes-in-flight", type=int, default=0,
                    help="ingress.max_bytes_in_flight (0: the default)")
    ap.add_argument("--warm-destination", action="store_true",
                    help="create the destination topic and write a record to each of its "
                         "partitions before the replay")
    ap.add_argument("--log", help="the child's log (INFO) goes to this file")
    ap.add_argument("--kafka-config", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more kafka.config settings")
    ap.add_argument("--ingress-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more [ingress] settings (e.g. transaction_linger=20ms)")
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    pid = None
    workdir = Path("/nonexistent")
    brokers = a.brokers
    if brokers is None:
        workdir = Path(f"/tmp/bench-kafka-{uuid.uuid4().hex[:6]}")
        workdir.mkdir()
        brokers, pid = start_broker(workdir)
    try:
        with open("/proc/loadavg") as f:
            print(f"load average: {f.read().split()[:3]}", flush=True)
        modes = [False, True] if a.both else [a.per_partition]
        for n in a.partitions:
            for per_partition in modes:
                args = [sys.executable, __file__, "--child", "--brokers", brokers,
                        "--partitions", str(n), "--records", str(a.records),
                        "--delivery", a.delivery, "--timeout", str(a.timeout),
                        "--checkpoint-records", str(a.checkpoint_records),
                        "--producers", str(a.producers),
                        "--max-parallel-replays", str(a.max_parallel_replays)]
                if per_partition:
                    args.append("--per-partition")
                if a.warm_destination:
                    args.append("--warm-destination")
                if a.max_bytes_in_flight:
                    args += ["--max-bytes-in-flight", str(a.max_bytes_in_flight)]
                if a.log:
                    args += ["--log", a.log]
                if a.kafka_config:
                    args += ["--kafka-config", *a.kafka_config]
                if a.ingress_set:
                    args += ["--ingress-set", *a.ingress_set]
                out = subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True)
                print(out.stdout.strip().splitlines()[-1], flush=True)
    finally:
        if pid is not None:
            os.kill(pid, 15)
            for _ in range(100):       # the broker exits within a few seconds
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
