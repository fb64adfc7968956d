"""Egress measurements: bare consume vs ``Egress``.

Used by ``run_all.py``. Rates are of raw record bytes (key + value); CPU is the CPU time of
this process (all threads: Python, librdkafka, upload threads) over the timed window.
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

import confluent_kafka as ck
from lib import (
    GB,
    MB,
    BenchStack,
    S3Counter,
    cpu_of,
    parse_prometheus,
    stop_all,
    wait_until,
    write_toml,
)

CONSUME_BATCH = 1000


def bare_consumer(brokers: str, group: str) -> ck.Consumer:
    """The raw client, with the configuration ``replicator.core.kafka.Consumer`` gives
    egress (the baseline must not run through our wrapper)."""
    from replicator.core.kafka import CONSUMER_DEFAULTS, PRODUCER_ONLY, client_config
    from replicator.core.settings import KafkaSettings

    return ck.Consumer(client_config(KafkaSettings(brokers=brokers),
                                     {**CONSUMER_DEFAULTS, "group.id": group},
                                     drop=PRODUCER_ONLY))


def bare_consume(brokers: str, topic: str, partitions: int, records: int) -> dict[str, Any]:
    """``consume(1000)`` from offset 0 to the end, touching every message's key and value.

    Same consumer defaults as the egress (read_committed, manual commits), no group join in
    the timing (``assign``).
    """
    c = bare_consumer(brokers, f"bare-{uuid.uuid4().hex[:6]}")
    c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    n = raw = 0
    t0 = cpu0 = 0.0
    while n < records:
        msgs = c.consume(num_messages=CONSUME_BATCH, timeout=1.0)
        if msgs and not t0:
            t0, cpu0 = time.perf_counter(), time.process_time()
        for m in msgs:
            if m.error() is not None:
                continue
            raw += len(m.key() or b"") + len(m.value() or b"")
            n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    c.close()
    return rates({"seconds": wall, "cpu_seconds": cpu, "raw_bytes": raw, "records": n})


def bare_consume_encode(brokers: str, topic: str, partitions: int, records: int,
                        *, batch: int = 10_000, row_group_bytes: int = 32 * 1024**2,
                        compression: str = "zstd") -> dict[str, Any]:
    """The bare loop plus the work a segment needs at minimum, with no framework around it.

    Per partition, keys/values/offsets/timestamps are gathered into lists, turned into
    Arrow arrays every ``batch`` records, and written with pyarrow's ParquetWriter (zstd,
    the default format settings: same row-group bound, dictionary only for keys) into a
    sink that discards the bytes. The gap between this and ``Egress`` is our own overhead;
    the gap between this and ``bare_consume`` is the cost of encoding and compressing.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from formats.base import SEGMENT_SCHEMA

    c = bare_consumer(brokers, f"bare-enc-{uuid.uuid4().hex[:6]}")
    c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    header_type = SEGMENT_SCHEMA.field("headers").type
    writers = {p: pq.ParquetWriter(pa.BufferOutputStream(), SEGMENT_SCHEMA,
                                   compression=compression,
                                   use_dictionary=["key"],
                                   write_statistics=["offset", "timestamp"])
               for p in range(partitions)}
    cols: dict[int, tuple[list[int], list[int], list[Any], list[Any]]] = {
        p: ([], [], [], []) for p in range(partitions)}
    pending: dict[int, list[pa.RecordBatch]] = {p: [] for p in range(partitions)}
    pending_bytes = dict.fromkeys(range(partitions), 0)

    def flush(p: int, final: bool = False) -> None:
        offs, ts, keys, values = cols[p]
        if offs:
            n = len(offs)
            b = pa.RecordBatch.from_arrays([
                pa.array(offs, pa.int64()), pa.array(ts, pa.timestamp("ms", tz="UTC")),
                pa.nulls(n, pa.int8()).fill_null(0), pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()), pa.nulls(n, header_type)],
                schema=SEGMENT_SCHEMA)
            pending[p].append(b)
            pending_bytes[p] += b.nbytes
            cols[p] = ([], [], [], [])
        if pending[p] and (final or pending_bytes[p] >= row_group_bytes):
            t = pa.Table.from_batches(pending[p], schema=SEGMENT_SCHEMA)
            writers[p].write_table(t, row_group_size=t.num_rows)
            pending[p], pending_bytes[p] = [], 0

    n = raw = 0
    t0 = cpu0 = 0.0
    while n < records:
        msgs = c.consume(num_messages=CONSUME_BATCH, timeout=1.0)
        if msgs and not t0:
            t0, cpu0 = time.perf_counter(), time.process_time()
        for m in msgs:
            if m.error() is not None:
                continue
            p = m.partition()
            assert p is not None
            k, v = m.key(), m.value()
            offs, ts, keys, values = cols[p]
            offs.append(m.offset() or 0)
            ts.append(m.timestamp()[1])
            keys.append(k)
            values.append(v)
            raw += len(k or b"") + len(v or b"")
            n += 1
            if len(offs) >= batch:
                flush(p)
    for p in range(partitions):
        flush(p, final=True)
        writers[p].close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    c.close()
    return rates({"seconds": wall, "cpu_seconds": cpu, "raw_bytes": raw, "records": n})


def rates(r: dict[str, Any]) -> dict[str, Any]:
    r["records_per_s"] = r["records"] / r["seconds"]
    r["mb_per_s"] = r["raw_bytes"] / MB / r["seconds"]
    r["cpu_s_per_gb"] = r["cpu_seconds"] / (r["raw_bytes"] / GB)
    r["mb_per_cpu_s"] = r["raw_bytes"] / MB / r["cpu_seconds"] if r["cpu_seconds"] else 0.0
    return r


