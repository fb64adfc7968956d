"""What the ingress producer costs per record: librdkafka settings and produce loops.

    KAFKA_HOME=... .venv/bin/python bench/produce_loop.py [--records 200000] [--size 1024]
        [--only settings,loops] [--repeat 2]

One Apache Kafka broker (``start_kafka``), 4 partitions, distinct text-like records
(``peer_lib.DistinctText``, 12-byte keys) held in Python lists in batches of 10,000 per
partition before the timing starts (what ``ingress.rows.batch_rows`` hands the producer).
Each variant produces every record into a fresh topic, then waits for every
acknowledgement, and reports per record: CPU µs of this process (all threads, librdkafka's
included), CPU µs of the broker, and records/s. Two delivery modes:

* ``alo``: one idempotent producer, everything produced, one ``flush`` at the end;
* ``eos``: one transaction per batch of 10,000 records with a ``flush`` before the commit
  (what ``ingress.transactions.TransactionLoop`` does per transaction).

``settings``: the seam's ``Producer.produce_many`` under librdkafka settings
(``linger.ms``, ``batch.size``, ``batch.num.messages``, ``compression.type``): which
defaults the ingress producer should have. ``loops``: the per-record work around the
client call with our defaults: a plain Python loop with keyword arguments (what
``produce_many`` did), ``produce_many`` as it is, and the delivery-report variants ingress
uses (``track_acks``: a Python callback per record, at-least-once before this change;
``on_ends``: the offset map's two callbacks per batch).

``enqueue`` (no broker: the producer points at a closed port, so records stay in its
queue and are purged after each batch): thread CPU µs per record of the calling thread
alone, the loop around the client call without librdkafka's threads or delivery reports;
the least load-sensitive figure of the three on a shared machine.

The machine is shared: every line is printed with the load average, and variants are
compared within one run (alternating, medians of ``--repeat`` rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from peer_lib import DistinctText, tree_cpu_rss

BATCH = 10_000
PARTITIONS = 4

Data = list[tuple[int, list[int], list[bytes | None], list[bytes | None]]]
"""(partition, timestamps, keys, values) batches, in the order they are produced."""


def make_data(records: int, size: int) -> Data:
    gen = DistinctText()
    now = int(time.time() * 1000)
    per = records // PARTITIONS
    out: Data = []
    for part in range(PARTITIONS):
        for start in range(0, per, BATCH):
            idx = range(part * per + start, part * per + min(per, start + BATCH))
            out.append((part, [now] * len(idx), [b"device-%05d" % (i % 5000) for i in idx],
                        [gen.value(i, size) for i in idx]))
    return out


def plain_loop(p: Any, topic: str, part: int, ts: list[int], keys: list[Any],
               values: list[Any]) -> None:
    """The loop a user writes: keyword arguments per record (``produce_many`` before)."""
    raw = p._p
    produce = raw.produce
    for t, k, v, h in zip(ts, keys, values, [None] * len(ts), strict=True):
        while True:
            try:
                produce(topic, v, k, part, timestamp=t, headers=h)
                break
            except BufferError:
                raw.poll(0.05)
    raw.poll(0)


def run_variant(brokers: str, broker_pid: int, data: Data, *, eos: bool,
                overrides: dict[str, Any], loop: str) -> dict[str, float]:
    from replicator.core.kafka import Admin, Producer
    from replicator.core.settings import KafkaSettings

    kafka = KafkaSettings(brokers=brokers)
    admin = Admin(kafka)
    topic = f"pl.{uuid.uuid4().hex[:8]}"
    admin.create_topic(topic, PARTITIONS)
    tid = f"pl-{uuid.uuid4().hex[:6]}" if eos else None
    ends: list[int] = []
    p = Producer(kafka, transactional_id=tid, overrides=overrides,
                 track_acks=loop == "track_acks", report_successes=loop == "on_ends")
    if eos:
        p.init_transactions(30)
        p.begin_transaction()
    for part in range(PARTITIONS):
        p.produce(topic, b"warm-up", None, partition=part)
    if eos:
        p.commit_transaction(30)
    p.flush(30)

    def on_end(i: int, report: Any) -> None:
        ends.append(report.offset)

    produce: Callable[[int, list[int], list[Any], list[Any]], None]
    if loop == "plain":
        def produce(part: int, ts: list[int], keys: list[Any], values: list[Any]) -> None:
            plain_loop(p, topic, part, ts, keys, values)
    else:
        def produce(part: int, ts: list[int], keys: list[Any], values: list[Any]) -> None:
            p.produce_many(topic, part, ts, keys, values, [None] * len(ts), ts,
                           on_ends=on_end if loop == "on_ends" else None)

    records = sum(len(d[1]) for d in data)
    raw = sum(len(k or b"") + len(v or b"") for d in data for k, v in zip(d[2], d[3],
                                                                          strict=True))
    b0 = tree_cpu_rss(broker_pid)[0]
    t0, c0 = time.perf_counter(), time.process_time()
    for part, ts, keys, values in data:
        if eos:
            p.begin_transaction()
        produce(part, ts, keys, values)
        if eos:
            left = p.flush(60)
            assert left == 0, f"{left} records not acknowledged"
            p.commit_transaction(60)
    left = p.flush(120)
    assert left == 0, f"{left} records not acknowledged"
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    broker = tree_cpu_rss(broker_pid)[0] - b0
    assert not p.take_failures(), "deliveries failed"
    admin.delete_topics([topic])
    return {"cpu_us": cpu / records * 1e6, "broker_us": broker / records * 1e6,
            "rate": records / wall, "cpu_s_per_gb": cpu / (raw / 1e9)}


def enqueue_only(data: Data, loop: str, rounds: int) -> float:
    """Thread CPU µs per record of enqueueing ``data`` (no broker; purged per batch)."""
    from replicator.core.kafka import Producer
    from replicator.core.settings import KafkaSettings

    p = Producer(KafkaSettings(brokers="127.0.0.1:1"),
                 overrides={"queue.buffering.max.messages": 2 * BATCH,
                            "message.timeout.ms": 600_000})
    spent, n = 0.0, 0
    for _ in range(rounds):
        for part, ts, keys, values in data:
            c0 = time.thread_time()
            if loop == "plain":
                plain_loop(p, "enqueue", part, ts, keys, values)
            else:
                p.produce_many("enqueue", part, ts, keys, values, [None] * len(ts), ts)
            spent += time.thread_time() - c0
            n += len(ts)
            p._p.purge(in_queue=True, in_flight=True, blocking=True)
            p._p.poll(0)
    return spent / n * 1e6


def report_cost(track: bool, n: int = 200_000) -> float:
    """Thread CPU µs of the producer-wide callback for one successful delivery."""
    from confluent_kafka import Message

    from replicator.core.kafka import Producer
    from replicator.core.settings import KafkaSettings

    p = Producer(KafkaSettings(brokers="127.0.0.1:1"), track_acks=track,
                 report_successes=not track)
    msg = Message(topic="enqueue", partition=1, offset=5, value=b"v")
    delivered = p._delivered
    c0 = time.thread_time()
    for _ in range(n):
        delivered(None, msg)
    return (time.thread_time() - c0) / n * 1e6


SETTINGS: dict[str, dict[str, Any]] = {
    "defaults (linger 20, batch.size 1MB)": {},
    "linger.ms 5": {"linger.ms": 5},
    "linger.ms 100": {"linger.ms": 100},
    "batch.num.messages 100000": {"batch.num.messages": 100_000},
    "batch.size 16KB (librdkafka's)": {"batch.size": 16_384},
    "compression lz4": {"compression.type": "lz4"},
    "compression zstd (level 1, like MM2)": {"compression.type": "zstd",
                                             "compression.level": 1},
}
LOOPS = ("plain", "produce_many", "track_acks", "on_ends")


def main(argv: list[str] | None = None) -> int:
    from replicator.devstack.processes import start_kafka

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--only", default="settings,loops")
    ap.add_argument("--modes", default="alo,eos")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    data = make_data(args.records, args.size)
    if only == {"enqueue"}:
        load0 = os.getloadavg()
        got: dict[str, list[float]] = {"plain": [], "produce_many": []}
        for _ in range(args.repeat):
            for loop, runs in got.items():
                runs.append(enqueue_only(data, loop, 1))
        print(f"enqueue only: {args.records:,} records x {args.size} B, medians of "
              f"{args.repeat}; load average {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}")
        for loop, runs in got.items():
            print(f"  {loop:<14} thread CPU {statistics.median(runs):.3f} us/record  "
                  f"(runs {', '.join(f'{r:.3f}' for r in runs)})")
        print(f"  success report of a record without its own callback (the producer-wide "
              f"callback, Python part): track_acks {report_cost(True):.3f} us, "
              f"report_successes {report_cost(False):.3f} us")
        return 0
    work = Path(tempfile.mkdtemp(prefix="produce-loop-"))
    broker = start_kafka("produce-loop-kafka", work, home=os.environ.get("KAFKA_HOME"))
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    load0 = os.getloadavg()
    try:
        for mode in args.modes.split(","):   # warm-up: the broker's JIT, the coordinators
            run_variant(broker.address, broker.pid, data, eos=mode == "eos", overrides={},
                        loop="produce_many")
        for _ in range(args.repeat):
            for mode in args.modes.split(","):
                variants: list[tuple[str, dict[str, Any], str]] = []
                if "settings" in only:
                    variants += [(name, o, "produce_many") for name, o in SETTINGS.items()]
                if "loops" in only:
                    variants += [(f"loop: {loop}", {}, loop) for loop in LOOPS
                                 if not (loop == "on_ends" and mode == "alo")]
                for name, o, loop in variants:
                    r = run_variant(broker.address, broker.pid, data, eos=mode == "eos",
                                    overrides=o, loop=loop)
                    results.setdefault((mode, name), []).append(r)
                    print(f"  [{mode}] {name}: {r['cpu_us']:.2f} us/rec, broker "
                          f"{r['broker_us']:.2f}, {r['rate']:,.0f} rec/s "
                          f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    finally:
        broker.stop(timeout=20)
    print(f"produce loop: {args.records:,} records x {args.size} B, {PARTITIONS} partitions, "
          f"batches of {BATCH:,}; medians of {args.repeat}; load average at start "
          f"{load0[0]:.2f} {load0[1]:.2f}, at the end {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f}")
    print(f"  {'mode':<4} {'variant':<40} {'CPU us/rec':>10} {'CPU s/GB':>9} "
          f"{'broker us/rec':>13} {'records/s':>10}")
    for (mode, name), variant_runs in results.items():
        def med(k: str, rs: list[dict[str, float]] = variant_runs) -> float:
            return statistics.median(r[k] for r in rs)
        print(f"  {mode:<4} {name:<40} {med('cpu_us'):>10.2f} {med('cpu_s_per_gb'):>9.2f} "
              f"{med('broker_us'):>13.2f} {med('rate'):>10,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
