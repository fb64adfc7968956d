"""Ingress measurements.

Used by ``run_all.py``; ``--child-memory`` is the child process of the RSS measurement.

* ``bare_produce``: the records of the same segments, decoded into Python lists before the
  timing starts, produced by one producer built by ``Producer`` with the sink's
  overrides: idempotent in at-least-once mode (produce everything, ``flush``);
  transactional in exactly-once mode (one transaction per ``ingress.batch_size`` records).
* ``ingress_inproc``: ``Ingress`` in this process replaying the segments of the destination
  bucket into a fresh destination topic; timing from the first produced record until every
  partition's checkpoint reached its last offset (checkpoints are written after the
  records are committed/flushed, so everything is durable at the end).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lib import BenchStack, CpuTimeline, S3Counter, cpu_of, wait_until
from measure_egress import rates

BATCH = 10_000  # ingress.batch_size default: records per transaction / produced batch


def read_segments(store: Any, region: str, topic: str, partitions: int
                  ) -> dict[int, tuple[list[int], list[bytes | None], list[bytes | None]]]:
    """Partition -> (timestamps ms, keys, values) of every level-0 segment, in order."""
    from formats.segment_io import open_segment
    from replicator.core.keys import PartitionRef, SegmentKey

    out: dict[int, tuple[list[int], list[bytes | None], list[bytes | None]]] = {}
    for p in range(partitions):
        ts: list[int] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        ref = PartitionRef("data", region, topic, p)
        segs = sorted(k for k in (SegmentKey.try_parse(i.key)
                                  for i in store.list(ref.segments_prefix(0))) if k)
        for seg in segs:
            with open_segment(store, seg) as reader:
                for b in reader.iter_batches(BATCH):
                    ts += b.column("timestamp").cast("int64").to_pylist()
                    keys += b.column("key").to_pylist()
                    values += b.column("value").to_pylist()
        out[p] = (ts, keys, values)
    return out


def drop_topics(brokers: str, topics: list[str]) -> None:
    """Delete what a run wrote: Tansu keeps every record in memory (Apache Kafka on disk),
    and a bench that writes gigabytes would otherwise slow down (and grow) run after run."""
    from replicator.core.kafka import Admin
    from replicator.core.settings import KafkaSettings

    Admin(KafkaSettings(brokers=brokers)).delete_topics(topics)


def bare_produce(brokers: str, topic: str, data: dict[int, tuple[list[int], list[Any],
                                                                 list[Any]]],
                 delivery: str) -> dict[str, Any]:
    from replicator.core.kafka import Admin, Producer
    from replicator.core.settings import KafkaSettings

    kafka = KafkaSettings(brokers=brokers)
    Admin(kafka).create_topic(topic, len(data))
    eos = delivery == "exactly-once"
    # Per record, Producer.produce_many is the client's own produce call and nothing else
    # (the bare loop a user would write, full local queue included).
    p = Producer(kafka, transactional_id=f"bare-{uuid.uuid4().hex[:6]}" if eos else None)
    if eos:
        p.init_transactions(30)
    records = sum(len(v[0]) for v in data.values())
    raw = sum(len(k or b"") + len(v or b"") for d in data.values()
              for k, v in zip(d[1], d[2], strict=True))
    # Warm up: metadata of the new topic and a first delivery to every partition.
    if eos:
        p.begin_transaction()
    for part in data:
        p.produce(topic, b"warm-up", None, partition=part)
    if eos:
        p.commit_transaction(30)
    p.flush(30)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for part, (ts, keys, values) in data.items():
        for start in range(0, len(ts), BATCH):
            if eos:
                p.begin_transaction()
            end = start + BATCH
            p.produce_many(topic, part, ts[start:end], keys[start:end], values[start:end],
                           [None] * len(ts[start:end]), ts[start:end])
            if eos:
                p.commit_transaction(30)
    if not eos:
        left = p.flush(120)
        assert left == 0, f"{left} records not delivered"
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    failed = p.take_failures()
    assert not failed, failed[:3]
    drop_topics(brokers, [topic])
    return rates({"seconds": wall, "cpu_seconds": cpu, "raw_bytes": raw, "records": records})


def bare_read_produce(endpoint: str, bucket: str, region: str, topic_src: str,
                      brokers: str, topic: str, partitions: int) -> dict[str, Any]:
    """Read the same segments with pyarrow's own S3 filesystem, turn each batch into Python
    lists and produce them (idempotent producer, one ``flush`` at the end): what a replay
    costs at minimum, with no framework, checkpoints or per-batch acknowledgement."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from replicator.core.kafka import Admin, Producer
    from replicator.core.settings import KafkaSettings

    kafka = KafkaSettings(brokers=brokers)
    Admin(kafka).create_topic(topic, partitions)
    fs = pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                           endpoint_override=endpoint.removeprefix("http://"), scheme="http")
    files = {p: sorted(i.path for i in fs.get_file_info(pafs.FileSelector(
        f"{bucket}/data/{region}/{topic_src}/{p}/0/")) if i.type == pafs.FileType.File)
        for p in range(partitions)}
    p = Producer(kafka)
    for part in range(partitions):
        p.produce(topic, b"warm-up", None, partition=part)
    p.flush(30)
    n = raw = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    for part, paths in files.items():
        for path in paths:
            with fs.open_input_file(path) as f:
                for b in pq.ParquetFile(f).iter_batches(BATCH):
                    ts = b.column("timestamp").cast("int64").to_pylist()
                    keys = b.column("key").to_pylist()
                    values = b.column("value").to_pylist()
                    p.produce_many(topic, part, ts, keys, values, [None] * len(ts), ts)
                    raw += sum(len(k or b"") + len(v or b"") for k, v in zip(keys, values,
                                                                            strict=True))
                    n += len(ts)
    left = p.flush(120)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    failed = p.take_failures()
    assert left == 0 and not failed, (left, failed[:3])
    drop_topics(brokers, [topic])
    return rates({"seconds": wall, "cpu_seconds": cpu, "raw_bytes": raw, "records": n})