def egress_inproc(stack: BenchStack, topic: str, records: int, raw: int, *, store_kind: str,
                  counter: S3Counter | None = None, bucket: str | None = None,
                  segment_size: str = "64MiB", compression: str | None = None
                  ) -> dict[str, Any]:
    """One ``Egress`` in this process over the whole topic into ``store_kind`` (discard/s3).

    Timing starts at the first consumed message and ends when ``run`` returned, i.e. every
    segment is durable under its final key and its offsets are committed.
    """
    from egress_memory import null_store

    from egress.controller import Egress

    settings = stack.egress_settings(topic, group=f"bench-eg-{uuid.uuid4().hex[:6]}",
                                     bucket=bucket, segment_size=segment_size,
                                     compression=compression)
    # "discard": keeps keys and sizes only (MemoryObjectStore would MD5 and hold every
    # byte, a cost of the fake, not of the egress).
    store: Any = null_store() if store_kind == "discard" else stack.store(settings, counter)
    eg = Egress(settings, store=store)
    eg.start()
    runner = threading.Thread(target=eg.run, daemon=True)
    moto_pid = stack.pid("moto")

    def consumed() -> int:
        return sum(w.next_offset or 0 for w in list(eg._writers.values()))

    runner.start()
    wait_until(lambda: consumed() > 0, 60, "egress consuming", 0.002)
    t0, cpu0, moto0 = time.perf_counter(), time.process_time(), cpu_of(moto_pid)
    wait_until(lambda: consumed() >= records, 600, "egress consuming everything")
    consume_s = time.perf_counter() - t0
    eg.stop()   # closes the open segments (reason shutdown), uploads, commits
    runner.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    moto_cpu = cpu_of(moto_pid) - moto0
    eg.close()
    out = rates({"seconds": wall, "consume_seconds": consume_s, "cpu_seconds": cpu,
                 "raw_bytes": raw, "records": records, "moto_cpu_seconds": moto_cpu,
                 "stored_bytes": eg.metrics.total("egress_segment_bytes_total"),
                 "segments": eg.metrics.total("egress_segments_total")})
    return out


# --- scale: 1 and 2 egress processes in one group ------------------------------------


def _metrics(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return parse_prometheus(r.read().decode())
    except OSError:
        return {}


def egress_processes(stack: BenchStack, workdir: Path, topic: str, partitions: int,
                     records: int, value_size: int, n_procs: int,
                     segment_size: str = "4MiB") -> dict[str, Any]:
    """``n_procs`` ``replicator-egress`` processes in one group over a pre-filled topic.

    The processes are started together (they join the group in the same generation on
    Tansu). Every 50 ms this process reads their /metrics (messages consumed) and CPU
    times; the rate is taken over the steady window between 20 % and 80 % of the records
    consumed, which leaves out process start, the group join and the last segments' age
    rotation. ``seconds_to_durable`` is from the first consumed record until every record
    is in a committed segment (the group's committed offsets).
    """
    from lib import fill_topic

    from replicator.core.kafka import Admin, Consumer, TopicPartition
    from replicator.core.settings import KafkaSettings
    from replicator.devstack.processes import free_port

    kafka = KafkaSettings(brokers=stack.source_kafka)
    Admin(kafka).create_topic(topic, partitions)
    raw_bytes = fill_topic(kafka, topic, partitions, records, value_size, seed=5)
    group = f"bench-scale-{uuid.uuid4().hex[:6]}"
    procs: list[tuple[subprocess.Popen[bytes], int]] = []
    exe = Path(sys.executable).with_name("replicator-egress")
    samples: list[tuple[float, float, float]] = []   # (time, messages consumed, CPU s)
    try:
        for i in range(n_procs):
            port = free_port()
            raw = stack.raw_config("egress")
            raw["metrics"]["port"] = port
            raw["log"]["level"] = "WARNING"
            raw["egress"]["group_id"] = group
            # Small segments: they close (encode + upload) all along the window, as in a
            # long run, instead of all at the end.
            raw["egress"]["topics"] = {topic: {"max_segment_messages": 10_000_000,
                                               "max_segment_size": segment_size,
                                               "max_segment_age": "1s"}}
            cfg = write_toml(workdir / f"egress-{group}-{i}.toml", raw)
            log = open(workdir / f"egress-{group}-{i}.log", "wb")  # noqa: SIM115
            p = subprocess.Popen([str(exe), "--config", str(cfg)], stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
            procs.append((p, port))
        deadline = time.monotonic() + 600
        while True:
            consumed = sum(_metrics(port).get("replicator_egress_messages_total", 0.0)
                           for _, port in procs)
            samples.append((time.perf_counter(), consumed,
                            sum(cpu_of(p.pid) for p, _ in procs)))
            if consumed >= records:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs):
                raise RuntimeError(f"egress processes consumed {consumed:.0f} of {records}")
            time.sleep(0.05)
        c = Consumer(kafka, group)

        def committed() -> int:
            offs = c.committed([TopicPartition(topic, p) for p in range(partitions)],
                               timeout=10)
            return sum(max(0, tp.offset) for tp in offs)

        wait_until(lambda: committed() >= records, 600, "all records committed", 0.1)
        t_durable = time.perf_counter()
        c.close()
    finally:
        stop_all(p for p, _ in procs)
    lo = next(s for s in samples if s[1] >= 0.2 * records)
    hi = next(s for s in samples if s[1] >= 0.8 * records)
    first = next(s for s in samples if s[1] > 0)
    frac = (hi[1] - lo[1]) / records
    out = rates({"processes": n_procs, "seconds": hi[0] - lo[0], "cpu_seconds": hi[2] - lo[2],
                 "raw_bytes": raw_bytes * frac, "records": hi[1] - lo[1]})
    out["seconds_to_durable"] = t_durable - first[0]
    out["total_records"] = records
    return out
