"""Translation lag of consumer-group failover in a steady run (docs/failover.md).

    KAFKA_HOME=... .venv/bin/python bench/failover_lag.py [--seconds 40] [--rate-mb 1]
        [--export-interval 5s] [--sync-every 1s] [--json out.json]

The local stack on Apache Kafka (two brokers, moto); ``replicator-egress`` and
``replicator-ingress`` as processes, egress writing straight into the destination bucket
(the bucket replication hop is outside the figure, as in ``measure_lag.py``). This process
produces 1 KiB records at ``--rate-mb``; a source consumer group reads them and commits
every 0.5 s (recording each commit's time and offsets); a sync loop runs ``replicator groups
sync``'s plan and commit every ``--sync-every`` and records the destination group's offsets
after each round. Afterwards every source commit ``(t, C)`` is matched with the first sync
round whose destination offset reached the translation of ``C``: the translation lag is
that round's time minus ``t``, i.e. how long after a consumer committed in the source a
failover would resume it exactly there. Printed: p50/p90/p99/max over the commits after a
warm-up, the offset-map entries written, and the export interval used (the lag grows by up
to that interval: the default is 30 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

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

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def run(stack: BenchStack, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from ingress.checkpoints import KafkaCheckpointStore
    from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition
    from replicator.core.metrics import Metrics
    from replicator.core.offset_map import translate
    from replicator.core.settings import KafkaSettings, validate_settings
    from replicator.devstack.configs import DEST_BUCKET
    from replicator.ops.groups import plan, read_exports, read_offset_map, sync

    run_id = uuid.uuid4().hex[:6]
    partitions = args.partitions
    topic, dest = f"bench.failover.{run_id}", f"bench.failover.{run_id}.copy"
    group = f"bench-app-{run_id}"
    src_kafka = KafkaSettings(brokers=stack.source_kafka)
    dst_kafka = KafkaSettings(brokers=stack.dest_kafka)
    Admin(src_kafka).create_topic(topic, partitions)
    eg = stack.raw_config("egress")
    eg["log"]["level"] = "WARNING"
    eg["metrics"]["port"] = 0
    eg["s3"]["bucket"] = DEST_BUCKET
    eg["egress"]["group_id"] = f"bench-failover-{run_id}"
    eg["egress"]["topics"] = {topic: {"max_segment_age": "1s", "max_segment_size": "64MiB",
                                      "max_segment_messages": 10_000_000}}
    eg["egress"]["group_export"] = {"interval": args.export_interval,
                                    "include": [f"bench-app-{run_id}"]}
    ing = stack.ingress_raw(topic, dest, group=f"bench-failover-in-{run_id}",
                            delivery="exactly-once", suffix=run_id)
    ing_settings = validate_settings(ing)
    cfg = ing_settings.require("ingress")
    store = stack.store(ing_settings)
    procs: list[subprocess.Popen[bytes]] = []
    bindir = Path(sys.executable).parent
    commits: list[tuple[float, dict[int, int]]] = []
    synced: list[tuple[float, dict[int, int]]] = []
    stop = threading.Event()
    try:
        for role, conf in (("egress", eg), ("ingress", ing)):
            path = write_toml(workdir / f"failover-{role}-{run_id}.toml", conf)
            log = open(workdir / f"failover-{role}-{run_id}.log", "wb")  # noqa: SIM115
            procs.append(subprocess.Popen([str(bindir / f"replicator-{role}"), "--config",
                                           str(path)], stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, env=dict(os.environ)))
        wait_until(lambda: Admin(dst_kafka).partition_count(dest) == partitions, 90,
                   "destination topic", 0.2)

        def consume() -> None:
            consumer = Consumer(src_kafka, group, {"auto.offset.reset": "earliest"})
            consumer.subscribe([topic])
            position: dict[int, int] = {}
            last = time.monotonic()
            while not stop.is_set():
                for (_, p), msgs in consumer.fetch(500, 0.1).runs.items():
                    position[p] = (msgs[-1].offset() or 0) + 1
                if time.monotonic() - last >= 0.5 and position:
                    consumer.commit([TopicPartition(topic, p, o) for p, o in position.items()])
                    commits.append((time.time(), dict(position)))
                    last = time.monotonic()
            consumer.close()

        def sync_loop() -> None:
            admin = Admin(dst_kafka)
            while not stop.is_set():
                started = time.monotonic()
                try:
                    cps = KafkaCheckpointStore(dst_kafka, cfg.checkpoint_topic, Metrics(),
                                               timeout=30).load_all()
                    rows = plan(read_exports(store, "data", cfg), cfg.sources, admin,
                                read_offset_map(dst_kafka, cfg.offset_map_topic), cps)
                    sync(rows, admin)
                    now = admin.group_offsets(group)
                    synced.append((time.time(), {p: o for (t, p), o in now.items()
                                                 if t == dest}))
                except Exception as e:  # noqa: BLE001 - a bench keeps sampling
                    print(f"sync round failed: {e}", file=sys.stderr)
                stop.wait(max(0.0, args.sync_every - (time.monotonic() - started)))

        threads = [threading.Thread(target=consume, daemon=True),
                   threading.Thread(target=sync_loop, daemon=True)]
        for thread in threads:
            thread.start()
        rng = random.Random(5)
        values = [text_value(rng, 1024) for _ in range(499)]
        producer = Producer(src_kafka, overrides={"linger.ms": 5})
        n, t0, _ = produce_paced(producer, topic, values, partitions, args.rate_mb * MB,
                                 args.seconds, record_bytes=1036)
        # Let the last commits be exported, replicated and synced.
        time.sleep(_seconds(args.export_interval) + 5 * args.sync_every + 5)
    finally:
        stop.set()
        stop_all(procs)
    entries = read_offset_map(dst_kafka, cfg.offset_map_topic)
    mine = {k[2]: v for k, v in entries.items() if k[1] == topic}
    lags = []
    for t, offsets in commits:
        if t < t0 + args.warmup:
            continue
        targets = {p: translate(mine.get(p, []), c, None).offset for p, c in offsets.items()}
        reached = next((ts for ts, d in synced if ts >= t and all(
            tgt is not None and d.get(p, -1) >= tgt for p, tgt in targets.items())), None)
        if reached is not None:
            lags.append(reached - t)
    lags.sort()
    return {"records": n, "seconds": args.seconds, "rate_mb": args.rate_mb,
            "export_interval": args.export_interval, "sync_every_s": args.sync_every,
            "commits": len(commits), "matched": len(lags),
            "p50_s": percentile(lags, 50), "p90_s": percentile(lags, 90),
            "p99_s": percentile(lags, 99), "max_s": lags[-1] if lags else float("nan"),
            "map_entries": sum(len(v) for v in mine.values())}


def _seconds(text: str) -> float:
    from replicator.core.units import parse_duration

    return parse_duration(text).total_seconds()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--rate-mb", type=float, default=1.0)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--export-interval", default="5s")
    ap.add_argument("--sync-every", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not os.environ.get("KAFKA_HOME"):
        print("needs Apache Kafka: set KAFKA_HOME (e.g. ../shared/kafka)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="failover-lag-") as d:
        stack = BenchStack(Path(d), kafka="apache")
        try:
            result = run(stack, Path(d), args)
        finally:
            stack.stop()
    load = os.getloadavg()[0]
    print(f"failover translation lag (load {load:.1f}): {result['records']:,} records at "
          f"{result['rate_mb']} MB/s, export every {result['export_interval']}, sync every "
          f"{result['sync_every_s']}s")
    print(f"  source commits {result['commits']} (matched {result['matched']}): p50 "
          f"{result['p50_s']:.2f} s, p90 {result['p90_s']:.2f} s, p99 {result['p99_s']:.2f} s, "
          f"max {result['max_s']:.2f} s; offset-map entries {result['map_entries']}")
    if args.json:
        args.json.write_text(json.dumps({**result, "load": load}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
