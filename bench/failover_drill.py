"""Failover drill: the RPO and RTO of an unplanned failover (docs/runbooks.md, section 2),
measured on the local stack with bucket replication simulated at a stated delay.

    KAFKA_HOME=../shared/kafka .venv/bin/python bench/failover_drill.py \\
        [--profiles defaults,low-latency] [--runs 3] [--replication-delay 5] \\
        [--rate 200] [--partitions 4] [--seed N] [--json out.json]

Each run starts a fresh local stack on Apache Kafka (one broker per region, one moto
server for both buckets and the destination's queue), ``replicator-egress`` (source
region, into the source bucket) and ``replicator-ingress`` (destination region, from the
destination bucket's S3 events) as processes, and ``DelayedReplication``
(``bench/drill_parts.py``), which copies each object of the source bucket to the
destination bucket ``--replication-delay`` seconds after it appeared: S3 replication at a
fixed delay, its PUT raising the S3 event ingress reads. A producer (``acks=all``,
idempotent) writes records keyed by a sequence number at ``--rate`` per second and logs
every acknowledged one; a source consumer group reads them and commits every second.

At a random moment of the profile's kill window (seconds after production started) the
source region dies: egress and the source broker get SIGKILL and the replication stops
(what it had not copied yet stays behind with the region). That moment is the decision to
fail over. From it the drill follows the runbook, timing each step:

1. **catch-up**: ingress replays what reached the destination bucket, until
   ``replicator checkpoints show`` has lag 0 on every partition (checked in-process with
   the same function, ``checkpoint_report``, every 0.25 s);
2. **groups sync**: ``replicator groups sync --config ingress.toml`` (the CLI, a process);
3. **consumers**: a member of the source consumer group starts on the copy (subscribe,
   ``read_committed``). The RTO ends when it reads its first record, or, when nothing
   follows its committed offset, when it is assigned.

**RPO**: the acknowledged records absent from the copy (read ``read_committed`` after
step 3): their count, and the seconds of production they span (from the first missing
record's produce time to the kill). Then the source bucket "survives" (it is not part of
the outage, or the region returns): everything it holds is copied, ingress replays it, and
what is still missing is what egress had not written (its open segments). The difference
is the share of the RPO that was waiting for bucket replication.

Each run also checks: no record twice in the copy, no missing record below one present
(a hole), and each partition's first record read by the consumer against the group's
exported source offset (exact, re-read: duplicates, or skip: never expected).

Profiles: ``defaults`` (the shipped segment thresholds: 5 min, 100 MiB, 1M records;
group export every 30 s) and ``low-latency`` (1 s segments of at most 4 MiB, group export
every 5 s). Ingress runs with its shipped defaults in both. ``--replication-delay 0``
stands for egress writing straight into the destination region's bucket (plus this
copier's listing interval, 0.2 s); ``--mirror`` runs egress in the low-RPO mode
(``[egress.mirror]`` names the destination bucket: egress copies each segment into it as
soon as it is published, docs/sizing.md, "Low-RPO mode") with the delayed copier kept as
S3 replication's backstop (its copy gives ingress a second event for a segment it has
replayed); the run also reports egress's mirror metrics, scraped just before the kill.
AWS adds its own replication time instead of the stated delay: see docs/runbooks.md,
"Measured: an unplanned failover, drilled".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from drill_parts import (
    AckedProducer,
    DelayedReplication,
    SourceApp,
    read_all,
    start_consumer,
)
from lib import BenchStack, percentile, stop_all, wait_until, write_toml

from replicator.devstack.processes import free_port

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

TOPIC, DEST, APP_GROUP = "drill.events", "drill.events.copy", "drill-app"


@dataclass(frozen=True)
class Profile:
    name: str
    topic: dict[str, Any]            # [egress.topics."drill.events"]; {} = shipped defaults
    export_interval: str | None      # [egress.group_export] interval; None = shipped (30s)
    kill_window: tuple[float, float]  # seconds after production started


PROFILES = {
    "defaults": Profile("defaults", {}, None, (40.0, 55.0)),
    "low-latency": Profile("low-latency", {"max_segment_age": "1s",
                                           "max_segment_size": "4MiB"}, "5s", (12.0, 30.0)),
}


def _spawn(role: str, config: Path, workdir: Path) -> subprocess.Popen[bytes]:
    log = open(workdir / f"{role}.log", "wb")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([str(Path(sys.executable).parent / f"replicator-{role}"),
                             "--config", str(config)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=dict(os.environ))


def _lag(ingress: Any, store: Any, kafka: Any) -> int:
    """What ``replicator checkpoints show`` sums: positions in the destination bucket's
    segments that ingress has not replayed."""
    from ingress.checkpoints import KafkaCheckpointStore
    from replicator.core.metrics import Metrics
    from replicator.ops.checkpoints import checkpoint_report

    cps = KafkaCheckpointStore(kafka, ingress.checkpoint_topic, Metrics(), timeout=30).load_all()
    return sum(r.lag or 0 for r in checkpoint_report(ingress, "data", store, cps))


def one_run(workdir: Path, profile: Profile, args: argparse.Namespace,
            rng: random.Random) -> dict[str, Any]:
    from replicator.core.kafka import Admin
    from replicator.core.settings import KafkaSettings, validate_settings
    from replicator.ops.groups import read_exports

    stack = BenchStack(workdir, kafka="apache")
    procs: list[subprocess.Popen[bytes]] = []
    copier: DelayedReplication | None = None
    parts = args.partitions
    try:
        src_kafka = KafkaSettings(brokers=stack.source_kafka)
        dst_kafka = KafkaSettings(brokers=stack.dest_kafka)
        Admin(src_kafka).create_topic(TOPIC, parts)
        eg = stack.raw_config("egress")
        eg["log"]["level"] = "INFO"
        eg["metrics"]["port"] = 0
        eg["egress"]["group_id"] = "drill-egress"
        eg["egress"]["topics"] = {TOPIC: dict(profile.topic)}
        if profile.export_interval is not None:
            eg["egress"]["group_export"] = {"interval": profile.export_interval}
        ing = stack.ingress_raw(TOPIC, DEST, group="drill-ingress", delivery="exactly-once",
                                suffix="drill")
        ing["log"]["level"] = "INFO"
        # The shipped ingress defaults, not the embedded stack's short test timeouts.
        ing["ingress"].pop("sqs_wait_time", None)
        for key in ("first_segment_delay", "lost_segment_timeout", "late_segment_retries"):
            ing["ingress"]["sources"][0].pop(key, None)
        if args.mirror:
            # The low-RPO mode: egress copies each segment into the destination bucket.
            eg["metrics"]["port"] = free_port()
            eg["egress"]["mirror"] = {"bucket": ing["s3"]["bucket"], "region": ing["region"],
                                      "endpoint_url": ing["s3"]["endpoint_url"]}
        eg_path = write_toml(workdir / "egress.toml", eg)
        ing_path = write_toml(workdir / "ingress.toml", ing)
        ing_settings = validate_settings(ing)
        cfg = ing_settings.require("ingress")
        src_store = stack.store(validate_settings(eg))
        dst_store = stack.store(ing_settings)

        copier = DelayedReplication(src_store, dst_store, "data",
                                    args.replication_delay).start()
        egress = _spawn("egress", eg_path, workdir)
        procs.append(egress)
        wait_until(lambda: any(o.key.endswith("/_topic.json")
                               for o in dst_store.list("data/")), 120,
                   "_topic.json in the destination bucket", 0.2)
        procs.append(_spawn("ingress", ing_path, workdir))
        wait_until(lambda: Admin(dst_kafka).partition_count(DEST) == parts, 120,
                   "destination topic", 0.25)

        producer = AckedProducer(stack.source_kafka, TOPIC, parts, args.rate).start()
        app = SourceApp(stack.source_kafka, TOPIC, APP_GROUP).start()
        t_start = time.time()
        kill_after = rng.uniform(*profile.kill_window)
        time.sleep(kill_after)

        mirror = _mirror_metrics(eg["metrics"]["port"]) if args.mirror else {}
        # The source region dies; the decision to fail over is taken at this moment.
        os.killpg(egress.pid, signal.SIGKILL)
        os.kill(stack.broker_pid("source"), signal.SIGKILL)
        t_kill = time.time()
        copier.halt()
        def stop_clients() -> None:
            producer.stop()
            app.stop()

        stopper = threading.Thread(target=stop_clients, daemon=True)
        stopper.start()

        # 1. Ingress replays what reached the destination bucket (`checkpoints show` lag 0).
        wait_until(lambda: _lag(cfg, dst_store, dst_kafka) == 0, 180, "catch-up", 0.25)
        t_caught = time.time()
        # 2. `replicator groups sync`.
        sync = subprocess.run([str(Path(sys.executable).parent / "replicator"), "groups",
                               "sync", "--config", str(ing_path)], capture_output=True,
                              text=True, env=dict(os.environ), check=False)
        t_synced = time.time()
        (workdir / "groups-sync.txt").write_text(sync.stdout + sync.stderr)
        # 3. The consumers start on the copy.
        first = start_consumer(stack.dest_kafka, DEST, APP_GROUP, args.consumer_window)
        t_read = first.first_record_at or first.assigned_at or float("nan")
        stopper.join(30)

        acked = producer.acked
        exports = [e for e in read_exports(dst_store, "data", cfg)
                   if e.group == APP_GROUP and e.topic == TOPIC]
        exported = exports[0].offsets if exports else {}
        region_lost = _loss(acked, read_all(stack.dest_kafka, DEST, parts), t_kill)

        # The source bucket survives (or the region returns): what it held arrives.
        late = copier.drain()
        wait_until(lambda: _lag(cfg, dst_store, dst_kafka) == 0, 180, "catch-up after drain",
                   0.25)
        bucket_kept = _loss(acked, read_all(stack.dest_kafka, DEST, parts), t_kill)
        resume = _resume(first.first, acked, exported)
    finally:
        if copier is not None:
            copier.halt()
        stop_all(procs)
        stack.stop()
    errors = [line for line in (workdir / "ingress.log").read_text(errors="replace")
              .splitlines() if " ERROR " in line or line.startswith("ERROR")]
    return {
        "profile": profile.name, "replication_delay_s": args.replication_delay,
        "mirror": args.mirror,
        "rate": args.rate, "partitions": parts, "kill_after_s": round(kill_after, 2),
        "produced": producer.produced, "acked": len(acked), "failed": producer.failed,
        "source_commits": app.commits,
        "rpo_records": region_lost["missing"], "rpo_seconds": region_lost["seconds"],
        "rpo_records_bucket_kept": bucket_kept["missing"],
        "rpo_seconds_bucket_kept": bucket_kept["seconds"],
        "objects_pending_replication": len(late),
        "replication_late_s": {"p50": percentile(sorted(copier.late), 50),
                               "max": max(copier.late, default=0.0)},
        "segments_pending_replication": sum(1 for k in late if "/_" not in k),
        "holes": max(region_lost["holes"], bucket_kept["holes"]),
        "duplicates": max(region_lost["duplicates"], bucket_kept["duplicates"]),
        "rto_s": t_read - t_kill, "catch_up_s": t_caught - t_kill,
        "groups_sync_s": t_synced - t_caught, "groups_sync_rc": sync.returncode,
        "consumer_s": t_read - t_synced,
        "consumer_read_record": first.first_record_at is not None,
        "group_exported": bool(exported), "resume": resume,
        "ingress_errors": errors[:5], "started_at": t_start, "egress_mirror": mirror,
    }


def _mirror_metrics(port: int) -> dict[str, float]:
    """Egress's ``replicator_egress_mirror_*`` totals from its /metrics (just before the
    kill): copies, failures, drops, and the mean publish-to-copy seconds."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        return {"error": str(e)}  # type: ignore[dict-item]
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("replicator_egress_mirror_"):
            name = line.split("{")[0].split(" ")[0]
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    count = sums.get("replicator_egress_mirror_copy_seconds_count", 0.0)
    return {"copies": sums.get("replicator_egress_mirror_copies_total", 0.0),
            "failures": sums.get("replicator_egress_mirror_failures_total", 0.0),
            "dropped": sums.get("replicator_egress_mirror_dropped_total", 0.0),
            "copy_seconds_mean": (sums.get("replicator_egress_mirror_copy_seconds_sum", 0.0)
                                  / count if count else float("nan"))}


