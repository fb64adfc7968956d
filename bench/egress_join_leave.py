"""A second egress member joins and leaves one group during a steady run.

    KAFKA_HOME=... .venv/bin/python bench/egress_join_leave.py [--partitions 16]
        [--rate-mb 8] [--seconds 60] [--join-at 20] [--leave-at 40] [--json out.json]

One Apache Kafka broker, one topic. A producer thread writes 1 KiB records at a steady
``--rate-mb`` for ``--seconds``; member A (an in-process ``Egress`` in a child process,
discarding store as in ``egress_memory.py``, cooperative-sticky by default) runs throughout,
member B is started at ``--join-at`` and stopped (SIGINT: it drains and leaves) at
``--leave-at``. Each member prints once every 0.5 s: records consumed, partitions assigned,
segments by close reason. Printed: the group's consume rate (2-second windows), per member
the segments closed by a rebalance (reason ``revoke``) against the partitions that moved,
the dip (slowest window after the join or leave against the median window before the join)
and the time until the rate is back to 90 % of it. Records re-read after a partition moved
count again. Each member has its own discarding store, so a member taking over a partition
warns that the bucket has no segment of it (expected here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from egress_memory import FAST_GROUP, null_store, text_value

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
REASONS = ("size", "count", "age", "memory", "revoke", "shutdown")


def child(args: argparse.Namespace) -> int:
    from egress.controller import Egress
    from replicator.core.settings import load_settings

    settings = load_settings(data={
        "region": "us-east-1", "s3": {"bucket": "null"},
        "kafka": {"brokers": args.brokers, "config": dict(FAST_GROUP)},
        "metrics": {"port": 0},
        "egress": {"group_id": args.group,
                   "topics": {args.topic: {"max_segment_size": "64MiB",
                                           "max_segment_messages": 10_000_000,
                                           "max_segment_age": "5s"}}},
    }, environ={})
    eg = Egress(settings, store=null_store())
    eg.start()
    signal.signal(signal.SIGINT, lambda *_: eg.stop())
    runner = threading.Thread(target=eg.run, daemon=True)
    runner.start()
    while runner.is_alive():
        writers = list(eg._writers.values())
        print(json.dumps({"t": time.time(), "assigned": len(writers),
                          "consumed": eg.metrics.total("egress_messages_total"),
                          "reasons": {r: eg.metrics.total("egress_segments_total", reason=r)
                                      for r in REASONS}}), flush=True)
        runner.join(0.5)
    eg.close()
    print(json.dumps({"t": time.time(), "done": True,
                      "consumed": eg.metrics.total("egress_messages_total"),
                      "reasons": {r: eg.metrics.total("egress_segments_total", reason=r)
                                  for r in REASONS}}), flush=True)
    return 0


def produce(brokers: str, topic: str, partitions: int, rate_mb: float, seconds: float,
            stop: threading.Event) -> int:
    from replicator.core.kafka import Producer
    from replicator.core.settings import KafkaSettings

    p = Producer(KafkaSettings(brokers=brokers), overrides={"linger.ms": 20})
    rng = random.Random(5)
    values = [text_value(rng, 1024) for _ in range(499)]
    per_tick = max(1, int(rate_mb * 1e6 / 1036 / 100))   # records per 10 ms
    t0, n = time.monotonic(), 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        for _ in range(per_tick):
            p.produce(topic, value=values[n % 499], key=b"k%06d" % n, partition=n % partitions)
            n += 1
        p.poll(0)
        time.sleep(max(0.0, t0 + n / per_tick * 0.01 - time.monotonic()))
    p.flush(60)
    return n


class Member:
    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def leave(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def wait(self, timeout: float) -> bool:
        """Whether the member exited by itself within ``timeout`` (else it is killed)."""
        try:
            self.proc.wait(timeout)
            clean = True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            clean = False
        self.reader.join(5)
        return clean


def consumed_at(member: Member, t: float) -> float:
    before = [x["consumed"] for x in member.lines if x["t"] <= t]
    return before[-1] if before else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--rate-mb", type=float, default=8.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--join-at", type=float, default=20.0)
    ap.add_argument("--leave-at", type=float, default=40.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("brokers", "topic", "group"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    from replicator.core.kafka import Admin
    from replicator.core.settings import KafkaSettings
    from replicator.devstack.processes import start_broker, stop_seconds

    work = Path(tempfile.mkdtemp(prefix="egress-join-"))
    broker = start_broker("apache", "apache-join", work)
    try:
        topic, group = f"join-{random.getrandbits(24):x}", f"join-{random.getrandbits(32):x}"
        Admin(KafkaSettings(brokers=broker.address)).create_topic(topic, args.partitions)
        cmd = [sys.executable, __file__, "--child", "--brokers", broker.address,
               "--topic", topic, "--group", group]
        stop = threading.Event()
        produced: list[int] = []
        t0 = time.time()
        prod = threading.Thread(target=lambda: produced.append(produce(
            broker.address, topic, args.partitions, args.rate_mb, args.seconds, stop)))
        a = Member("A", cmd)
        prod.start()
        time.sleep(max(0.0, t0 + args.join_at - time.time()))
        t_join = time.time()
        b = Member("B", cmd)
        time.sleep(max(0.0, t0 + args.leave_at - time.time()))
        t_leave = time.time()
        b.leave()
        prod.join()
        time.sleep(8)   # the last age rotation
        a.leave()
        clean = {"A": a.wait(300), "B": b.wait(60)}
    finally:
        broker.stop(stop_seconds("apache"))
    end = int(max(x["t"] for x in a.lines) - t0)
    # MB/s over 2-second windows ending at each second (single seconds are too noisy on a
    # shared machine); "steady" from 3 s after A's first records until the join.
    rate = []
    for s in range(2, end):
        n = sum(consumed_at(m, t0 + s) - consumed_at(m, t0 + s - 2) for m in (a, b))
        rate.append(n * 1036 / 1e6 / 2)
    first = next((i for i, r in enumerate(rate) if r > 0), 0)
    before = rate[first + 3:int(args.join_at) - 2] or rate[first:int(args.join_at) - 2]
    if not before:
        raise SystemExit(f"member A read nothing before the join at {args.join_at:.0f}s "
                         "(a loaded machine starts slowly): use a later --join-at")
    steady = statistics.median(before)

    def dip(at: float) -> tuple[float, float]:
        window = rate[int(at - t0) - 1:int(at - t0) + 14]
        low = min(window)
        back = next((i for i, r in enumerate(window) if i > window.index(low)
                     and r >= 0.9 * steady), None)
        return low / steady, float(back) if back is not None else float("nan")

    def reasons(m: Member) -> dict[str, float]:
        return {k: v for k, v in m.lines[-1]["reasons"].items() if v}

    join_dip, join_back = dip(t_join)
    leave_dip, leave_back = dip(t_leave)
    b_max = max((x.get("assigned", 0) for x in b.lines), default=0)
    out = {"partitions": args.partitions, "rate_mb": args.rate_mb, "steady_mb_s": steady,
           "produced": produced[0] if produced else None,
           "consumed": a.lines[-1]["consumed"] + b.lines[-1]["consumed"],
           "b_assigned_max": b_max, "a_reasons": reasons(a), "b_reasons": reasons(b),
           "join": {"dip": join_dip, "recovered_s": join_back},
           "leave": {"dip": leave_dip, "recovered_s": leave_back},
           "rate_mb_s": rate, "load": os.getloadavg(), "exited_cleanly": clean}
    print(f"{args.partitions} partitions, {args.rate_mb} MB/s produced for {args.seconds:.0f}s; "
          f"B joined at {args.join_at:.0f}s, left at {args.leave_at:.0f}s; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  produced {out['produced']}, consumed {out['consumed']:.0f} (A+B, re-reads "
          f"after a revoke counted twice)")
    print(f"  steady {steady:.1f} MB/s; join: slowest second {join_dip:.2f} of it, back to "
          f"90 % after {join_back:.0f}s; leave: {leave_dip:.2f}, back after {leave_back:.0f}s")
    print(f"  B held up to {b_max} partitions; segments by reason: A {out['a_reasons']}, "
          f"B {out['b_reasons']}")
    print(f"  members exited by themselves after SIGINT: {clean}")
    print("  MB/s (2 s windows, from t=2s): " + " ".join(f"{r:.0f}" for r in rate))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
