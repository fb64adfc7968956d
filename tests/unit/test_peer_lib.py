"""The pure helpers of the MirrorMaker 2 peer benchmark (bench/peer_lib.py, bench/flame.py).

Nothing here starts a process: timelines, windows, percentiles, ratios, digests, the MM2
properties file, moto's request log and py-spy's collapsed stacks.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import flame
import peer_lib as pl


def test_distinct_values_have_the_size_the_sequence_and_no_repeats() -> None:
    gen = pl.DistinctText(seed=1, pool_size=1000)
    values = [gen.value(i, 1024) for i in range(2000)]
    assert {len(v) for v in values} == {1024}
    assert len(set(values)) == len(values)
    assert [pl.value_seq(v) for v in values[:3]] == [0, 1, 2]
    small = gen.value(123, 100)
    assert len(small) == 100 and pl.value_seq(small) == 123
    assert pl.value_seq(b"device-00001") is None
    assert pl.value_seq(None) is None


def test_distinct_values_compress_like_text_but_not_like_repeats() -> None:
    import zlib

    gen = pl.DistinctText(seed=2)
    block = b"".join(gen.value(i, 1024) for i in range(200))
    ratio = len(block) / len(zlib.compress(block, 1))
    assert 1.5 < ratio < 5.0   # text-like; a block of 997-cycled values would be far higher


def test_interpolate_and_crossing_are_linear_between_samples() -> None:
    s = [(0.0, 0.0), (1.0, 10.0), (2.0, 10.0), (3.0, 40.0)]
    assert pl.interpolate(s, 0.5) == 5.0
    assert pl.interpolate(s, -1.0) == 0.0 and pl.interpolate(s, 9.0) == 40.0
    assert pl.crossing(s, 5.0) == 0.5
    assert pl.crossing(s, 10.0) == 1.0          # reached at a sample, not on the flat part
    assert pl.crossing(s, 25.0) == 2.5
    assert pl.crossing(s, 41.0) is None
    assert pl.crossing([(5.0, 3.0)], 1.0) == 5.0
    assert pl.first_at_final(s) == 3.0
    assert pl.first_at_final([(1.0, 2.0), (2.0, 5.0), (3.0, 5.0)]) == 2.0


def test_steady_window_leaves_out_the_first_and_last_tenth() -> None:
    # 100 records: nothing for 2 s (start-up), then 10 per second, a slow tail.
    s = [(0.0, 0.0), (2.0, 0.0)] + [(2.0 + i, 10.0 * i) for i in range(1, 10)] + [(20.0, 100.0)]
    w = pl.steady_window(s, 100.0)
    assert w is not None
    assert w.t_lo == pytest.approx(3.0) and w.t_hi == pytest.approx(11.0)
    r = pl.steady_rate(s, 100.0, records=100, raw_bytes=100_000)
    assert r["records_per_s"] == pytest.approx(10.0)       # the tail does not count
    assert r["mb_per_s"] == pytest.approx(0.01)
    assert pl.steady_window(s, 0.0) is None
    assert math.isnan(pl.steady_rate([(0.0, 0.0)], 100.0, 100, 1)["records_per_s"])


def test_latency_stats_are_nearest_rank() -> None:
    st = pl.latency_stats(float(i) for i in range(100, 0, -1))
    assert (st["p50_s"], st["p99_s"], st["max_s"], st["records"]) == (50.0, 99.0, 100.0, 100.0)
    assert math.isnan(pl.latency_stats([])["p99_s"])


def test_medians_and_paired_round_ratios() -> None:
    ours = [{"records_per_s": 300.0, "cpu_s_per_gb": 10.0},
            {"records_per_s": 100.0, "cpu_s_per_gb": 10.0},
            {"records_per_s": 500.0, "cpu_s_per_gb": 30.0}]
    mm2 = [{"records_per_s": 100.0, "cpu_s_per_gb": 20.0},
           {"records_per_s": 50.0, "cpu_s_per_gb": 20.0},
           {"records_per_s": 100.0, "cpu_s_per_gb": 30.0}]
    med = pl.medians(ours)
    assert med["records_per_s"] == 300.0 and med["rounds"] == 3
    ratios = pl.round_ratios(ours, mm2, ["records_per_s", "cpu_s_per_gb"])
    # per round: 3, 2, 5 -> 3 (not 300/100 of the separate medians, which is also 3 here
    # by chance) and 0.5, 0.5, 1.0 -> 0.5
    assert ratios == {"records_per_s": 3.0, "cpu_s_per_gb": 0.5}
    assert pl.round_ratios([{"x": 1.0}], [{"x": 0.0}], ["x"])["x"] != 1.0   # nan: no pair
    assert pl.ratio_verdict(5.2, 5.0, True) == "met"
    assert pl.ratio_verdict(0.25, 0.2, False) == "MISSED"
    assert pl.ratio_verdict(0.25, None, False) == "-"
    assert pl.ratio_verdict(float("nan"), 0.2, False) == "-"


def test_render_table_aligns_columns() -> None:
    out = pl.render_table([("a", "bb"), ("long", "1")])
    assert out == ["a     bb", "----  --", "long   1"]


def test_multiset_digest_ignores_order_but_not_content() -> None:
    a, b, c = pl.MultisetDigest(), pl.MultisetDigest(), pl.MultisetDigest()
    for d in (b"x" * 16, b"y" * 16):
        a.add(0, d)
    for d in (b"y" * 16, b"x" * 16):
        b.add(0, d)
    c.add(0, b"x" * 16)
    c.add(0, b"x" * 16)
    assert a.differences(b) == []
    assert c.differences(a) == ["partition 0: same count (2) but different records"]
    c.add(1, b"z" * 16)
    assert "partition 1: 0 records in the source, 1 in the copy" in a.differences(c)


def test_record_digest_matches_verify() -> None:
    from replicator.ops.verify import digest

    assert pl.record_digest(b"k", b"v", None, 5) == digest((b"k", b"v", (), 5))
    assert pl.record_digest(b"k", b"v", [("h", None)], 5) != pl.record_digest(b"k", b"v",
                                                                                None, 5)


def test_mm2_properties_name_one_flow_the_codec_and_acks() -> None:
    text = pl.mm2_properties(source_alias="sa", target_alias="tb", source_bootstrap="h:1",
                             target_bootstrap="h:2", topic="peer.1KiB-4p.ab12", tasks=2,
                             compression="zstd", compression_level=1)
    props = dict(line.split(" = ", 1) for line in text.splitlines())
    assert props["clusters"] == "sa, tb"
    assert props["sa->tb.enabled"] == "true" and props["tb->sa.enabled"] == "false"
    assert props["sa->tb.topics"] == "peer[.]1KiB-4p[.]ab12"
    assert "\\" not in text   # a backslash would be eaten by the properties format
    assert props["tasks.max"] == "2"
    assert props["tb.producer.acks"] == "all"
    assert props["tb.producer.compression.type"] == "zstd"
    assert props["tb.producer.compression.zstd.level"] == "1"
    none = pl.mm2_properties(source_alias="sa", target_alias="tb", source_bootstrap="h:1",
                             target_bootstrap="h:2", topic="t", tasks=4, compression="none",
                             compression_level=None)
    assert "level" not in none


RAW = """\
thread (1): MainThread;run (egress/controller.py:219);_dispatch (egress/controller.py:250);\
append (egress/partition_writer.py:240) 6
thread (1): MainThread;run (egress/controller.py:219);consume (cimpl) 3
thread (2): egress-upload_0;_drain (egress/partition_writer.py:140);0x7f00 (libzstd.so) 1
"""


def test_flame_shares_and_threads() -> None:
    stacks = flame.parse(RAW.splitlines())
    assert stacks[2][0][-1] == "[libzstd.so]"
    assert stacks[0][0][1] == "run (egress/controller.py)"   # line numbers merged
    total, incl, own = flame.shares(stacks)
    assert total == 10
    assert incl["run (egress/controller.py)"] == pytest.approx(0.9)
    assert own["append (egress/partition_writer.py)"] == pytest.approx(0.6)
    assert own["[libzstd.so]"] == pytest.approx(0.1)
    assert flame.by_thread(stacks) == {"MainThread": pytest.approx(0.9),
                                       "egress-upload_N": pytest.approx(0.1)}
    svg = flame.render_svg(stacks, "t")
    assert svg.startswith("<svg") and "append (egress/partition_writer.py)" in svg


def test_thread_cpu_is_attributed_to_python_thread_names() -> None:
    stacks = flame.parse(["thread (101): replay-us-east-1:t:3;f (a.py:1) 5",
                          "thread (102): egress-upload_0;g (b.py:2) 1"])
    names = flame.thread_names(stacks)
    assert names == {101: "replay-us-east-1:t:3", 102: "egress-upload_0"}
    start = {101: ("replicator-ingr", 1.0), 103: ("rdk:broker1", 0.5)}
    end = {101: ("replicator-ingr", 4.0), 102: ("replicator-ingr", 2.0),
           103: ("rdk:broker1", 1.5), 104: ("rdk:broker2", 0.25)}
    assert pl.named_thread_cpu(start, end, names) == {
        "replay-us-east-N:t:N": 3.0, "egress-upload_N": 2.0, "rdk:brokerN": 1.25}


def test_flame_busy_drops_waiting_threads() -> None:
    stacks = flame.parse([
        # Waiting: the innermost named frame is a wait (the unresolved libc frame below is
        # the system call).
        "thread (1): MainThread;turn (egress/poll_loop.py:1);cnd_timedwait (libc.so.6);"
        "pthread_cond_timedwait (libc.so.6);0x7f01 (libc.so.6) 7",
        "thread (2): egress-upload_0;_worker (t.py:1);PyThread_acquire_lock_timed "
        "(libpython3.11.so.1.0);0x7f02 (libc.so.6) 5",
        # Running: zstd, and a memcpy inside libc under Arrow.
        "thread (2): egress-upload_0;_write (p.py:1);ZSTD_compressBlock_fast (libarrow.so) 2",
        "thread (1): MainThread;take (egress/columns.py:1);"
        "arrow::PoolBuffer::Reserve (libarrow.so);0x7f03 (libc.so.6) 3",
    ])
    running = flame.busy(stacks)
    assert [n for _, n in running] == [2, 3]
    assert flame.by_thread(running) == {"MainThread": pytest.approx(0.6),
                                        "egress-upload_N": pytest.approx(0.4)}
