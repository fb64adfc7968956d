"""Egress throughput against a bare confluent-kafka consume loop.

    .venv/bin/python bench/egress_throughput.py [--records 100000] [--partitions 4]
                                                [--value-size 1024] [--json out.json]

On the embedded stack (Tansu + moto), in one run over the same topic:

* ``bare``: ``consume(num_messages=2000)`` in a loop touching each message's error, key
  and value, from offset 0 to the end (no group join in the timing).
* ``egress (memory store)``: ``Egress`` writing Parquet/zstd segments into the in-memory
  store: the egress's own cost (consume, columns, encode, commit).
* ``egress (moto S3)``: the same into moto's S3 (moto runs on the same 2 cores).

Timing starts at the first consumed message and ends when every segment is durable and
committed. Rates are of raw record bytes (key + value); CPU is this process's CPU time
(all threads) per GB of raw bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import Settings, load_settings
from replicator.core.storage import MemoryObjectStore, ObjectStore
from replicator.devstack.aws import create_bucket
from replicator.devstack.processes import start_moto, start_tansu

sys.path.insert(0, str(Path(__file__).parent))
from lib import text_value  # also sets the AWS test environment

FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def settings_for(brokers: str, endpoint: str, bucket: str, topic: str,
                 fmt: str = "parquet", upload_threads: int = 4) -> Settings:
    return load_settings(data={
        "region": "us-east-1",
        "format": {"name": fmt},
        "s3": {"bucket": bucket, "endpoint_url": endpoint},
        "kafka": {"brokers": brokers, "config": FAST_GROUP},
        "metrics": {"port": 0},
        "egress": {"group_id": f"bench-{random.getrandbits(32):x}",
                   "upload_threads": upload_threads,
                   "topics": {topic: {"max_segment_size": "64MiB",
                                      "max_segment_messages": 10_000_000,
                                      "max_segment_age": "1h"}}},
    }, environ={})


def produce(brokers: str, topic: str, partitions: int, records: int, value_size: int,
            settings: Settings) -> int:
    rng = random.Random(1)
    values = [text_value(rng, value_size) for _ in range(997)]
    p = Producer(settings.kafka, overrides={"linger.ms": 20})
    raw = 0
    for i in range(records):
        key = b"device-%d" % (i % 5000)
        v = values[i % len(values)]
        raw += len(key) + len(v)
        p.produce(topic, value=v, key=key, partition=i % partitions)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    return raw


def bare(brokers: str, topic: str, partitions: int, records: int) -> dict[str, float]:
    c = ck.Consumer({"bootstrap.servers": brokers, "group.id": "bare-bench",
                     "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    n = raw = 0
    t0 = cpu0 = 0.0
    while n < records:
        msgs = c.consume(num_messages=2000, timeout=1.0)
        if msgs and not t0:
            t0, cpu0 = time.perf_counter(), time.process_time()
        for m in msgs:
            if m.error() is not None:
                continue
            k, v = m.key(), m.value()
            raw += len(k or b"") + len(v or b"")
            n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    c.close()
    return {"seconds": wall, "cpu_seconds": cpu, "raw_bytes": raw, "records": n}


def run_egress(settings: Settings, store: ObjectStore, topic: str, partitions: int,
               records: int, raw: int) -> dict[str, float]:
    eg = Egress(settings, store=store)
    eg.start()
    t = threading.Thread(target=eg.run, daemon=True)
    t.start()
    # Watch the writers' positions (cheap) rather than collecting the metric registry.
    def consumed() -> int:
        return sum(w.next_offset or 0 for w in list(eg._writers.values()))

    while not consumed():
        time.sleep(0.002)
    t0, cpu0 = time.perf_counter(), time.process_time()
    while consumed() < records:
        time.sleep(0.02)
    consume_seconds = time.perf_counter() - t0
    eg.stop()   # closes the open segments (reason shutdown) and commits them
    t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    eg.close()
    stored = eg.metrics.total("egress_segment_bytes_total")
    segments = eg.metrics.total("egress_segments_total")
    return {"seconds": wall, "consume_seconds": consume_seconds, "cpu_seconds": cpu,
            "raw_bytes": raw, "records": records, "stored_bytes": stored,
            "segments": segments}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--skip-s3", action="store_true", help="memory store only")
    ap.add_argument("--format", default="parquet", help="segment format (parquet, arrow)")
    ap.add_argument("--upload-threads", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    tansu = start_tansu("tansu-bench", work)
    moto = start_moto(work)
    try:
        brokers, endpoint = tansu.address, f"http://{moto.address}"
        topic = f"bench-{random.getrandbits(32):x}"
        base = settings_for(brokers, endpoint, "unused", topic)
        Admin(base.kafka).create_topic(topic, args.partitions)
        raw = produce(brokers, topic, args.partitions, args.records, args.value_size, base)
        results: dict[str, dict[str, float]] = {}
        results["bare consume loop"] = bare(brokers, topic, args.partitions, args.records)
        results["egress (memory store)"] = run_egress(
            settings_for(brokers, endpoint, "memory", topic, args.format,
                         args.upload_threads), MemoryObjectStore(),
            topic,
            args.partitions, args.records, raw)
        if not args.skip_s3:
            bucket = f"bench-{random.getrandbits(32):x}"
            s = settings_for(brokers, endpoint, bucket, topic, args.format,
                             args.upload_threads)
            store = S3ObjectStore.from_settings(s)
            create_bucket(store.client, bucket, "us-east-1")
            results["egress (moto S3)"] = run_egress(s, store, topic, args.partitions,
                                                     args.records, raw)
    finally:
        tansu.stop()
        moto.stop()
    base_rate = results["bare consume loop"]["raw_bytes"] / results["bare consume loop"][
        "seconds"]
    print(f"\n{args.records} records x {args.value_size} B text-like values, "
          f"{args.partitions} partitions, format {args.format}, Tansu + moto on this machine "
          f"({os.cpu_count()} cores)")
    print(f"{'variant':<24}{'records/s':>12}{'MB/s raw':>10}{'ratio':>8}{'CPU s/GB':>10}")
    table: dict[str, Any] = {}
    for name, r in results.items():
        rate = r["raw_bytes"] / r["seconds"]
        cpu_per_gb = r["cpu_seconds"] / (r["raw_bytes"] / 1e9)
        row = {"records_per_s": r["records"] / r["seconds"], "mb_per_s": rate / 1e6,
               "ratio": rate / base_rate, "cpu_s_per_gb": cpu_per_gb, **r}
        table[name] = row
        print(f"{name:<24}{row['records_per_s']:>12,.0f}{row['mb_per_s']:>10.1f}"
              f"{row['ratio']:>8.2f}{cpu_per_gb:>10.1f}")
    for name, r in results.items():
        if r.get("stored_bytes"):
            print(f"{name}: {r['segments']:.0f} segments, compression "
                  f"{r['raw_bytes'] / r['stored_bytes']:.1f}x, consumed in "
                  f"{r['consume_seconds']:.2f}s of {r['seconds']:.2f}s")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
