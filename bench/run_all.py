"""Every benchmark in one run, against the raw clients, on one embedded stack.

    .venv/bin/python bench/run_all.py --quick      # about 3 minutes
    .venv/bin/python bench/run_all.py --full       # bigger data, Spark, 1 GiB segment
    .venv/bin/python bench/run_all.py --quick --only egress,ingress
    KAFKA_HOME=../shared/kafka .venv/bin/python bench/run_all.py --full --kafka apache

With KAFKA_HOME set, the run ends with ``peer_mm2.py`` (versus MirrorMaker 2; ``--quick``
with --quick), unless ``--only`` leaves the ``peer`` stage out.

Starts its own stack (``LocalStack``: a source and a destination broker, Tansu by default
or Apache Kafka with ``--kafka apache``; moto S3+SQS), then:

1. egress: bare ``consume`` loop vs ``Egress`` (discarding store: zstd, lz4; moto S3);
2. ingress: bare produce loop (same producer settings) vs ``Ingress``, exactly-once and
   at-least-once, over the segments egress wrote (synced to the destination bucket);
3. compaction: bare pyarrow read+write vs inline compaction (and Spark with ``--full``),
   reusing ``bench/compaction_bench.py``;
4. end-to-end lag at a steady 10 MB/s with ``max_segment_age = 1s`` (``measure_lag.py``);
5. memory: ``bench/egress_memory.py`` (1/16/64/256 partitions) and ingress RSS replaying
   one big segment in a child process;
6. cost: S3 requests by type and bytes per GB (egress, compaction, ingress), counted with
   botocore event hooks on the stores' clients (the measured code path is unchanged);
7. scale: 1 and 2 ``replicator-egress`` processes in one group.

Each timed variant is repeated (``--repeat``) and the median is reported: the machine has
2 cores shared with other work. Prints a table and writes ``bench/results/<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from lib import MB, BenchStack, S3Counter, fill_topic, median, summarize_requests

HERE = Path(__file__).parent
STAGES = ("egress", "ingress", "compaction", "lag", "memory", "cost", "scale")
# Versus MirrorMaker 2 (peer_mm2.py, its own two Apache Kafka clusters): part of the default
# run when KAFKA_HOME names a distribution with MirrorMaker 2.
PEER = "peer"

PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"records": 250_000, "partitions": 4, "value_size": 1024, "repeat": 2,
              "egress_repeat": 3,
              "segment_size": "16MiB", "compaction_segments": 8, "compaction_records": 5000,
              "spark": False, "lag_seconds": 20, "lag_warmup": 5,
              "mem_partitions": "1,16,64,256", "mem_budgets": "64MiB", "mem_total": "96MiB",
              "ingress_big": 128 * 1024**2, "scale_records": 200_000, "mem_timeout": 240},
    "full": {"records": 600_000, "partitions": 4, "value_size": 1024, "repeat": 3,
             "egress_repeat": 3,
             "segment_size": "32MiB", "compaction_segments": 16, "compaction_records": 15000,
             "spark": True, "lag_seconds": 60, "lag_warmup": 5,
             "mem_partitions": "1,16,64,256", "mem_budgets": "64MiB,256MiB",
             "mem_total": "384MiB", "ingress_big": 1024**3, "scale_records": 500_000,
             "mem_timeout": 1200},
}

TARGETS = {
    "egress_mb_per_core": 50.0, "egress_ratio": 0.5, "ingress_mb_per_core": 50.0,
    "ingress_ratio": 0.5, "ingress_eos_within": 0.2, "compaction_ratio": 0.7,
    "e2e_p99_s": 5.0,
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Runner:
    def __init__(self, profile: dict[str, Any], workdir: Path, repeat: int,
                 kafka: str = "tansu") -> None:
        self.p = profile
        self.kafka = kafka
        self.work = workdir
        self.repeat = repeat
        self.eos_variant: dict[str, Any] = {}
        """``--eos-variant``: ingress settings of an extra exactly-once run per round."""
        self.results: dict[str, Any] = {}
        self.stack: BenchStack | None = None
        self.topic = ""
        self.raw = 0
        self.eg_bucket = ""

    # --- helpers ----------------------------------------------------------------------

    def _median_of(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
        out: dict[str, Any] = {k: median(r[k] for r in runs) for k in keys}
        out["runs"] = len(runs)
        out["mb_per_s_runs"] = [round(r["mb_per_s"], 1) for r in runs if "mb_per_s" in r]
        return out

    def _repeat(self, what: str, fn: Callable[[int], dict[str, Any]], n: int | None = None
                ) -> dict[str, Any]:
        """One variant, ``n`` runs (default ``--repeat``), medians."""
        return self._rounds(n or self.repeat, [("only", what, fn)], {})["only"]

    def _rounds(self, n: int, variants: list[tuple[str, str, Callable[[int], dict[str, Any]]]],
                ratios: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
        """Run every variant once per round, ``n`` rounds, and take medians.

        ``ratios[variant][name]`` names the variant's baseline for ratio ``name``. Ratios
        are computed within a round, where the variant and its baseline ran back to back,
        and the median of those paired ratios is reported: the shared machine drifts
        between rounds (a broker's state grows, neighbours come and go), which
        a ratio of two separate medians would mix in.
        """
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k, _, _ in variants}
        for i in range(n):
            done: dict[str, dict[str, Any]] = {}
            for k, what, fn in variants:
                r = fn(i)
                pairs = ratios.get(k, {})
                for name, b in pairs.items():
                    r[name] = r["mb_per_s"] / done[b]["mb_per_s"]
                    if r.get("cpu_s_per_gb") and done[b].get("cpu_s_per_gb"):
                        # CPU per GB against the baseline's, same round (> 1: costlier).
                        r[f"cpu_{name}"] = r["cpu_s_per_gb"] / done[b]["cpu_s_per_gb"]
                done[k] = r
                runs[k].append(r)
                log(f"  {what} #{i + 1}: {r.get('mb_per_s', 0):.1f} MB/s, "
                    f"{r.get('mb_per_cpu_s', 0):.1f} MB/CPU-s"
                    + "".join(f", {name} {r[name]:.2f}" for name in pairs))
        return {k: self._median_of(v) for k, v in runs.items()}

    # --- stages -----------------------------------------------------------------------

    def setup(self) -> None:
        from replicator.core.kafka import Admin
        from replicator.core.settings import KafkaSettings

        t0 = time.perf_counter()
        self.stack = BenchStack(self.work, self.kafka)
        log(f"stack up in {time.perf_counter() - t0:.1f}s")
        self.topic = f"bench.events.{uuid.uuid4().hex[:6]}"
        kafka = KafkaSettings(brokers=self.stack.source_kafka)
        Admin(kafka).create_topic(self.topic, self.p["partitions"])
        t0 = time.perf_counter()
        self.raw = fill_topic(kafka, self.topic, self.p["partitions"], self.p["records"],
                              self.p["value_size"])
        log(f"filled {self.topic}: {self.p['records']:,} records, {self.raw / MB:.1f} MB raw "
            f"in {time.perf_counter() - t0:.1f}s")

    def egress(self) -> None:
        from measure_egress import bare_consume, bare_consume_encode, egress_inproc

        st, p = self.stack, self.p
        assert st is not None
        counters: list[S3Counter] = []

        def s3_run(i: int) -> dict[str, Any]:
            bucket = f"bench-eg-{uuid.uuid4().hex[:6]}"
            st.create_bucket(bucket)
            counters.append(S3Counter())
            r = egress_inproc(st, self.topic, p["records"], self.raw, store_kind="s3",
                              counter=counters[-1], bucket=bucket,
                              segment_size=p["segment_size"])
            if i == 0:
                self.eg_bucket = bucket
            return r

        def ours(store_kind: str, compression: str | None = None
                 ) -> Callable[[int], dict[str, Any]]:
            return lambda i: egress_inproc(st, self.topic, p["records"], self.raw,
                                           store_kind=store_kind,
                                           segment_size=p["segment_size"],
                                           compression=compression)

        res = self._rounds(max(self.repeat, p["egress_repeat"]), [
            ("bare_consume", "bare consume", lambda i: bare_consume(
                st.source_kafka, self.topic, p["partitions"], p["records"])),
            ("bare_consume_encode", "bare consume + Parquet encode", lambda i:
                bare_consume_encode(st.source_kafka, self.topic, p["partitions"],
                                    p["records"])),
            ("egress_discard", "egress (discarding store)", ours("discard")),
            # The codec is a setting (format.compression): lz4 shows what zstd costs.
            ("egress_discard_lz4", "egress (discarding store, lz4)", ours("discard", "lz4")),
            ("egress_s3", "egress (moto S3)", s3_run),
        ], ratios={"bare_consume_encode": {"ratio_to_bare": "bare_consume"},
                   **{k: {"ratio_to_bare": "bare_consume",
                          "ratio_to_consume_encode": "bare_consume_encode"}
                      for k in ("egress_discard", "egress_discard_lz4", "egress_s3")}})
        base = res["bare_consume"]
        for k in ("bare_consume_encode", "egress_discard", "egress_discard_lz4",
                  "egress_s3"):
            res[k]["cpu_ratio_to_bare"] = base["cpu_s_per_gb"] / res[k]["cpu_s_per_gb"]
        res["egress_s3"]["s3_requests"] = summarize_requests(counters[0].snapshot(), self.raw)
        for k in ("egress_s3", "egress_discard", "egress_discard_lz4"):
            if res[k].get("stored_bytes"):
                res[k]["compression_ratio"] = self.raw / res[k]["stored_bytes"]
        self.results["egress"] = res

    def _sync_to_destination(self) -> None:
        from replicator.devstack.configs import DEST_BUCKET
        from replicator.ops.sync import BucketSync

        st = self.stack
        assert st is not None
        if not self.eg_bucket:   # --only ingress: write the segments first
            self.eg_bucket = f"bench-eg-{uuid.uuid4().hex[:6]}"
            st.create_bucket(self.eg_bucket)
            from measure_egress import egress_inproc
            egress_inproc(st, self.topic, self.p["records"], self.raw, store_kind="s3",
                          bucket=self.eg_bucket, segment_size=self.p["segment_size"])
        src = st.store(st.egress_settings(self.topic, group="x", bucket=self.eg_bucket))
        dst = st.store(st.egress_settings(self.topic, group="x", bucket=DEST_BUCKET))
        report = BucketSync(src, dst, "data").run_once()
        log(f"synced {len(report.copied)} objects ({report.bytes_copied / MB:.1f} MB) "
            f"to {DEST_BUCKET}")

    def ingress(self) -> None:
        from measure_ingress import (
            bare_produce,
            bare_read_produce,
            ingress_inproc,
            read_segments,
        )

        from replicator.devstack.configs import DEST_BUCKET

        st, p = self.stack, self.p
        assert st is not None
        self._sync_to_destination()
        dst = st.store(st.egress_settings(self.topic, group="x", bucket=DEST_BUCKET))
        data = read_segments(dst, "us-east-1", self.topic, p["partitions"])
        counters: list[S3Counter] = []

        def ours(d: str, extra: dict[str, Any] | None = None
                 ) -> Callable[[int], dict[str, Any]]:
            def run(i: int) -> dict[str, Any]:
                counters.append(S3Counter())
                return ingress_inproc(st, self.topic, p["partitions"], p["records"], self.raw,
                                      d, counters[-1], extra=extra)
            return run

        # --eos-variant: one more exactly-once run per round with other ingress settings,
        # right after the default one (compared with the same round's at-least-once).
        variant = [("ingress_exactly-once_variant",
                    f"ingress exactly-once {self.eos_variant}",
                    ours("exactly-once", self.eos_variant))] if self.eos_variant else []

        def bare(d: str) -> Callable[[int], dict[str, Any]]:
            return lambda i: bare_produce(st.dest_kafka, f"bench.bare.{d}.{uuid.uuid4().hex[:6]}",
                                          data, d)

        # Each mode runs right after its own bare loop; "eos_vs_alo" pairs the two modes
        # of one round.
        res: dict[str, Any] = self._rounds(self.repeat, [
            ("bare_read_produce", "bare S3 read + decode + produce", lambda i:
                bare_read_produce(st.s3, DEST_BUCKET, "us-east-1", self.topic, st.dest_kafka,
                                  f"bench.bare.read.{uuid.uuid4().hex[:6]}", p["partitions"])),
            ("bare_produce_at-least-once", "bare produce at-least-once", bare("at-least-once")),
            ("ingress_at-least-once", "ingress at-least-once", ours("at-least-once")),
            ("bare_produce_exactly-once", "bare produce exactly-once", bare("exactly-once")),
            ("ingress_exactly-once", "ingress exactly-once", ours("exactly-once")),
            *variant,
        ], ratios={"ingress_exactly-once_variant": {"ratio_to_alo": "ingress_at-least-once",
                                                    "ratio_to_eos": "ingress_exactly-once"},
                   "ingress_at-least-once": {
                       "ratio_to_bare": "bare_produce_at-least-once",
                       "ratio_to_read_produce": "bare_read_produce"},
                   "ingress_exactly-once": {
                       "ratio_to_bare": "bare_produce_exactly-once",
                       "ratio_to_read_produce": "bare_read_produce",
                       "ratio_to_alo": "ingress_at-least-once"}})
        for d in ("at-least-once", "exactly-once"):
            r, b = res[f"ingress_{d}"], res[f"bare_produce_{d}"]
            r["cpu_ratio_to_bare"] = b["cpu_s_per_gb"] / r["cpu_s_per_gb"]
        res["eos_vs_alo"] = res["ingress_exactly-once"]["ratio_to_alo"]
        res["s3_requests"] = summarize_requests(counters[0].snapshot(), self.raw)
        self.results["ingress"] = res

    def compaction(self) -> None:
        import compaction_bench as cb

        from replicator.core.s3 import S3ObjectStore

        st, p = self.stack, self.p
        assert st is not None
        endpoint = st.s3
        client = st.stack.s3_client("us-east-1")
        seed_bucket = f"cseed-{uuid.uuid4().hex[:6]}"
        st.create_bucket(seed_bucket)
        seed_store = S3ObjectStore.from_settings(cb.settings_for(endpoint, seed_bucket,
                                                                 "inline"))
        keys, raw = cb.seed(seed_store, p["compaction_segments"], p["compaction_records"],
                            p["value_size"])
        stored = sum(seed_store.head(k.to_key()).size for k in keys)
        time.sleep(1.1)   # min_segment_age = 1s
        res: dict[str, Any] = {"segments": len(keys), "raw_mb": raw / MB,
                               "stored_mb": stored / MB}

        def bare(i: int) -> dict[str, Any]:
            b = cb.clone(client, seed_bucket, keys, f"cbare-{uuid.uuid4().hex[:6]}")
            s = cb.bare_pyarrow(endpoint, b, keys, 10000)
            return {"seconds": s, "mb_per_s": raw / MB / s}

        def inline(i: int) -> dict[str, Any]:
            b = cb.clone(client, seed_bucket, keys, f"cinl-{uuid.uuid4().hex[:6]}")
            s = cb.run_compaction(cb.settings_for(endpoint, b, "inline"))[0]
            return {"seconds": s, "mb_per_s": raw / MB / s}

        res["bare_pyarrow"] = self._repeat("bare pyarrow read+write", bare)
        res["inline"] = self._repeat("compaction inline", inline)
        res["inline"]["ratio_to_bare"] = res["inline"]["mb_per_s"] / res["bare_pyarrow"][
            "mb_per_s"]
        if p["spark"]:
            from pyspark.sql import SparkSession

            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            t0 = time.perf_counter()
            spark = (SparkSession.builder.master("local[2]")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.driver.host", "127.0.0.1").getOrCreate())
            start = time.perf_counter() - t0

            def spark_run(i: int) -> dict[str, Any]:
                b = cb.clone(client, seed_bucket, keys, f"cspk-{uuid.uuid4().hex[:6]}")
                s = cb.run_compaction(cb.settings_for(endpoint, b, "local[2]"))[0]
                return {"seconds": s, "mb_per_s": raw / MB / s}

            first = spark_run(0)   # warms the Python workers; reported, not in the median
            res["spark_local2"] = self._repeat("compaction spark local[2]", spark_run)
            res["spark_local2"].update(session_start_s=start, first_run_s=first["seconds"],
                                       ratio_to_bare=res["spark_local2"]["mb_per_s"]
                                       / res["bare_pyarrow"]["mb_per_s"])
            spark.stop()
        self.results["compaction"] = res

    def lag(self) -> None:
        from measure_lag import e2e_lag

        st = self.stack
        assert st is not None
        runs = []
        for i in range(max(1, self.repeat - 1)):
            r = e2e_lag(st, self.work, seconds=self.p["lag_seconds"],
                        warmup=self.p["lag_warmup"], value_size=self.p["value_size"])
            log(f"  e2e lag #{i + 1}: p50 {r['p50_s']:.2f}s p99 {r['p99_s']:.2f}s "
                f"max {r['max_s']:.2f}s at {r['rate_mb_per_s']:.1f} MB/s")
            runs.append(r)
        out = self._median_of(runs)
        out["p99_s_runs"] = [round(r["p99_s"], 2) for r in runs]
        self.results["lag"] = out

    def memory(self) -> None:
        from measure_ingress import ingress_memory

        st, p = self.stack, self.p
        assert st is not None
        res: dict[str, Any] = {}
        self.results["memory"] = res
        r = ingress_memory(st, self.work, p["ingress_big"], p["value_size"])
        log(f"  ingress replaying a {r['raw_bytes'] / 2**20:.0f} MiB segment: peak RSS "
            f"{r['peak_rss'] / 2**20:.0f} MiB (baseline {r['baseline_rss'] / 2**20:.0f} MiB)")
        res["ingress_big_segment"] = r
        # bench/egress_memory.py starts its own broker (of the same kind) + moto.
        out = self.work / "egress_memory.json"
        t0 = time.perf_counter()
        run_bounded([sys.executable, str(HERE / "egress_memory.py"), "--partitions",
                     p["mem_partitions"], "--budgets", p["mem_budgets"], "--total",
                     p["mem_total"], "--json", str(out), "--kafka", self.kafka],
                    p["mem_timeout"])
        res["egress"] = json.loads(out.read_text())
        log(f"  egress memory in {time.perf_counter() - t0:.0f}s")

    def cost(self) -> None:
        """Compaction's requests on the segments the egress S3 run wrote, + totals per GB."""
        from compaction.controller import Compaction
        from replicator.core.keys import SegmentKey
        from replicator.core.settings import validate_settings

        st = self.stack
        assert st is not None
        if not self.eg_bucket:
            self.egress()
        eg = self.results["egress"]["egress_s3"]["s3_requests"]
        raw = st.raw_config("compaction")
        raw["s3"]["bucket"] = self.eg_bucket
        raw["metrics"]["port"] = 0
        raw["compaction"].update(spark_master="inline", parallelism=2)
        raw["compaction"]["topics"] = {self.topic: {
            "min_level": 0, "max_level": 0, "min_segment_age": "1s", "min_segment_count": 2,
            "min_segment_size": 1, "max_segment_count": 1000, "max_segment_size": "4GiB",
            "batch_size": 10_000, "delete": True}}
        settings = validate_settings(raw)
        counter = S3Counter()
        store = st.store(settings, counter)

        def segments() -> tuple[int, int]:
            infos = [i for i in store.list(f"data/us-east-1/{self.topic}/")
                     if SegmentKey.try_parse(i.key)]
            return len(infos), sum(i.size for i in infos)

        before = segments()
        counter.reset()
        c = Compaction(settings, store=store, serve_metrics=False,
                       clock=lambda: datetime.now(UTC) + timedelta(hours=1))
        c.start()
        report = c.run_once()
        c.close()
        after = segments()
        comp = summarize_requests(counter.snapshot(), self.raw)
        total = {k: round(eg[k] + comp[k], 6) for k in ("put_class_per_gb", "get_class_per_gb",
                                                         "delete_per_gb",
                                                         "bytes_uploaded_per_gb",
                                                         "request_cost_usd_per_gb")}
        self.results["cost"] = {
            "segment_size_limit": self.p["segment_size"],
            "egress_per_gb": eg, "compaction_per_gb": comp,
            "egress_plus_compaction_per_gb": total,
            "ingress_per_gb": self.results.get("ingress", {}).get("s3_requests"),
            "compaction_outcome": report.outcome,
            "segments_before": before[0], "segments_after": after[0],
            "stored_bytes_before": before[1], "stored_bytes_after": after[1],
            "compression_ratio_before": self.raw / before[1] if before[1] else None,
            "compression_ratio_after": self.raw / after[1] if after[1] else None,
        }

    def scale(self) -> None:
        from measure_egress import egress_processes

        st, p = self.stack, self.p
        assert st is not None
        res: dict[str, Any] = {}
        for n in (1, 2):
            res[f"{n}_process"] = self._repeat(
                f"{n} egress process(es)", lambda i, n=n: egress_processes(  # type: ignore[misc]
                    st, self.work, f"bench.scale.{n}.{uuid.uuid4().hex[:6]}", p["partitions"],
                    p["scale_records"], p["value_size"], n), n=max(1, self.repeat - 1))
        res["speedup"] = res["2_process"]["mb_per_s"] / res["1_process"]["mb_per_s"]
        self.results["scale"] = res


def run_bounded(cmd: list[str], timeout: float) -> None:
    """Run ``cmd``; past ``timeout`` interrupt it (SIGINT: its ``finally`` stops the servers
    it started) and then stop whatever it started that is still running, by PID."""
    import signal

    import psutil

    proc = subprocess.Popen(cmd, stdout=sys.stderr)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for child in family:
            if child.is_running():
                child.terminate()
        psutil.wait_procs([c for c in family if c.is_running()], timeout=10)
        raise TimeoutError(f"{Path(cmd[1]).name} did not finish within {timeout:.0f}s") from None
    if rc:
        raise subprocess.CalledProcessError(rc, cmd)


# --- report -----------------------------------------------------------------------------


def _f(v: Any, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _ok(cond: bool | None) -> str:
    return "-" if cond is None else ("met" if cond else "MISSED")


def render(results: dict[str, Any], meta: dict[str, Any]) -> str:
    brokers = "Apache Kafka" if meta.get("kafka") == "apache" else "Tansu"
    lines = [f"kafka-s3-replicator benchmarks ({meta['profile']}, {brokers} brokers, "
             f"{meta['records']:,} records x {meta['value_size']} B text-like values, "
             f"{meta['partitions']} partitions, {meta['cpus']} cores shared, medians of "
             f"{meta['repeat']} runs)", ""]
    lines_after: list[str] = []
    rows: list[tuple[str, ...]] = [("measurement", "records/s", "MB/s", "MB/CPU-s",
                                    "CPU s/GB", "ratio", "target", "")]
    e = results.get("egress")
    if e:
        for name, k in (("bare consume loop", "bare_consume"),
                        ("bare consume + Parquet/zstd encode", "bare_consume_encode"),
                        ("egress -> discarding store", "egress_discard"),
                        ("egress -> discarding store, lz4", "egress_discard_lz4"),
                        ("egress -> moto S3", "egress_s3")):
            r = e[k]
            ratio = r.get("ratio_to_bare")
            egress = k.startswith("egress")
            target = ">=50 MB/CPU-s, ratio>=0.5" if egress else ""
            ok = None if not egress else (ratio >= TARGETS["egress_ratio"] and
                                             r["mb_per_cpu_s"] >= TARGETS["egress_mb_per_core"])
            rows.append((name, _f(r["records_per_s"], ",.0f"), _f(r["mb_per_s"]),
                         _f(r["mb_per_cpu_s"]), _f(r["cpu_s_per_gb"]), _f(ratio, ".2f"),
                         target, _ok(ok)))
        zstd, lz4 = e["egress_discard"], e["egress_discard_lz4"]
        lines_after.append(f"compression (raw/stored): zstd "
                           f"{_f(zstd.get('compression_ratio'), '.2f')}, "
                           f"lz4 {_f(lz4.get('compression_ratio'), '.2f')}")
        lines_after.append("egress / (bare consume + encode): discarding store "
                           f"{e['egress_discard']['ratio_to_consume_encode']:.2f}, S3 "
                           f"{e['egress_s3']['ratio_to_consume_encode']:.2f}")
        s3 = e["egress_s3"]
        if s3.get("moto_cpu_seconds"):
            lines_after.append(
                f"egress -> moto S3: moto itself used {s3['moto_cpu_seconds']:.1f} CPU-s of "
                f"the same {meta['cpus']} cores in a {s3['seconds']:.1f} s run "
                f"({s3['moto_cpu_seconds'] / s3['seconds'] / meta['cpus']:.0%} of the machine; "
                "S3 is a remote service in production)")
    i = results.get("ingress")
    if i:
        for d in ("at-least-once", "exactly-once"):
            b, r = i[f"bare_produce_{d}"], i[f"ingress_{d}"]
            if d == "at-least-once":
                rr = i["bare_read_produce"]
                rows.append(("bare S3 read + decode + produce", _f(rr["records_per_s"], ",.0f"),
                             _f(rr["mb_per_s"]), _f(rr["mb_per_cpu_s"]), _f(rr["cpu_s_per_gb"]),
                             "", "", ""))
            rows.append((f"bare produce ({d})", _f(b["records_per_s"], ",.0f"),
                         _f(b["mb_per_s"]), _f(b["mb_per_cpu_s"]), _f(b["cpu_s_per_gb"]),
                         "", "", ""))
            ok = r["ratio_to_bare"] >= TARGETS["ingress_ratio"] and \
                r["mb_per_cpu_s"] >= TARGETS["ingress_mb_per_core"]
            if d == "exactly-once":
                ok = i["eos_vs_alo"] >= 1 - TARGETS["ingress_eos_within"]
            rows.append((f"ingress ({d})", _f(r["records_per_s"], ",.0f"), _f(r["mb_per_s"]),
                         _f(r["mb_per_cpu_s"]), _f(r["cpu_s_per_gb"]),
                         _f(r["ratio_to_bare"], ".2f"),
                         ">=50 MB/CPU-s, ratio>=0.5" if d == "at-least-once"
                         else f"within 20% of ALO ({i['eos_vs_alo']:.2f})", _ok(ok)))
    c = results.get("compaction")
    if c:
        rows.append(("bare pyarrow read+write", "", _f(c["bare_pyarrow"]["mb_per_s"]), "", "",
                     "", "", ""))
        for name, k in (("compaction inline", "inline"), ("compaction spark local[2]",
                                                          "spark_local2")):
            if k in c:
                r = c[k]
                rows.append((name, "", _f(r["mb_per_s"]), "", "", _f(r["ratio_to_bare"], ".2f"),
                             ">=0.7", _ok(r["ratio_to_bare"] >= TARGETS["compaction_ratio"])))
    s = results.get("scale")
    if s:
        for n in (1, 2):
            r = s[f"{n}_process"]
            rows.append((f"{n} egress process(es), one group", _f(r["records_per_s"], ",.0f"),
                         _f(r["mb_per_s"]), _f(r["mb_per_cpu_s"]), _f(r["cpu_s_per_gb"]),
                         _f(r["mb_per_s"] / s["1_process"]["mb_per_s"], ".2f"), "", ""))
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    for n, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                               for j, (c, w) in enumerate(zip(r, widths, strict=True))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    if i:
        lines_after.append("ingress / (bare S3 read + decode + produce): at-least-once "
                           f"{i['ingress_at-least-once']['ratio_to_read_produce']:.2f}, "
                           f"exactly-once {i['ingress_exactly-once']['ratio_to_read_produce']:.2f}")
    lines += lines_after
    if c and "spark_local2" in c:
        sp = c["spark_local2"]
        lines.append(f"\nSpark session start {sp['session_start_s']:.1f}s and first job "
                     f"{sp['first_run_s']:.1f}s (excluded from the rate)")
    if c:
        lines.append(f"compaction input: {c['segments']} segments, {c['raw_mb']:.0f} MB raw, "
                     f"{c['stored_mb']:.0f} MB stored")
    lg = results.get("lag")
    if lg:
        lines.append(f"\nend-to-end lag at {lg['rate_mb_per_s']:.1f} MB/s, max_segment_age 1s, "
                     f"exactly-once: p50 {lg['p50_s']:.2f}s, p90 {lg['p90_s']:.2f}s, "
                     f"p99 {lg['p99_s']:.2f}s (runs {lg['p99_s_runs']}), max {lg['max_s']:.2f}s"
                     f"  [target p99 <= 5s: {_ok(lg['p99_s'] <= TARGETS['e2e_p99_s'])}]")
    m = results.get("memory")
    if m:
        lines.append("\nmemory")
        for r in m.get("egress", []):
            growth = r["peak_rss"] - r["baseline_rss"]
            lines.append(f"  egress {r['partitions']:>3} partitions, max_buffered_bytes "
                         f"{r['budget'] / 2**20:.0f} MiB: RSS {r['baseline_rss'] / 2**20:.0f} "
                         f"-> {r['peak_rss'] / 2**20:.0f} MiB (growth {growth / 2**20:.0f} MiB "
                         f"= {growth / r['budget']:.2f} x budget; held max "
                         f"{r['peak_held'] / 2**20:.0f} MiB)")
        r = m.get("ingress_big_segment")
        if r:
            lines.append(f"  ingress replaying one {r['raw_bytes'] / 2**20:.0f} MiB segment "
                         f"({r['stored_bytes'] / 2**20:.0f} MiB stored): RSS "
                         f"{r['baseline_rss'] / 2**20:.0f} -> {r['peak_rss'] / 2**20:.0f} MiB "
                         f"in {r['seconds']:.1f}s")
    co = results.get("cost")
    if co:
        eg, cp, tot = co["egress_per_gb"], co["compaction_per_gb"], \
            co["egress_plus_compaction_per_gb"]
        lines.append(f"\nS3 cost per GB of raw records (segments up to {co['segment_size_limit']})")
        lines.append(f"  egress:      {eg['calls_per_gb']}")
        lines.append(f"  compaction:  {cp['calls_per_gb']}")
        if co.get("ingress_per_gb"):
            lines.append(f"  ingress:     {co['ingress_per_gb']['calls_per_gb']}")
        lines.append(f"  PUT-class/GB: egress {eg['put_class_per_gb']}, +compaction "
                     f"{tot['put_class_per_gb']}; GET-class/GB: egress {eg['get_class_per_gb']}"
                     f", +compaction {tot['get_class_per_gb']}; DELETE/GB +compaction "
                     f"{tot['delete_per_gb']}")
        lines.append(f"  bytes uploaded per GB: egress {eg['bytes_uploaded_per_gb'] / MB:.0f} "
                     f"MB, +compaction {tot['bytes_uploaded_per_gb'] / MB:.0f} MB; request "
                     f"cost ${eg['request_cost_usd_per_gb']:.5f} -> "
                     f"${tot['request_cost_usd_per_gb']:.5f} per GB")
        lines.append(f"  segments {co['segments_before']} -> {co['segments_after']}; compression "
                     f"(raw/stored) {_f(co['compression_ratio_before'], '.2f')} -> "
                     f"{_f(co['compression_ratio_after'], '.2f')}")
    if s:
        lines.append(f"\nscale: 2 processes / 1 process = {s['speedup']:.2f} (steady 20-80 % "
                     f"window); first record to all durable: "
                     f"{s['1_process']['seconds_to_durable']:.1f}s / "
                     f"{s['2_process']['seconds_to_durable']:.1f}s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small data (default)")
    mode.add_argument("--full", action="store_true", help="bigger data, Spark, 1 GiB segment")
    ap.add_argument("--only", default=None,
                    help=f"comma-separated stages of {', '.join((*STAGES, PEER))} (default: "
                         f"all; {PEER} only when KAFKA_HOME is set)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per timed variant")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--kafka", choices=("tansu", "apache"), default="tansu",
                    help="brokers of the stack: tansu (embedded, default) or apache (Apache "
                         "Kafka from $KAFKA_HOME)")
    ap.add_argument("--eos-variant", nargs="*", default=[], metavar="KEY=VALUE",
                    help="ingress: one more exactly-once run per round with these [ingress] "
                         "settings (e.g. transaction_linger=20ms)")
    args = ap.parse_args(argv)
    if args.kafka == "apache" and not os.environ.get("KAFKA_HOME"):
        ap.error("--kafka apache needs KAFKA_HOME (an Apache Kafka distribution, e.g. "
                 "../shared/kafka)")
    name = "full" if args.full else "quick"
    profile = dict(PROFILES[name])
    repeat = args.repeat or profile["repeat"]
    default = [*STAGES, PEER] if os.environ.get("KAFKA_HOME") else list(STAGES)
    stages = [s for s in args.only.split(",") if s] if args.only else default
    for s in stages:
        if s not in (*STAGES, PEER):
            ap.error(f"unknown stage {s!r}; stages: {', '.join((*STAGES, PEER))}")
    if PEER in stages and not os.environ.get("KAFKA_HOME"):
        ap.error(f"stage {PEER} needs KAFKA_HOME (Apache Kafka with MirrorMaker 2)")
    work = Path(tempfile.mkdtemp(prefix="bench-all-"))
    runner = Runner(profile, work, repeat, args.kafka)
    runner.eos_variant = dict(kv.split("=", 1) for kv in args.eos_variant)
    failures: dict[str, str] = {}
    t_all = time.perf_counter()
    try:
        runner.setup()
        for s in STAGES:
            if s not in stages:
                continue
            log(f"== {s}")
            t0 = time.perf_counter()
            try:
                getattr(runner, s)()
            except Exception as e:  # noqa: BLE001 - a failing stage is reported, not fatal
                failures[s] = f"{type(e).__name__}: {e}"
                log(f"{s} FAILED: {failures[s]}\n{traceback.format_exc()}")
            log(f"   {s} took {time.perf_counter() - t0:.0f}s")
    finally:
        if runner.stack is not None:
            runner.stack.stop()
    meta = {"profile": name, "kafka": args.kafka, "repeat": repeat, "cpus": os.cpu_count(),
            "python": platform.python_version(), "stages": stages,
            "command": "bench/run_all.py " + " ".join(argv if argv is not None else
                                                       sys.argv[1:]),
            "started": datetime.now(UTC).isoformat(), "failures": failures,
            "seconds": time.perf_counter() - t_all, "raw_bytes": runner.raw,
            **{k: profile[k] for k in ("records", "partitions", "value_size")}}
    print(render(runner.results, meta))
    if failures:
        print("\nFAILED stages: " + "; ".join(f"{k}: {v}" for k, v in failures.items()))
    if PEER in stages:
        # Its own clusters and processes, after ours are down; its table follows ours.
        log(f"== {PEER}")
        cmd = [sys.executable, str(HERE / "peer_mm2.py")] + ([] if args.full else ["--quick"])
        if subprocess.run(cmd, check=False).returncode != 0:
            failures[PEER] = "peer_mm2.py failed (its output is above)"
            print(f"\nFAILED stages: {PEER}")
    print(f"\ntotal {time.perf_counter() - t_all:.0f}s")
    out = args.json or HERE / "results" / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": runner.results}, indent=2,
                              default=str))
    print(f"results: {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
