"""Microbenchmarks of the per-record hot paths between the Kafka client and Arrow.

    KAFKA_HOME=... .venv/bin/python bench/hotpath_micro.py [--records 300000] [--size 100]

One Apache Kafka broker (``start_kafka``), one topic filled with distinct text-like
records (``peer_lib.DistinctText``), then, in this process, CPU microseconds per record of:

egress (poll thread and ``ColumnBuffer``):
  * ``consume(2000)`` alone, touching nothing (what any consumer pays);
  * ``+ ColumnBuffer.add`` (the five accessor passes) and ``+ take`` (Arrow arrays);
  * ``take`` variants: timestamps built as int64 then viewed as timestamp (instead of
    ``pa.array(python ints, timestamp)``), and the constant ``timestamp_type`` column
    built without per-record work;
ingress (``batch_rows`` + ``KafkaSink.produce``):
  * ``batch_rows`` (Arrow columns to Python lists) alone;
  * the ``produce()`` loop of ``KafkaSink.produce`` (keyword arguments per record).
    (``Producer.produce_batch`` of confluent-kafka 2.16 is no alternative: it raises
    NotImplementedError for per-message timestamps and takes no headers.)

Produce variants end with ``flush``: the broker acknowledges everything, so the client's
own threads' work is in the figure too (process CPU, all threads). Results are ratios on
this machine; the machine is shared, so run it twice.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from peer_lib import DistinctText, raw_consumer, raw_producer


def cpu_us_per_record(fn: Callable[[], int]) -> tuple[float, float]:
    """(CPU µs per record, wall µs per record) of ``fn`` (which returns its record count)."""
    c0, w0 = time.process_time(), time.perf_counter()
    n = fn()
    return ((time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6)


def main(argv: list[str] | None = None) -> int:
    import pyarrow as pa
    from confluent_kafka import TopicPartition

    from egress.columns import _TIMESTAMP, ColumnBuffer, _no_headers
    from formats.base import SEGMENT_SCHEMA
    from ingress.rows import Rows, batch_rows
    from replicator.core.kafka import Admin
    from replicator.core.settings import KafkaSettings
    from replicator.devstack.processes import start_kafka

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hotpath-"))
    broker = start_kafka("hotpath-kafka", work, home=os.environ.get("KAFKA_HOME"))
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        kafka = KafkaSettings(brokers=broker.address)
        topic = f"hot.{uuid.uuid4().hex[:6]}"
        Admin(kafka).create_topic(topic, 4)
        gen = DistinctText()
        p = raw_producer(broker.address, {"linger.ms": 20})
        for i in range(args.records):
            while True:
                try:
                    p.produce(topic, gen.value(i, args.size), b"device-%05d" % (i % 5000),
                              i % 4)
                    break
                except BufferError:
                    p.poll(0.05)
        p.flush(120)

        def consume_all(on_batch: Callable[[list[Any]], None]) -> int:
            c = raw_consumer(broker.address, f"hot-{uuid.uuid4().hex[:6]}")
            c.assign([TopicPartition(topic, q, 0) for q in range(4)])
            n = 0
            while n < args.records:
                msgs = c.consume(num_messages=2000, timeout=1.0)
                msgs = [m for m in msgs if m.error() is None]
                n += len(msgs)
                on_batch(msgs)
            c.close()
            return n

        def add_only(msgs: list[Any]) -> None:
            ColumnBuffer().add(msgs)

        def add_take(msgs: list[Any]) -> None:
            b = ColumnBuffer()
            b.add(msgs)
            b.take()

        def add_take_fast(msgs: list[Any]) -> None:
            b = ColumnBuffer()
            b.add(msgs)
            n = len(b.offsets)
            types = [t for t, _ in b.timestamps]
            stamps = [s for _, s in b.timestamps]
            const = types.count(types[0]) == n if n else True
            pa.RecordBatch.from_arrays([
                pa.array(b.offsets, pa.int64()),
                pa.array(stamps, pa.int64()).view(_TIMESTAMP),
                pa.repeat(pa.scalar(types[0], pa.int8()), n) if const and n
                else pa.array(types, pa.int8()),
                pa.array(b.keys, pa.binary()), pa.array(b.values, pa.binary()),
                _no_headers(n)], schema=SEGMENT_SCHEMA)

        kept: list[Any] = []

        def keep(msgs: list[Any]) -> None:
            kept.extend(msgs)

        consume_all(keep)   # warm the page cache and the broker
        for _ in range(args.repeat):
            for name, fn in (("consume only", lambda m: None), ("consume + add", add_only),
                             ("consume + add + take", add_take),
                             ("consume + add + take (int64 view, constant type)",
                              add_take_fast)):
                results.setdefault("egress: " + name, []).append(
                    cpu_us_per_record(functools.partial(consume_all, fn)))

        # Ingress: the same records as Arrow batches of 10 000.
        b = ColumnBuffer()
        b.add(kept)
        table = pa.Table.from_batches([b.take()])
        batches = table.to_batches(max_chunksize=10_000)
        kept.clear()

        def rows_only() -> int:
            return sum(len(batch_rows(x, None) or ()) for x in batches)

        def produce_loop() -> int:
            prod = raw_producer(broker.address, {"delivery.report.only.error": True})
            dest = f"hot.out.{uuid.uuid4().hex[:6]}"
            Admin(kafka).create_topic(dest, 1)
            n = 0
            for x in batches:
                rows = batch_rows(x, None)
                assert isinstance(rows, Rows)
                produce = prod.produce
                for ts, k, v, h in zip(rows.timestamps, rows.keys, rows.values, rows.headers,
                                       strict=True):
                    while True:
                        try:
                            produce(dest, v, k, 0, timestamp=ts, headers=h)
                            break
                        except BufferError:
                            prod.poll(0.05)
                n += len(rows)
                prod.poll(0)
            prod.flush(120)
            return n

        for _ in range(args.repeat):
            for name, fn2 in (("batch_rows only", rows_only),
                              ("batch_rows + produce() loop + flush", produce_loop)):
                results.setdefault("ingress: " + name, []).append(cpu_us_per_record(fn2))
    finally:
        broker.stop(timeout=20)
    print(f"{args.records:,} records of {args.size} B values, median of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.2f}")
    for name, runs in results.items():
        cpu = sorted(r[0] for r in runs)[len(runs) // 2]
        wall = sorted(r[1] for r in runs)[len(runs) // 2]
        print(f"  {name:<60} CPU {cpu:6.2f} us/record  wall {wall:6.2f} us/record")
    return 0


if __name__ == "__main__":
    sys.exit(main())
