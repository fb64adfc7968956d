"""The byte-rate limits held over a minute: ``[egress]`` and ``[ingress] max_bytes_per_second``.

    .venv/bin/python bench/throttle.py [--egress-rate 2MB] [--ingress-rate 1MB]
                                       [--seconds 60] [--warmup 5] [--kafka tansu|apache]
                                       [--delivery exactly-once|at-least-once] [--json out]

On the embedded stack (two brokers, moto) started here: a 4-partition topic is filled with
about 1.5 times what the egress limit lets through in the measured window (1 KiB text-like
values, keyed), so the limit, never the data, is what holds the process back. Then:

1. ``Egress`` in this process with ``[egress] max_bytes_per_second`` reads it into moto S3
   (segments closed by age, 5 s); ``replicator_egress_bytes_total`` is sampled every
   second.
2. The segments are synced to the destination bucket (S3 events to SQS) and ``Ingress``
   in this process replays them with ``[ingress] max_bytes_per_second``; produced bytes are
   the records produced (``replicator_ingress_messages_produced_total``) times the raw
   record size (all records are the same size).

For each: the mean rate over ``--seconds`` after ``--warmup`` (start-up and group join
left out) against the limit, the lowest and highest 10-second window, the time the
process reports throttled, and this process's RSS (baseline before the service starts,
peak while it runs). Prints a table and, with ``--json``, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lib import MB, BenchStack, RssSampler, fill_topic, wait_until

from replicator.core.units import format_size, parse_size

PARTITIONS = 4
VALUE = 1024
KEY = len(b"device-00000")
RECORD = VALUE + KEY


def sample(read: Callable[[], float], seconds: float, warmup: float
           ) -> list[tuple[float, float]]:
    """``(time since the first byte, bytes)`` once a second from the first byte for
    ``warmup + seconds`` seconds.
    """
    wait_until(lambda: read() > 0, 120, "the first bytes", 0.01)
    t0 = time.monotonic()
    out = [(0.0, read())]
    while (now := time.monotonic() - t0) < warmup + seconds:
        time.sleep(min(1.0, warmup + seconds - now))
        out.append((time.monotonic() - t0, read()))
    return out


def summarize(samples: list[tuple[float, float]], rate: int, warmup: float
              ) -> dict[str, Any]:
    """Mean rate after ``warmup`` and the extreme 10-second windows, against ``rate``."""
    after = [(t, b) for t, b in samples if t >= warmup]
    (t0, b0), (t1, b1) = after[0], after[-1]
    mean = (b1 - b0) / (t1 - t0)
    windows = []
    for i, (ta, ba) in enumerate(after):
        later = [(t, b) for t, b in after[i:] if t - ta >= 10.0]
        if later:
            tb, bb = later[0]
            windows.append((bb - ba) / (tb - ta))
    return {"limit": rate, "seconds": t1 - t0, "bytes": b1 - b0, "mean_rate": mean,
            "mean_vs_limit_pct": 100.0 * (mean / rate - 1.0),
            "window_10s_min": min(windows), "window_10s_max": max(windows)}


def run_egress(stack: BenchStack, topic: str, bucket: str, rate: int, seconds: float,
               warmup: float) -> dict[str, Any]:
    from egress.controller import Egress

    settings = stack.egress_settings(topic, group=f"bench-thr-{uuid.uuid4().hex[:6]}",
                                     bucket=bucket, segment_age="5s",
                                     extra={"max_bytes_per_second": rate})
    eg = Egress(settings, store=stack.store(settings))
    with RssSampler(interval=0.05) as rss:
        eg.start()
        runner = threading.Thread(target=eg.run, daemon=True)
        runner.start()
        samples = sample(lambda: eg.metrics.total("egress_bytes_total"), seconds, warmup)
        throttled = eg.metrics.total("egress_throttled_seconds_total")
        eg.stop()
        runner.join(120)
    eg.close()
    return {**summarize(samples, rate, warmup), "throttled_seconds": throttled,
            "rss_baseline": rss.baseline, "rss_peak": rss.peak,
            "budget": settings.require("egress").max_buffered_bytes}


def run_ingress(stack: BenchStack, topic: str, rate: int, delivery: str, seconds: float,
                warmup: float) -> dict[str, Any]:
    from ingress.controller import Ingress

    suffix = uuid.uuid4().hex[:6]
    settings = stack.ingress_settings(topic, f"{topic}.copy.{suffix}",
                                      group=f"bench-thr-in-{suffix}", delivery=delivery,
                                      suffix=suffix, extra={"max_bytes_per_second": rate})
    ing = Ingress(settings, store=stack.store(settings))
    with RssSampler(interval=0.05) as rss:
        ing.start()
        runner = threading.Thread(target=ing.run, daemon=True)
        runner.start()
        samples = sample(lambda: RECORD * ing.metrics.total("ingress_messages_produced_total"),
                         seconds, warmup)
        throttled = ing.metrics.total("ingress_throttled_seconds_total")
        ing.stop()
        runner.join(120)
    ing.close()
    cfg = settings.require("ingress")
    return {**summarize(samples, rate, warmup), "throttled_seconds": throttled,
            "rss_baseline": rss.baseline, "rss_peak": rss.peak, "delivery": delivery,
            "budget": cfg.max_bytes_in_flight}


def sync(stack: BenchStack, topic: str, bucket: str) -> None:
    from replicator.devstack.configs import DEST_BUCKET
    from replicator.ops.sync import BucketSync

    src = stack.store(stack.egress_settings(topic, group="x", bucket=bucket))
    dst = stack.store(stack.egress_settings(topic, group="x", bucket=DEST_BUCKET))
    report = BucketSync(src, dst, "data").run_once()
    print(f"synced {len(report.copied)} objects ({report.bytes_copied / MB:.1f} MB) to "
          f"{DEST_BUCKET}", flush=True)


def line(name: str, r: dict[str, Any]) -> str:
    return (f"{name:<8} limit {r['limit'] / MB:6.2f} MB/s  mean {r['mean_rate'] / MB:6.3f} MB/s "
            f"({r['mean_vs_limit_pct']:+.1f} %) over {r['seconds']:.0f} s, 10 s windows "
            f"{r['window_10s_min'] / MB:.3f}-{r['window_10s_max'] / MB:.3f} MB/s, throttled "
            f"{r['throttled_seconds']:.0f} s, RSS {format_size(r['rss_baseline'])} -> peak "
            f"{format_size(r['rss_peak'])} (budget {format_size(r['budget'])})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--egress-rate", default="2MB")
    ap.add_argument("--ingress-rate", default="1MB")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--kafka", default="tansu")
    ap.add_argument("--delivery", default="exactly-once")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    eg_rate, in_rate = parse_size(a.egress_rate), parse_size(a.ingress_rate)
    records = int(1.5 * eg_rate * (a.seconds + a.warmup + 10) / RECORD)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-throttle-") as tmp:
        stack = BenchStack(Path(tmp), a.kafka)
        try:
            topic = f"bench.throttle.{uuid.uuid4().hex[:6]}"
            from replicator.core.kafka import Admin
            from replicator.core.settings import KafkaSettings

            kafka = KafkaSettings(brokers=stack.source_kafka)
            Admin(kafka).create_topic(topic, PARTITIONS)
            raw = fill_topic(kafka, topic, PARTITIONS, records, VALUE,
                             timestamp_ms=int(time.time() * 1000))
            print(f"filled {topic}: {records:,} records, {raw / MB:.1f} MB", flush=True)
            bucket = f"bench-thr-{uuid.uuid4().hex[:6]}"
            stack.create_bucket(bucket)
            results["egress"] = run_egress(stack, topic, bucket, eg_rate, a.seconds,
                                           a.warmup)
            print(line("egress", results["egress"]), flush=True)
            sync(stack, topic, bucket)
            results["ingress"] = run_ingress(stack, topic, in_rate, a.delivery, a.seconds,
                                             a.warmup)
            print(line("ingress", results["ingress"]), flush=True)
        finally:
            stack.stop()
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
