"""Smoke tests of the benchmark helpers' pure functions (bench/lib.py); nothing is timed."""

from __future__ import annotations

import io
import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import lib


def test_text_value_has_the_exact_size_and_compresses() -> None:
    import zlib

    v = lib.text_value(random.Random(1), 1024)
    assert len(v) == 1024
    assert len(zlib.compress(v)) < len(v) / 2


def test_percentile_is_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert lib.percentile(xs, 50) == 50.0
    assert lib.percentile(xs, 99) == 99.0
    assert lib.percentile(xs, 100) == 100.0
    assert lib.percentile([3.0], 99) == 3.0


def test_median_of_repeats() -> None:
    assert lib.median([3.0, 1.0, 2.0]) == 2.0
    assert lib.median([1.0, 2.0]) == 1.5


def test_parse_prometheus_sums_label_sets() -> None:
    text = ("# HELP x y\n# TYPE replicator_egress_messages_total counter\n"
            'replicator_egress_messages_total{partition="0"} 10.0\n'
            'replicator_egress_messages_total{partition="1"} 5.0\n'
            "replicator_egress_assigned_partitions 4\n")
    m = lib.parse_prometheus(text)
    assert m["replicator_egress_messages_total"] == 15.0
    assert m["replicator_egress_assigned_partitions"] == 4.0


def test_s3_counter_counts_operations_and_body_bytes() -> None:
    c = lib.S3Counter()
    put = SimpleNamespace(name="PutObject")
    part = SimpleNamespace(name="UploadPart")
    get = SimpleNamespace(name="GetObject")
    c._before(params={"Body": b"x" * 10}, model=put)
    c._before(params={"Body": io.BytesIO(b"y" * 7)}, model=part)
    c._before(params={"Body": memoryview(b"z" * 3)}, model=part)
    c._before(params={"Key": "data/r/t/_topic.json"}, model=get)
    c._before(params={"Key": "data/r/t/0/0/" + "0" * 20 + "-" + "0" * 19 + "9"}, model=get)
    c._after(parsed={"ContentLength": 42}, model=get)
    snap = c.snapshot()
    assert snap["calls"] == {"PutObject": 1, "UploadPart": 2, "GetObject": 2}
    assert snap["bytes_up"] == 20 and snap["bytes_down"] == 42
    assert set(c.first_call) == {"PutObject", "UploadPart", "GetObject",
                                 "GetObject:segment"}
    assert c.first_call["GetObject"] < c.first_call["GetObject:segment"]


def test_summarize_requests_groups_by_billing_class_per_gb() -> None:
    snap = {"calls": {"PutObject": 2, "UploadPart": 8, "CopyObject": 2, "GetObject": 4,
                      "DeleteObjects": 1, "ListObjectsV2": 2},
            "bytes_up": 500_000_000, "bytes_down": 0}
    s = lib.summarize_requests(snap, raw_bytes=500_000_000)   # half a GB
    assert s["put_class_per_gb"] == 28.0   # (2 + 8 + 2 + 2) * 2
    assert s["get_class_per_gb"] == 8.0
    assert s["delete_per_gb"] == 2.0
    assert s["bytes_uploaded_per_gb"] == 1_000_000_000
    assert s["request_cost_usd_per_gb"] == round((14 * 0.005 + 4 * 0.0004) / 1000 * 2, 6)


def test_rounds_pair_each_variant_with_the_baseline_of_its_own_round(tmp_path: Path) -> None:
    import run_all

    # The machine drifts: round 2 runs everything about three times as fast. Per round,
    # ours is 0.6, 0.5 and 0.5 of the bare loop: the median is 0.5, where the ratio of the
    # two medians (60 / 110) would be 0.55.
    bare = iter([100.0, 300.0, 110.0])
    ours = iter([60.0, 150.0, 55.0])
    runner = run_all.Runner(run_all.PROFILES["quick"], tmp_path, repeat=3)
    res = runner._rounds(3, [
        ("bare", "bare", lambda i: {"mb_per_s": next(bare)}),
        ("ours", "ours", lambda i: {"mb_per_s": next(ours)}),
    ], ratios={"ours": {"ratio_to_bare": "bare"}})
    assert res["ours"]["ratio_to_bare"] == 0.5
    assert res["ours"]["mb_per_s"] == 60.0 and res["bare"]["mb_per_s"] == 110.0
    assert res["ours"]["mb_per_s_runs"] == [60.0, 150.0, 55.0]
    assert "ratio_to_bare" not in res["bare"]
