"""End-to-end lag under a steady load.

``replicator-egress`` and ``replicator-ingress`` run as their own processes (the real CLIs)
on the embedded stack. Egress writes straight into the destination bucket: the S3
cross-region replication hop (AWS S3 Replication, or ``replicator sync`` elsewhere) is
outside what we measure, and on AWS adds its own delay (seconds; the RTC SLA is 15 min).

This process produces at a steady rate (default 10 MB/s of 1 KiB records), stamping each
record's CreateTime with the wall clock at ``produce()``, and a read_committed consumer on
the destination topic records ``receive time - record timestamp`` for every record: the
source timestamp is preserved by the replication, and a record becomes readable in the
destination when ingress commits its transaction (its append), plus at most the
consumer's fetch wait (``fetch.wait.max.ms = 10``). All on one machine, one clock.
Records produced in the first ``warmup`` seconds are left out of the percentiles (group
joins, first segment); the maximum over all records is reported too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from lib import (
    MB,
    BenchStack,
    percentile,
    produce_paced,
    stop_all,
    text_value,
    wait_until,
    write_toml,
)
from measure_egress import _metrics


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def e2e_lag(stack: BenchStack, workdir: Path, *, rate_mb: float = 10.0, seconds: float = 30.0,
            warmup: float = 5.0, partitions: int = 4, value_size: int = 1024,
            segment_age: str = "1s", delivery: str = "exactly-once") -> dict[str, Any]:
    import random

    from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition
    from replicator.core.settings import KafkaSettings
    from replicator.devstack.configs import DEST_BUCKET
    from replicator.devstack.processes import free_port

    run = uuid.uuid4().hex[:6]
    topic, dest = f"bench.lag.{run}", f"bench.lag.{run}.copy"
    src_kafka = KafkaSettings(brokers=stack.source_kafka)
    dst_kafka = KafkaSettings(brokers=stack.dest_kafka)
    Admin(src_kafka).create_topic(topic, partitions)
    eg_port, in_port = free_port(), free_port()
    eg = stack.raw_config("egress")
    eg["metrics"]["port"] = eg_port
    eg["log"]["level"] = "WARNING"
    eg["s3"]["bucket"] = DEST_BUCKET
    eg["egress"]["group_id"] = f"bench-lag-{run}"
    eg["egress"]["topics"] = {topic: {"max_segment_messages": 10_000_000,
                                      "max_segment_size": "64MiB",
                                      "max_segment_age": segment_age}}
    ing = stack.ingress_raw(topic, dest, group=f"bench-lag-in-{run}", delivery=delivery,
                            suffix=run, metrics_port=in_port)
    procs: list[subprocess.Popen[bytes]] = []
    bindir = Path(sys.executable).parent
    lat: list[tuple[float, float]] = []   # (produce time, lag seconds)
    stop = threading.Event()
    try:
        for role, cfg in (("egress", eg), ("ingress", ing)):
            path = write_toml(workdir / f"lag-{role}-{run}.toml", cfg)
            log = open(workdir / f"lag-{role}-{run}.log", "wb")  # noqa: SIM115
            procs.append(subprocess.Popen([str(bindir / f"replicator-{role}"), "--config",
                                           str(path)], stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, env=dict(os.environ)))
        wait_until(lambda: _metrics(eg_port).get("replicator_egress_assigned_partitions", 0)
                   == partitions, 90, "egress assignment", 0.2)
        wait_until(lambda: _ready(in_port), 90, "ingress ready", 0.2)
        wait_until(lambda: Admin(dst_kafka).partition_count(dest) == partitions, 60,
                   "destination topic", 0.2)

        consumer = Consumer(dst_kafka, f"lag-reader-{run}",
                            {"fetch.wait.max.ms": 10, "fetch.min.bytes": 1})
        consumer.assign([TopicPartition(dest, p, 0) for p in range(partitions)])
        received = [0]

        def read() -> None:
            while not stop.is_set():
                for m in (m for run in consumer.fetch(1000, 0.1).runs.values() for m in run):
                    now = time.time()
                    ts = m.timestamp()[1] / 1000.0
                    lat.append((ts, now - ts))
                    received[0] += 1

        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        rng = random.Random(3)
        values = [text_value(rng, value_size) for _ in range(997)]
        producer = Producer(src_kafka, overrides={"linger.ms": 5})
        per_record = value_size + 12
        n, t_start, produce_s = produce_paced(
            producer, topic, values, partitions, rate_mb * MB, seconds,
            record_bytes=per_record, key=lambda i: b"device-%05d" % (i % 5000),
            timestamps=True)
        wait_until(lambda: received[0] >= n, 120, "every record in the destination", 0.1)
    finally:
        stop.set()
        stop_all(procs)
    steady = sorted(lag for ts, lag in lat if ts >= t_start + warmup)
    every = sorted(lag for _, lag in lat)
    return {"rate_mb_per_s_target": rate_mb, "rate_mb_per_s": n * per_record / MB / produce_s,
            "records": n, "seconds": seconds, "warmup_s": warmup, "segment_age": segment_age,
            "delivery": delivery, "partitions": partitions,
            "p50_s": percentile(steady, 50), "p90_s": percentile(steady, 90),
            "p99_s": percentile(steady, 99), "max_s": steady[-1] if steady else float("nan"),
            "max_incl_warmup_s": every[-1] if every else float("nan"),
            "received": len(lat)}