def _loss(acked: dict[int, Any], copy: list[tuple[int, int, int]], t_kill: float
          ) -> dict[str, Any]:
    keys = [k for _, _, k in copy]
    present = set(keys)
    missing = [s for s in acked if s not in present]
    top: dict[int, int] = {}
    for seq in present & acked.keys():
        a = acked[seq]
        top[a.partition] = max(top.get(a.partition, -1), a.offset)
    holes = sum(1 for s in missing if acked[s].offset < top.get(acked[s].partition, -1))
    first = min((acked[s].produced_at for s in missing), default=None)
    return {"missing": len(missing), "holes": holes,
            "duplicates": len(keys) - len(present),
            "seconds": 0.0 if first is None else max(0.0, t_kill - first)}


def _resume(first: dict[int, tuple[int, int]], acked: dict[int, Any],
            exported: dict[int, int]) -> dict[str, int]:
    """Per partition the consumer read: its first record's source offset against the
    group's exported source offset."""
    out = {"exact": 0, "reread": 0, "skip": 0, "no_export": 0}
    for p, (_, seq) in first.items():
        src = acked[seq].offset if seq in acked else None
        if p not in exported or src is None:
            out["no_export"] += 1
        elif src == exported[p]:
            out["exact"] += 1
        elif src < exported[p]:
            out["reread"] += 1
        else:
            out["skip"] += 1
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(runs)}
    for key in ("rpo_records", "rpo_seconds", "rpo_records_bucket_kept",
                "rpo_seconds_bucket_kept", "rto_s", "catch_up_s", "groups_sync_s",
                "consumer_s"):
        values = sorted(float(r[key]) for r in runs)
        out[key] = {"p50": percentile(values, 50), "max": values[-1] if values else None}
    out["holes"] = sum(r["holes"] for r in runs)
    out["duplicates"] = sum(r["duplicates"] for r in runs)
    out["skips"] = sum(r["resume"]["skip"] for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="defaults,low-latency")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--replication-delay", type=float, default=5.0,
                    help="seconds from an object's appearance in the source bucket to its "
                         "copy in the destination bucket")
    ap.add_argument("--mirror", action="store_true",
                    help="egress in the low-RPO mode ([egress.mirror]: each segment copied "
                         "into the destination bucket as soon as it is published), the "
                         "delayed copy kept as S3 replication's backstop")
    ap.add_argument("--rate", type=float, default=200.0, help="records per second")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--consumer-window", type=float, default=4.0,
                    help="seconds the started consumer reads after its assignment")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", type=Path, help="keep each run's logs and configs here")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not os.environ.get("KAFKA_HOME"):
        print("needs Apache Kafka: set KAFKA_HOME (e.g. ../shared/kafka)", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.profiles.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        print(f"--profiles: unknown {', '.join(unknown)} (known: {', '.join(PROFILES)})",
              file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    results: dict[str, Any] = {"replication_delay_s": args.replication_delay,
                               "mirror": args.mirror,
                               "rate": args.rate, "partitions": args.partitions,
                               "profiles": {}}
    failed: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="failover-drill-") as tmp:
        base = args.keep or Path(tmp)
        for name in names:
            runs = []
            for i in range(args.runs):
                workdir = base / f"{name}-{i}"
                workdir.mkdir(parents=True, exist_ok=True)
                try:
                    r = one_run(workdir, PROFILES[name], args, rng)
                except Exception as e:  # noqa: BLE001 - report it, keep the other runs
                    print(f"{name} run {i + 1} FAILED: {e!r}", flush=True)
                    failed.append({"profile": name, "run": i + 1, "error": repr(e)})
                    continue
                runs.append(r)
                print(f"{name} run {i + 1}: killed after {r['kill_after_s']:.1f}s; RPO "
                      f"{r['rpo_records']} records / {r['rpo_seconds']:.1f}s "
                      f"(bucket kept: {r['rpo_records_bucket_kept']} / "
                      f"{r['rpo_seconds_bucket_kept']:.1f}s); RTO {r['rto_s']:.1f}s "
                      f"(catch-up {r['catch_up_s']:.1f}, groups sync {r['groups_sync_s']:.1f}"
                      f", consumer {r['consumer_s']:.1f}); resume {r['resume']}; holes "
                      f"{r['holes']}, duplicates {r['duplicates']}; copies past their due "
                      f"time p50 {r['replication_late_s']['p50']:.2f}s max "
                      f"{r['replication_late_s']['max']:.2f}s"
                      + (f"; mirror {r['egress_mirror']}" if args.mirror else ""), flush=True)
            if runs:
                results["profiles"][name] = {"summary": summarize(runs), "runs": runs}
    results["failed_runs"] = failed
    load = os.getloadavg()[0]
    mirror = ", egress with [egress.mirror] (--mirror)" if args.mirror else ""
    print(f"\nfailover drill, replication delay {args.replication_delay:g}s{mirror}, "
          f"{args.rate:g} "
          f"records/s over {args.partitions} partitions (load {load:.1f}):")
    print(f"{'profile':<12} {'runs':>4}  {'RPO records p50/max':>20}  {'RPO s p50/max':>14}  "
          f"{'bucket kept s':>14}  {'RTO s p50/max':>14}")
    for name, res in results["profiles"].items():
        s = res["summary"]

        def pm(key: str, fmt: str, s: dict[str, Any] = s) -> str:
            return f"{s[key]['p50']:{fmt}}/{s[key]['max']:{fmt}}"

        print(f"{name:<12} {s['runs']:>4}  {pm('rpo_records', '.0f'):>20}  "
              f"{pm('rpo_seconds', '.1f'):>14}  {pm('rpo_seconds_bucket_kept', '.1f'):>14}  "
              f"{pm('rto_s', '.1f'):>14}   holes {s['holes']}, duplicates "
              f"{s['duplicates']}, skips {s['skips']}")
    if failed:
        print(f"{len(failed)} run(s) failed: {failed}")
    if args.json:
        args.json.write_text(json.dumps({**results, "load": load}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