def ingress_inproc(stack: BenchStack, topic: str, partitions: int, records: int, raw: int,
                   delivery: str, counter: S3Counter | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    from ingress.controller import Ingress

    suffix = uuid.uuid4().hex[:6]
    dest = f"{topic}.copy.{delivery}.{suffix}"
    settings = stack.ingress_settings(topic, dest, group=f"bench-in-{suffix}",
                                      delivery=delivery, suffix=suffix, extra=extra)
    counter = counter or S3Counter()
    ing = Ingress(settings, store=stack.store(settings, counter))
    ing.start()
    runner = threading.Thread(target=ing.run, daemon=True)
    moto_pid, dest_pid = stack.pid("moto"), stack.broker_pid("destination")
    per_part = {p: len(range(p, records, partitions)) - 1 for p in range(partitions)}

    def produced() -> float:
        return ing.metrics.total("ingress_messages_produced_total")

    def done() -> bool:
        pos = {wid[2]: v for wid, v in ing.positions().items() if wid[1] == topic}
        return all((pos.get(p) or -1) >= last for p, last in per_part.items())

    moto0, broker0 = cpu_of(moto_pid), cpu_of(dest_pid)
    with CpuTimeline() as timeline:
        runner.start()
        # The clock starts when the first segment is read (first GetObject): group join,
        # topic creation and listing before it are start-up, not replay.
        wait_until(lambda: produced() > 0, 120, "ingress producing", 0.01)
        wait_until(done, 600, "ingress replaying everything", 0.01)
        t1, cpu1 = time.perf_counter(), time.process_time()
    t0 = counter.first_call["GetObject:segment"]
    wall, cpu = t1 - t0, cpu1 - timeline.cpu_at(t0)
    moto_cpu, broker_cpu = cpu_of(moto_pid) - moto0, cpu_of(dest_pid) - broker0
    transactions = ing.metrics.total("ingress_transactions_total", outcome="committed")
    ing.stop()
    runner.join(60)
    ing.close()
    drop_topics(stack.dest_kafka, [dest, settings.ingress.checkpoint_topic,
                                   settings.ingress.segment_events_topic])
    return rates({"seconds": wall, "cpu_seconds": cpu, "raw_bytes": raw, "records": records,
                  "moto_cpu_seconds": moto_cpu, "broker_cpu_seconds": broker_cpu,
                  "transactions": transactions})


# --- memory: replaying big segments in a child process ------------------------------


def write_big_segment(stack: BenchStack, topic: str, raw_target: int, value_size: int
                      ) -> tuple[int, int, int]:
    """One level-0 segment of ``raw_target`` raw bytes (partition 0) + ``_topic.json`` in
    the destination bucket. Returns (records, raw bytes, stored bytes)."""
    import random

    import pyarrow as pa
    from lib import text_value

    from formats.base import SEGMENT_SCHEMA, SegmentMetadata, WriterOptions
    from formats.registry import get_format
    from formats.segment_io import SegmentUpload, publish_segment
    from replicator.core.keys import SegmentKey, topic_meta_key

    settings = stack.ingress_settings(topic, topic + ".x", group="x", delivery="exactly-once",
                                      suffix="x")
    store = stack.store(settings)
    rng = random.Random(9)
    pool = [text_value(rng, value_size) for _ in range(997)]
    key_len = 12
    n = raw_target // (value_size + key_len)
    up = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    now = int(time.time() * 1000)
    header_type = SEGMENT_SCHEMA.field("headers").type
    for start in range(0, n, 20_000):
        m = min(20_000, n - start)
        offs = pa.array(range(start, start + m), pa.int64())
        batch = pa.RecordBatch.from_arrays([
            offs,
            pa.array([now + i for i in range(start, start + m)], pa.timestamp("ms", tz="UTC")),
            pa.array([0] * m, pa.int8()),
            pa.array([b"device-%05d" % (i % 5000) for i in range(start, start + m)],
                     pa.binary()),
            pa.array([pool[i % 997] for i in range(start, start + m)], pa.binary()),
            pa.array([[]] * m, header_type),
        ], schema=SEGMENT_SCHEMA)
        up.write_batch(batch)
    key = SegmentKey("data", "us-east-1", topic, 0, 0, 0, n - 1)
    temp = up.finish(SegmentMetadata.for_key(key, n))
    publish_segment(store, temp.key, key)
    store.put(topic_meta_key("data", "us-east-1", topic), json.dumps(
        {"partitions": 1, "configs": {}, "updated_at": datetime.now(UTC).isoformat()}).encode())
    return n, n * (value_size + key_len), store.head(key.to_key()).size


def ingress_memory(stack: BenchStack, workdir: Path, raw_target: int, value_size: int,
                   delivery: str = "exactly-once") -> dict[str, Any]:
    topic = f"bench.big.{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    n, raw, stored = write_big_segment(stack, topic, raw_target, value_size)
    write_s = time.perf_counter() - t0
    suffix = uuid.uuid4().hex[:6]
    raw_cfg = stack.ingress_raw(topic, topic + ".copy", group=f"bench-mem-{suffix}",
                                delivery=delivery, suffix=suffix)
    cfg = workdir / f"ingress-mem-{suffix}.json"
    cfg.write_text(json.dumps(raw_cfg))
    out = subprocess.run([sys.executable, __file__, "--child-memory", str(cfg), topic,
                          str(n)], check=True, stdout=subprocess.PIPE, text=True,
                         cwd=Path(__file__).parent).stdout
    r: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    r.update(records=n, raw_bytes=raw, stored_bytes=stored, write_seconds=write_s,
             delivery=delivery)
    return r


def _child_memory(cfg: Path, topic: str, records: int) -> None:
    from lib import RssSampler

    from ingress.controller import Ingress
    from replicator.core.settings import validate_settings

    settings = validate_settings(json.loads(cfg.read_text()))
    ing = Ingress(settings)
    ing.start()
    with RssSampler(interval=0.02) as rss:
        runner = threading.Thread(target=ing.run, daemon=True)
        t0 = time.perf_counter()
        runner.start()

        def done() -> bool:
            pos = {wid[2]: v for wid, v in ing.positions().items() if wid[1] == topic}
            return (pos.get(0) or -1) >= records - 1

        wait_until(done, 1800, "ingress replaying the big segment", 0.05)
        seconds = time.perf_counter() - t0
        ing.stop()
        runner.join(60)
    ing.close()
    print(json.dumps({"baseline_rss": rss.baseline, "peak_rss": rss.peak,
                      "seconds": seconds,
                      "max_parallel_replays": settings.require("ingress").max_parallel_replays,
                      "cpu_seconds": time.process_time()}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--child-memory", nargs=3, metavar=("CFG", "TOPIC", "RECORDS"))
    a = ap.parse_args()
    if a.child_memory:
        _child_memory(Path(a.child_memory[0]), a.child_memory[1], int(a.child_memory[2]))
