"""Egress memory against ``egress.max_buffered_bytes``.

    .venv/bin/python bench/egress_memory.py [--partitions 1,16,64] [--budgets 64MiB,256MiB]
                                            [--total 384MiB] [--value-size 1000] [--s3]
                                            [--json out.json]

For each partition count a topic is filled with ``--total`` raw bytes of text-like records
of ``--value-size`` bytes (1 KiB by default; 64 for small records), spread evenly. For
each budget a fresh egress process (segment limits 100 MiB, 10 M messages, 1 h: only the
memory budget can close segments early) consumes the whole topic, while a thread samples
its RSS every 20 ms. The store discards segment bytes (it keeps only sizes and keys) so
the RSS is the egress's own; ``--s3`` uses moto instead.

Printed per run: RSS before consuming (the fixed overhead: interpreter, pyarrow, librdkafka
and its prefetch queue), peak RSS, peak growth over the baseline, the peak of the bytes the
egress accounts as held (``replicator_egress_buffered_bytes``), and segments by reason;
for the partition-count question also the peak thread count, start-up (``Egress.start``
returned; every partition assigned; first record consumed, from the constructor) and the
consume rate (raw MB/s from the first record until every record was consumed, before the
last segments are durable), e.g. ``--partitions 4,1000 --budgets 256MiB``. Also what
glibc malloc holds at the RSS peak beyond the start ("malloc +") and how much of that is
free memory it keeps ("free in it"), and the peak of Arrow's pools ("arrow max").

Experiments: ``--env NAME=VALUE`` (the egress process only, e.g.
``MALLOC_MMAP_THRESHOLD_``), ``--egress-config``/``--format-config`` (JSON merged into
``[egress]``/``[format]``), ``--kafka-config`` (a JSON object, or a list of objects: one
run each on the same topic), ``--memory-pool``; ``EGRESS_BENCH_TRACE=1`` prints the
loop's memory state every 2 s; ``EGRESS_BENCH_DETAIL=1`` records where the memory is near
the RSS peak (``mallinfo2``, each glibc arena's free chunks, resident bytes by mapping,
pymalloc's statistics, what egress counted by phase) in the ``--json`` rows' ``detail``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from replicator.core.units import format_size, parse_size

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")

WORDS = [b"sensor", b"temperature", b"humidity", b"pressure", b"reading", b"device",
         b"region", b"value", b"status", b"ok", b"warning", b"error", b"level", b"battery"]
FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
MiB = 1024**2


def text_value(rng: random.Random, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        out += rng.choice(WORDS) + b" " + str(rng.randint(0, 99999)).encode() + b" "
    return bytes(out[:size])


# --- child: one egress process --------------------------------------------------------


def null_store() -> Any:
    """An ObjectStore that keeps sizes, not bytes (so the RSS is the egress's own)."""
    from replicator.core.errors import ObjectNotFound
    from replicator.core.storage import ObjectInfo, ObjectStore, Upload

    class NullUpload(Upload):
        def __init__(self, store: NullStore, key: str) -> None:
            self.store, self.key, self._n = store, key, 0

        def write(self, data: bytes | bytearray | memoryview) -> int:
            self._n += len(data)
            return len(data)

        def complete(self) -> ObjectInfo:
            return self.store.put(self.key, b"", size=self._n)

        def abort(self) -> None:
            return None

        @property
        def bytes_written(self) -> int:
            return self._n

        @property
        def buffered_bytes(self) -> int:
            return 0

    class NullStore(ObjectStore):
        bucket = "null"

        def __init__(self) -> None:
            self.sizes: dict[str, int] = {}
            self.small: dict[str, bytes] = {}   # _topic.json (read back by egress)
            self.lock = threading.Lock()

        def put(self, key: str, data: bytes, *, size: int | None = None,
                **kw: Any) -> ObjectInfo:
            with self.lock:
                self.sizes[key] = len(data) if size is None else size
                if size is None:
                    self.small[key] = bytes(data)
            return self.head(key)

        def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
            return NullUpload(self, key)

        def get(self, key: str) -> bytes:
            with self.lock:
                if key not in self.small:
                    raise ObjectNotFound(key)
                return self.small[key]

        def get_range(self, key: str, start: int, length: int) -> bytes:
            raise ObjectNotFound(key)

        def head(self, key: str) -> ObjectInfo:
            with self.lock:
                if key not in self.sizes:
                    raise ObjectNotFound(key)
                return ObjectInfo(key, self.sizes[key], datetime.now(UTC))

        def list(self, prefix: str, *, start_after: str | None = None
                 ) -> Iterator[ObjectInfo]:
            with self.lock:
                keys = sorted(k for k in self.sizes if k.startswith(prefix))
            return iter([self.head(k) for k in keys if start_after is None or k > start_after])

        def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
            return self.put(dst, b"", size=self.head(src).size)

        def delete(self, key: str) -> None:
            with self.lock:
                self.sizes.pop(key, None)

        def delete_many(self, keys: Iterable[str]) -> None:
            for k in keys:
                self.delete(k)

    return NullStore()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_state() -> tuple[int, int]:
    """(bytes glibc malloc holds from the OS, bytes of it in use); (0, 0) without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return 0, 0
    m = libc.mallinfo2()
    return m.arena + m.hblkhd, m.uordblks + m.hblkhd


def mallinfo() -> dict[str, int]:
    """Every ``mallinfo2`` field (bytes, or counts for ``ordblks``/``smblks``/``hblks``)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return {}
    m = libc.mallinfo2()
    return {field[0]: getattr(m, field[0]) for field in _MallInfo2._fields_}


def malloc_arenas() -> list[dict[str, int]]:
    """Per glibc arena (``malloc_info``): bytes from the OS, free bytes, free chunks, and
    free bytes in chunks of < 4 KiB, 4-32 KiB, 32-128 KiB and larger."""
    import xml.etree.ElementTree as ET

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    except (OSError, AttributeError):
        return []
    with tempfile.NamedTemporaryFile(suffix=".xml") as f:
        fp = libc.fopen(f.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        text = Path(f.name).read_text()
    out = []
    for heap in ET.fromstring(text).findall("heap"):
        row = {"nr": int(heap.get("nr", -1)), "small": 0, "mid": 0, "large": 0, "huge": 0}
        for size in heap.find("sizes") or []:
            if size.tag != "size":
                continue
            hi, total = int(size.get("to", 0)), int(size.get("total", 0))
            key = ("small" if hi < 4096 else "mid" if hi < 32768 else
                   "large" if hi < 131072 else "huge")
            row[key] += total
        for t in heap.findall("total"):
            if t.get("type") in ("fast", "rest"):
                row["free"] = row.get("free", 0) + int(t.get("size", 0))
                row["free_chunks"] = row.get("free_chunks", 0) + int(t.get("count", 0))
        for s in heap.findall("system"):
            if s.get("type") == "current":
                row["system"] = int(s.get("size", 0))
        out.append(row)
    return out


def smaps_classes() -> dict[str, int]:
    """Resident bytes by kind of mapping: the main heap, 64 MiB-aligned thread arenas
    (glibc heaps), other anonymous mappings (pymalloc's 1 MiB arenas, which the kernel
    merges when adjacent; glibc's blocks above the mmap threshold; thread stacks), and
    files (libraries)."""
    out = {"heap": 0, "thread_arenas": 0, "anon_other": 0, "file": 0,
           "anon_other_n": 0}
    name = None
    lo = 1
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(None, 6)
        if "-" in first[0] and not first[0].endswith(":"):
            lo = int(first[0].split("-")[0], 16)
            name = first[5] if len(first) > 5 else ""
        elif first[0] == "Rss:":
            rss = int(first[1]) * 1024
            if name == "[heap]":
                out["heap"] += rss
            elif name:
                out["file"] += rss
            elif lo % (64 * MiB) == 0:
                # glibc maps a thread arena's heap 64 MiB-aligned (HEAP_MAX_SIZE).
                out["thread_arenas"] += rss
            else:
                out["anon_other"] += rss
                out["anon_other_n"] += 1
    return out


def pymalloc_stats() -> dict[str, int]:
    """pymalloc's arenas and blocks (``sys._debugmallocstats``, captured from fd 2)."""
    import re

    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    out = {}
    for key, pat in (("arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
                     ("allocated_blocks", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
                     ("available_blocks", r"# bytes in available blocks\s*=\s*([\d,]+)"),
                     ("empty_pools", r"bytes in \d+ unused pools\s*=\s*([\d,]+)"),
                     ("total", r"Total\s*=\s*([\d,]+)")):
        m = re.search(pat, text)
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out


def held_parts(eg: Any) -> dict[str, int]:
    """What the egress accounts as held, by phase: rows as Python objects, batches waiting
    for the encoder, the writers' buffered groups (and the one being encoded)."""
    parts = {"rows": 0, "rows_n": 0, "backlog": 0, "writer": 0, "open": 0, "closing": 0}
    for w in list(eg._writers.values()):
        segs = ([w.segment] if w.segment is not None else []) + list(w.closing)
        parts["open"] += w.segment is not None
        parts["closing"] += len(w.closing)
        for s in segs:
            parts["rows"] += s.columns.held_bytes
            parts["rows_n"] += len(s.columns)
            parts["backlog"] += s.submitted - s.written
            u = s.upload
            parts["writer"] += u.buffered_bytes if u is not None else 0
    return parts


def child(args: argparse.Namespace) -> int:
    from egress.allocators import choose_arrow_pool

    # As replicator-egress does, before pyarrow loads (egress/allocators.py).
    choose_arrow_pool(args.memory_pool)
    from egress.controller import Egress
    from replicator.core.settings import load_settings

    settings = load_settings(data={
        "region": "us-east-1",
        "s3": {"bucket": args.bucket, "endpoint_url": args.endpoint},
        "kafka": {"brokers": args.brokers,
                  "config": {**FAST_GROUP, **json.loads(args.kafka_config or "{}")}},
        "metrics": {"port": 0},
        "format": json.loads(args.format_config or "{}"),
        "egress": {"group_id": f"mem-{random.getrandbits(32):x}",
                   "max_buffered_bytes": args.budget, "memory_pool": args.memory_pool,
                   **json.loads(args.egress_config or "{}"),
                   "topics": {args.topic: {"max_segment_size": "100MiB",
                                           "max_segment_messages": 10_000_000,
                                           "max_segment_age": "1h"}}},
    }, environ={})
    store = None if args.s3 else null_store()
    t_launch = time.monotonic()
    eg = Egress(settings, store=store)
    proc = psutil.Process()
    eg.start()
    t_started = time.monotonic()
    baseline = proc.memory_info().rss
    base_malloc = malloc_state()
    import pyarrow as pa

    pools = [pa.system_memory_pool(), pa.mimalloc_memory_pool(), pa.jemalloc_memory_pool()]
    peak = {"rss": baseline, "held": 0, "arrow": 0, "threads": proc.num_threads(),
            "malloc": 0, "malloc_used": 0}
    done = threading.Event()
    detail = bool(os.environ.get("EGRESS_BENCH_DETAIL"))
    detail_at = [baseline]
    if detail:
        peak["base_detail"] = {"mallinfo": mallinfo(), "smaps": smaps_classes(),
                               "pymalloc": pymalloc_stats()}

    def sample() -> None:
        while not done.is_set():
            rss = proc.memory_info().rss
            if rss > peak["rss"]:
                # What glibc malloc holds at the peak, and how much of it is in use: the
                # rest is freed memory its arenas keep.
                peak["rss"] = rss
                peak["malloc"], peak["malloc_used"] = malloc_state()
                if detail and rss > detail_at[0] + 2 * MiB:
                    # Where the memory is, near the peak (at most 2 MiB below it).
                    detail_at[0] = rss
                    peak["detail"] = {"rss": rss, "mallinfo": mallinfo(),
                                      "arenas": malloc_arenas(), "smaps": smaps_classes(),
                                      "pymalloc": pymalloc_stats(), "held": held_parts(eg),
                                      "arrow": sum(p.bytes_allocated() for p in pools)}
            peak["threads"] = max(peak["threads"], proc.num_threads())
            # The gauge's own family, not Metrics.total: that collects every metric child,
            # and with 1,000 partitions this sampler took more of the GIL than egress.
            held = sum(smp.value for fam in eg.m.buffered.collect() for smp in fam.samples)
            peak["held"] = max(peak["held"], int(held))
            # Every Arrow pool: the Parquet encoder allocates from Arrow's C++ default pool
            # whatever pa.set_memory_pool chose.
            peak["arrow"] = max(peak["arrow"], sum(p.bytes_allocated() for p in pools))
            time.sleep(0.02)

    def trace() -> None:
        from egress.allocators import arrow_allocated_bytes

        while not done.is_set():
            loop = eg._loop
            if loop is not None:
                held = sum(smp.value for fam in eg.m.buffered.collect() for smp in fam.samples)
                print(f"trace: held {held / MiB:.1f}M arrow {arrow_allocated_bytes() / MiB:.1f}M "
                      f"memory_paused {loop.memory_paused} paused {len(loop.paused)} "
                      f"writers {len(eg._writers)} closing "
                      f"{sum(len(w.closing) for w in list(eg._writers.values()))}",
                      file=sys.stderr, flush=True)
            time.sleep(2)

    if os.environ.get("EGRESS_BENCH_TRACE"):
        threading.Thread(target=trace, daemon=True).start()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    runner = threading.Thread(target=eg.run, daemon=True)
    runner.start()
    t0 = time.monotonic()
    t_first = t_assigned = None
    while (consumed := sum(w.next_offset or 0 for w in list(eg._writers.values()))
           ) < args.records:
        # Summing every writer's position is work under the GIL: less often when many.
        time.sleep(0.02 if (args.partitions_n or 0) <= 64 else 0.1)
        if t_assigned is None and len(eg._writers) >= args.partitions_n:
            t_assigned = time.monotonic()
        if t_first is None and consumed > 0:
            t_first = time.monotonic()
        if time.monotonic() - t0 > 600:
            raise SystemExit("egress did not consume the topic within 10 minutes")
    t_consumed = time.monotonic()
    eg.stop()
    runner.join()
    done.set()
    sampler.join()
    eg.close()
    reasons = {r: eg.metrics.total("egress_segments_total", reason=r)
               for r in ("size", "memory", "shutdown")}
    print(json.dumps({"baseline_rss": baseline, "peak_rss": peak["rss"],
                      "peak_held": peak["held"], "peak_arrow": peak["arrow"],
                      "base_malloc": base_malloc[0], "peak_malloc": peak["malloc"],
                      "peak_malloc_used": peak["malloc_used"],
                      "detail": peak.get("detail"), "base_detail": peak.get("base_detail"),
                      "reasons": reasons, "peak_threads": peak["threads"],
                      "start_s": t_started - t_launch,
                      "assigned_s": (t_assigned or t_consumed) - t_launch,
                      "first_record_s": (t_first or t_consumed) - t_launch,
                      # first record -> every record consumed (not yet durable)
                      "consume_s": t_consumed - (t_first or t_started),
                      "seconds": time.monotonic() - t0}))
    return 0


# --- parent: topics, runs, table ------------------------------------------------------


def fill(brokers: str, topic: str, partitions: int, records: int, value_size: int) -> None:
    from replicator.core.kafka import Admin, Producer
    from replicator.core.settings import KafkaSettings

    kafka = KafkaSettings(brokers=brokers)
    # Records of megabytes (e.g. --value-size 8388608) need the topic's own limit raised.
    config = ({"max.message.bytes": str(value_size + 1024**2)}
              if value_size > 512 * 1024 else None)
    Admin(kafka).create_topic(topic, partitions, config)
    rng = random.Random(3)
    # At most 64 MiB of distinct values (499 of 8 MiB would be 4 GiB in this process).
    values = [text_value(rng, value_size)
              for _ in range(max(1, min(499, 64 * 1024**2 // max(1, value_size))))]
    p = Producer(kafka, overrides={"linger.ms": 20})
    for i in range(records):
        p.produce(topic, value=values[i % len(values)], key=b"k%06d" % (i % 100_000),
                  partition=i % partitions)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(300) == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", default="1,16,64")
    ap.add_argument("--budgets", default="64MiB,256MiB")
    ap.add_argument("--total", default="384MiB", help="raw bytes per topic")
    ap.add_argument("--value-size", type=int, default=1000, help="bytes per record value")
    ap.add_argument("--s3", action="store_true", help="upload to moto instead of discarding")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kafka-config", help="extra librdkafka settings as JSON (experiments); "
                    "a JSON list of objects runs each on the same topic")
    ap.add_argument("--egress-config", help="extra [egress] settings as JSON (experiments)")
    ap.add_argument("--format-config", help="[format] settings as JSON (experiments)")
    ap.add_argument("--memory-pool", default="system",
                    choices=("system", "mimalloc", "jemalloc"), help="egress.memory_pool")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment of the egress process only (e.g. MALLOC_ARENA_MAX=2)")
    ap.add_argument("--kafka", choices=("tansu", "apache"), default="tansu",
                    help="the broker: tansu (embedded) or apache (from $KAFKA_HOME)")
    # child mode
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("brokers", "endpoint", "bucket", "topic"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--records", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-partitions", dest="partitions_n", type=int,
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    from replicator.core.s3 import make_s3_client
    from replicator.devstack.aws import create_bucket
    from replicator.devstack.processes import start_broker, start_moto, stop_seconds

    partitions = [int(p) for p in args.partitions.split(",")]
    # A JSON list of objects: one run per variant and budget on the same topic.
    given = json.loads(args.kafka_config or "{}")
    variants: list[dict[str, Any]] = given if isinstance(given, list) else [given]
    budgets = [parse_size(b) for b in args.budgets.split(",")]
    record_size = args.value_size + 8            # value + 8 B key
    records = parse_size(args.total) // record_size
    work = Path(tempfile.mkdtemp(prefix="egress-mem-"))
    tansu = start_broker(args.kafka, f"{args.kafka}-mem", work)
    moto = start_moto(work)
    rows: list[dict[str, Any]] = []
    try:
        endpoint = f"http://{moto.address}"
        for n in partitions:
            topic = f"mem-{n}-{random.getrandbits(24):x}"
            fill(tansu.address, topic, n, records, args.value_size)
            for budget, kafka_config in ((b, k) for k in variants for b in budgets):
                bucket = f"mem-{random.getrandbits(32):x}"
                if args.s3:
                    create_bucket(make_s3_client(endpoint_url=endpoint, region="us-east-1",
                                                 access_key_id="test",
                                                 secret_access_key="test"),
                                  bucket, "us-east-1")
                cmd = [sys.executable, __file__, "--child", "--brokers", tansu.address,
                       "--endpoint", endpoint, "--bucket", bucket, "--topic", topic,
                       "--budget", str(budget), "--records", str(records),
                       "--child-partitions", str(n), "--memory-pool", args.memory_pool]
                if args.s3:
                    cmd.append("--s3")
                if kafka_config:
                    cmd += ["--kafka-config", json.dumps(kafka_config)]
                if args.egress_config:
                    cmd += ["--egress-config", args.egress_config]
                if args.format_config:
                    cmd += ["--format-config", args.format_config]
                env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
                out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                                     env=env).stdout
                r = json.loads(out.strip().splitlines()[-1])
                rows.append({"partitions": n, "budget": budget, "kafka_config": kafka_config,
                             **r})
                print(f"  {n} partitions, budget {format_size(budget)}: done in "
                      f"{r['seconds']:.1f}s", file=sys.stderr)
    finally:
        tansu.stop(stop_seconds(args.kafka))
        moto.stop()
    print(f"\n{format_size(records * record_size)} raw per topic, {args.value_size}-byte "
          f"values, segment limit "
          f"100 MiB, {'moto S3' if args.s3 else 'discarding store'}")
    print(f"{'partitions':>10} {'budget':>9} {'base RSS':>9} {'peak RSS':>9} {'growth':>9} "
          f"{'held max':>9} {'arrow max':>9} {'growth/budget':>13} {'threads':>7} "
          f"{'start s':>7} {'assigned s':>10} {'1st rec s':>9} {'MB/s':>6} {'malloc +':>9} "
          f"{'free in it':>10}  segments by reason")
    for r in rows:
        growth = r["peak_rss"] - r["baseline_rss"]
        reasons = ", ".join(f"{k} {v:.0f}" for k, v in r["reasons"].items() if v)
        print(f"{r['partitions']:>10} {format_size(r['budget']):>9} "
              f"{r['baseline_rss'] / MiB:>8.0f}M {r['peak_rss'] / MiB:>8.0f}M "
              f"{growth / MiB:>8.0f}M {r['peak_held'] / MiB:>8.0f}M "
              f"{r['peak_arrow'] / MiB:>8.0f}M "
              f"{growth / r['budget']:>13.2f} {r['peak_threads']:>7} {r['start_s']:>7.1f} "
              f"{r['assigned_s']:>10.1f} {r['first_record_s']:>9.1f} "
              f"{records * record_size / 1e6 / r['consume_s']:>6.1f} "
              f"{(r.get('peak_malloc', 0) - r.get('base_malloc', 0)) / MiB:>8.0f}M "
              f"{(r.get('peak_malloc', 0) - r.get('peak_malloc_used', 0)) / MiB:>9.0f}M"
              f"  {reasons}  {json.dumps(r['kafka_config']) if r['kafka_config'] else ''}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
