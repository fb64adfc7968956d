"""Compaction throughput against a bare pyarrow read+write of the same segments.

    .venv/bin/python bench/compaction_bench.py [--segments 16] [--records 5000] [--value-size 1024]
                                               [--spark] [--json out.json]

On the embedded moto S3 server, in one run:

* ``bare``: pyarrow's own S3 filesystem reads every input Parquet segment batch by batch and
  writes one output Parquet file (same codec, same row-group size): the raw limit.
* ``inline``: ``Compaction.run_once`` with ``spark_master = "inline"``: planning, the lock,
  our ObjectStore reads/uploads, verification, publish (copy) and deleting the inputs.
* ``spark``: the same on ``local[2]`` Spark; the session start is reported separately and
  excluded from the rate.

Rates are MB/s of raw record bytes (key + value + headers). Each variant gets its own
fresh bucket holding byte-identical copies of the same segments.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from compaction.controller import Compaction
from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.core.keys import SegmentKey
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import Settings, load_settings
from replicator.devstack.aws import create_bucket
from replicator.devstack.processes import start_moto

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

WORDS = [b"sensor", b"temperature", b"humidity", b"pressure", b"reading", b"device",
         b"region", b"value", b"status", b"ok", b"warning", b"error", b"level", b"battery",
         b"signal", b"gateway", b"firmware"]


def text_value(rng: random.Random, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        out += rng.choice(WORDS) + b" " + str(rng.randint(0, 99999)).encode() + b" "
    return bytes(out[:size])


def settings_for(endpoint: str, bucket: str, master: str) -> Settings:
    return load_settings(data={
        "region": "r1",
        "s3": {"bucket": bucket, "endpoint_url": endpoint, "access_key_id": "test",
               "secret_access_key": "test", "region": "us-east-1"},
        "kafka": {"brokers": "127.0.0.1:1"},
        "metrics": {"port": 0},
        "compaction": {"spark_master": master, "parallelism": 2,
                       "spark_conf": {"spark.ui.enabled": "false",
                                      "spark.driver.host": "127.0.0.1"},
                       "topics": {"t": {"min_segment_age": "1s", "min_segment_count": 2,
                                        "min_segment_size": 1, "batch_size": 10000}}},
    }, environ={})


def seed(store: S3ObjectStore, n_segments: int, records: int, value_size: int,
         ) -> tuple[list[SegmentKey], int]:
    rng = random.Random(7)
    fmt = get_format("parquet")
    keys, raw = [], 0
    offset = 0
    for _ in range(n_segments):
        recs = []
        for _ in range(records):
            recs.append(Record(offset, 1_700_000_000_000 + offset, f"k{offset % 100}".encode(),
                               text_value(rng, value_size), (("h", b"v"),)))
            raw += recs[-1].raw_size
            offset += 1
        key = SegmentKey("data", "r1", "t", 0, 0, recs[0].offset, recs[-1].offset)
        up = SegmentUpload(store, fmt, "temp", WriterOptions())
        up.write_batch(records_to_batch(recs))
        temp = up.finish(SegmentMetadata.for_key(key, len(recs)))
        publish_segment(store, temp.key, key)
        keys.append(key)
    return keys, raw


def clone(client: Any, src_bucket: str, keys: list[SegmentKey], name: str) -> str:
    create_bucket(client, name, "us-east-1")
    for k in keys:
        client.copy_object(Bucket=name, Key=k.to_key(),
                           CopySource={"Bucket": src_bucket, "Key": k.to_key()})
    return name


def bare_pyarrow(endpoint: str, bucket: str, keys: list[SegmentKey], batch_size: int) -> float:
    host = endpoint.removeprefix("http://")
    fs = pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                           endpoint_override=host, scheme="http")
    t0 = time.perf_counter()
    schema = None
    writer = None
    with fs.open_output_stream(f"{bucket}/out.parquet") as out:
        for k in keys:
            with fs.open_input_file(f"{bucket}/{k.to_key()}") as f:
                pf = pq.ParquetFile(f)
                schema = schema or pf.schema_arrow
                if writer is None:
                    writer = pq.ParquetWriter(out, schema, compression="zstd")
                buf: list[pa.RecordBatch] = []
                size = 0
                for b in pf.iter_batches(batch_size=batch_size):
                    buf.append(b)
                    size += b.nbytes
                    if size >= 32 * 1024**2:   # the same row-group bound as our writer
                        writer.write_table(pa.Table.from_batches(buf, schema))
                        buf, size = [], 0
                if buf:
                    writer.write_table(pa.Table.from_batches(buf, schema))
        assert writer is not None
        writer.close()
    return time.perf_counter() - t0


def run_compaction(settings: Settings) -> tuple[float, dict[str, Any]]:
    store = S3ObjectStore.from_settings(settings)
    c = Compaction(settings, store=store, serve_metrics=False,
                   clock=lambda: datetime.now(UTC) + timedelta(hours=1))
    c.start()
    t0 = time.perf_counter()
    report = c.run_once()
    elapsed = time.perf_counter() - t0
    c.close()
    assert report.outcome == "success", report
    assert len(report.tasks) == 1 and report.tasks[0].outcome == "merged"
    return elapsed, c.m.summary()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", type=int, default=16)
    ap.add_argument("--records", type=int, default=5000, help="records per segment")
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2, help="runs per variant (best is kept)")
    ap.add_argument("--spark", action="store_true", help="also run on local[2] Spark")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="compaction-bench-"))
    moto = start_moto(workdir)
    try:
        endpoint = f"http://{moto.address}"
        client = make_s3_client(endpoint_url=endpoint, region="us-east-1",
                                access_key_id="test", secret_access_key="test")
        create_bucket(client, "seed", "us-east-1")
        seed_store = S3ObjectStore.from_settings(settings_for(endpoint, "seed", "inline"))
        keys, raw = seed(seed_store, args.segments, args.records, args.value_size)
        stored = sum(seed_store.head(k.to_key()).size for k in keys)
        time.sleep(1.1)   # min_segment_age = 1s
        mb = raw / 1e6
        rows: list[dict[str, Any]] = []

        def record(name: str, seconds: float, **extra: Any) -> None:
            rows.append({"variant": name, "seconds": round(seconds, 3),
                         "mb_per_s": round(mb / seconds, 1), **extra})

        bare = min(bare_pyarrow(endpoint, clone(client, "seed", keys, f"bare{i}"), keys, 10000)
                   for i in range(args.repeat))
        record("bare pyarrow read+write", bare)
        inline = min(run_compaction(settings_for(endpoint, clone(client, "seed", keys,
                                                                 f"inline{i}"), "inline"))[0]
                     for i in range(args.repeat))
        record("compaction inline", inline, ratio_to_bare=round(bare / inline, 2))
        if args.spark:
            from pyspark.sql import SparkSession

            t0 = time.perf_counter()
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            spark = (SparkSession.builder.master("local[2]")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.driver.host", "127.0.0.1").getOrCreate())
            start = time.perf_counter() - t0
            runs = [run_compaction(settings_for(endpoint, clone(client, "seed", keys,
                                                                f"spark{i}"), "local[2]"))[0]
                    for i in range(args.repeat + 1)]   # the first job warms the workers
            record("compaction spark local[2]", min(runs), ratio_to_bare=round(bare / min(runs),
                                                                               2),
                   session_start_s=round(start, 1), first_run_s=round(runs[0], 3))
            spark.stop()
    finally:
        moto.stop()

    print(f"{args.segments} segments x {args.records} records x {args.value_size} B values: "
          f"{mb:.1f} MB raw, {stored / 1e6:.1f} MB stored (zstd)")
    print(f"{'variant':30} {'seconds':>8} {'MB/s':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['variant']:30} {r['seconds']:8.2f} {r['mb_per_s']:8.1f} "
              f"{r.get('ratio_to_bare', 1.0):6.2f}")
    for r in rows:
        if "session_start_s" in r:
            print(f"Spark session start {r['session_start_s']} s (excluded); first run "
                  f"{r['first_run_s']} s")
    if args.json:
        args.json.write_text(json.dumps({"segments": args.segments, "records": args.records,
                                         "value_size": args.value_size, "raw_mb": mb,
                                         "stored_mb": stored / 1e6, "results": rows},
                                        indent=2))


if __name__ == "__main__":
    main()
