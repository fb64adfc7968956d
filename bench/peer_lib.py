"""Helpers of the peer benchmark against MirrorMaker 2 (``bench/peer_mm2.py``).

Pure pieces (unit-tested in ``tests/unit/test_peer_lib.py``): the distinct text-like data,
timelines (value at a time, the time a value is reached, the 10-90 % steady-state window),
latency percentiles, ratio rows, medians of rounds, the order-insensitive per-partition
digest, the MirrorMaker 2 properties file and the classification of the moto server's
request log into S3 billing classes. Impure pieces: ``ProcSampler`` (CPU and RSS of
process trees from ``/proc`` via psutil) and ``thread_cpu`` (CPU by thread name).
"""

from __future__ import annotations

import itertools
import math
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lib import WORDS, median, percentile

Sample = tuple[float, float]
"""(wall time, value) of a timeline, in time order."""

SEQ_DIGITS = 12
"""Every generated value starts with its sequence number in this many digits and a space."""


# --- data ---------------------------------------------------------------------------


class DistinctText:
    """Text-like values, every one different.

    A value is its sequence number (``SEQ_DIGITS`` digits and a space) followed by tokens
    ``word number`` drawn from a pool of ``pool_size`` random ones (the words and the
    0-99999 numbers of ``lib.text_value``). Unlike ``lib.fill_topic``, which cycles 997
    values, no two records share their content, so a codec cannot find whole repeated
    values in its window: the compression ratio is that of the text itself.
    """

    def __init__(self, seed: int = 7, pool_size: int = 1 << 18) -> None:
        self.rng = random.Random(seed)
        rng = self.rng
        self.pool = [rng.choice(WORDS) + b" " + str(rng.randint(0, 99999)).encode() + b" "
                     for _ in range(pool_size)]
        mean = sum(map(len, self.pool)) / len(self.pool)
        self._mean = mean

    def value(self, seq: int, size: int) -> bytes:
        """Value number ``seq``: exactly ``size`` bytes (at least ``SEQ_DIGITS + 1``)."""
        head = b"%0*d " % (SEQ_DIGITS, seq)
        need = size - len(head)
        if need <= 0:
            return head[:size]
        k = int(need / self._mean) + 2
        body = b"".join(self.rng.choices(self.pool, k=k))
        while len(body) < need:
            body += b"".join(self.rng.choices(self.pool, k=4))
        return head + body[:need]


def value_seq(value: bytes | None) -> int | None:
    """The sequence number a ``DistinctText`` value starts with (``None`` if none)."""
    if not value or len(value) <= SEQ_DIGITS or value[SEQ_DIGITS:SEQ_DIGITS + 1] != b" ":
        return None
    head = value[:SEQ_DIGITS]
    return int(head) if head.isdigit() else None


# --- timelines ----------------------------------------------------------------------


def interpolate(samples: Sequence[Sample], t: float) -> float:
    """The value at time ``t``, linear between samples, clamped at both ends."""
    if not samples:
        return float("nan")
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return samples[-1][1]


def crossing(samples: Sequence[Sample], target: float) -> float | None:
    """The first time a non-decreasing timeline reaches ``target`` (linear between samples).

    ``None`` if it never does. A first sample already at the target gives its own time.
    """
    prev: Sample | None = None
    for t, v in samples:
        if v >= target:
            if prev is None or v == prev[1]:
                return t
            t0, v0 = prev
            return t0 + (t - t0) * (target - v0) / (v - v0)
        prev = (t, v)
    return None


def first_at_final(samples: Sequence[Sample]) -> float | None:
    """The time of the first sample that holds the timeline's final value."""
    if not samples:
        return None
    final = samples[-1][1]
    for t, v in samples:
        if v >= final:
            return t
    return None


@dataclass(frozen=True)
class Window:
    """The steady-state window of a copy: from ``lo`` to ``hi`` of its records arrived."""

    t_lo: float
    t_hi: float
    lo: float
    hi: float

    @property
    def seconds(self) -> float:
        return self.t_hi - self.t_lo


def steady_window(samples: Sequence[Sample], final: float, lo: float = 0.1,
                  hi: float = 0.9) -> Window | None:
    """When ``lo`` and ``hi`` of ``final`` had arrived (``None`` if never, or no time)."""
    if final <= 0:
        return None
    t_lo, t_hi = crossing(samples, lo * final), crossing(samples, hi * final)
    if t_lo is None or t_hi is None or t_hi <= t_lo:
        return None
    return Window(t_lo, t_hi, lo, hi)


def steady_rate(samples: Sequence[Sample], final: float, records: int, raw_bytes: int,
                lo: float = 0.1, hi: float = 0.9) -> dict[str, float]:
    """Records/s and MB/s between ``lo`` and ``hi`` of the arrivals.

    ``samples`` count arrived positions (end offsets); ``final`` is their value once
    everything arrived. Positions may include transaction markers (exactly-once): they
    are proportional to the records, so the share arrived is the same.
    """
    w = steady_window(samples, final, lo, hi)
    if w is None:
        return {"records_per_s": float("nan"), "mb_per_s": float("nan"),
                "window_s": float("nan")}
    share = hi - lo
    return {"records_per_s": share * records / w.seconds,
            "mb_per_s": share * raw_bytes / 1e6 / w.seconds, "window_s": w.seconds,
            "window_start": w.t_lo, "window_end": w.t_hi}


# --- statistics ---------------------------------------------------------------------


def latency_stats(lags: Iterable[float]) -> dict[str, float]:
    """p50, p90, p99, max and count of end-to-end delays (seconds)."""
    xs = sorted(lags)
    return {"p50_s": percentile(xs, 50), "p90_s": percentile(xs, 90),
            "p99_s": percentile(xs, 99), "max_s": xs[-1] if xs else float("nan"),
            "records": float(len(xs))}


def medians(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median of every numeric key over the rounds; ``runs`` keeps the per-round values."""
    if not runs:
        return {"rounds": 0}
    keys = [k for k, v in runs[0].items()
            if isinstance(v, int | float) and not isinstance(v, bool)]
    out: dict[str, Any] = {k: median(float(r[k]) for r in runs if k in r) for k in keys}
    out["rounds"] = len(runs)
    return out


@dataclass(frozen=True)
class Metric:
    """One compared figure: its key, how it prints, and which direction is better."""

    key: str
    label: str
    fmt: str
    higher_is_better: bool


PEER_METRICS = (
    Metric("records_per_s", "records/s", ",.0f", True),
    Metric("mb_per_s", "MB/s", ".1f", True),
    Metric("cpu_s_per_gb", "CPU s/GB", ".1f", False),
    Metric("cpu_us_per_record", "CPU us/record", ".2f", False),
    Metric("peak_rss_mb", "peak RSS MB", ".0f", False),
)


def round_ratios(ours: Sequence[Mapping[str, Any]], mm2: Sequence[Mapping[str, Any]],
                 keys: Iterable[str]) -> dict[str, float]:
    """Median over rounds of the per-round ratio ours/MM2 of each key.

    Round ``i`` of ours is paired with round ``i`` of MM2 (they ran back to back), so
    drift between rounds does not enter a ratio. Rounds missing either side are skipped.
    """
    out: dict[str, float] = {}
    for k in keys:
        ratios = [float(o[k]) / float(m[k]) for o, m in zip(ours, mm2, strict=False)
                  if k in o and k in m and m[k] and not math.isnan(float(o[k]))
                  and not math.isnan(float(m[k]))]
        out[k] = median(ratios)
    return out


def ratio_verdict(ratio: float, goal: float | None, higher_is_better: bool) -> str:
    """'met' / 'MISSED' against a goal for ours/MM2, '-' without one."""
    if goal is None or math.isnan(ratio):
        return "-"
    ok = ratio >= goal if higher_is_better else ratio <= goal
    return "met" if ok else "MISSED"


def render_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned first column, right-aligned others, a rule under the header."""
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                             for j, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


# --- completeness -------------------------------------------------------------------


@dataclass
class MultisetDigest:
    """Per partition: the record count and the sum of 128-bit record digests.

    Order-insensitive (a copy may interleave differently and still be complete), but a
    missing, extra or changed record changes it. Built from the same record identity as
    ``replicator.ops.verify`` (key, value, headers, timestamp).
    """

    counts: Counter[int] = field(default_factory=Counter)
    sums: dict[int, int] = field(default_factory=dict)

    def add(self, partition: int, record_digest: bytes) -> None:
        self.counts[partition] += 1
        self.sums[partition] = (self.sums.get(partition, 0)
                                + int.from_bytes(record_digest, "big")) % (1 << 128)

    def differences(self, other: MultisetDigest) -> list[str]:
        """What differs, per partition (empty: the same multiset of records)."""
        out = []
        for p in sorted(set(self.counts) | set(other.counts)):
            a, b = self.counts.get(p, 0), other.counts.get(p, 0)
            if a != b:
                out.append(f"partition {p}: {a} records in the source, {b} in the copy")
            elif self.sums.get(p) != other.sums.get(p):
                out.append(f"partition {p}: same count ({a}) but different records")
        return out


def record_digest(key: bytes | None, value: bytes | None,
                  headers: Sequence[tuple[str, bytes | None]] | None, timestamp: int) -> bytes:
    """A 16-byte record identity (same fields as ``replicator.ops.verify.digest``)."""
    from replicator.ops.verify import digest

    return digest((key, value, tuple(headers or ()), timestamp))


# --- MirrorMaker 2 ------------------------------------------------------------------


def mm2_properties(*, source_alias: str, target_alias: str, source_bootstrap: str,
                   target_bootstrap: str, topic: str, tasks: int, compression: str,
                   compression_level: int | None) -> str:
    """A dedicated-mode MirrorMaker 2 configuration replicating ``topic`` one way.

    Defaults everywhere except: one flow (``source->target``) replicating exactly
    ``topic`` (DefaultReplicationPolicy: the copy is ``{source_alias}.{topic}``),
    ``tasks.max``, replication factor 1 (single-broker clusters), and the target
    producer's ``acks=all`` (already the Connect default) and compression.
    """
    lines = [
        f"clusters = {source_alias}, {target_alias}",
        f"{source_alias}.bootstrap.servers = {source_bootstrap}",
        f"{target_alias}.bootstrap.servers = {target_bootstrap}",
        f"{source_alias}->{target_alias}.enabled = true",
        # A regex, in a properties file (where a backslash is an escape): dots as [.]
        f"{source_alias}->{target_alias}.topics = {topic.replace('.', '[.]')}",
        f"{target_alias}->{source_alias}.enabled = false",
        f"tasks.max = {tasks}",
        "replication.factor = 1",
        "checkpoints.topic.replication.factor = 1",
        "heartbeats.topic.replication.factor = 1",
        "offset-syncs.topic.replication.factor = 1",
        "offset.storage.replication.factor = 1",
        "status.storage.replication.factor = 1",
        "config.storage.replication.factor = 1",
        f"{target_alias}.producer.acks = all",
        f"{target_alias}.producer.compression.type = {compression}",
    ]
    if compression_level is not None and compression in ("zstd", "gzip", "lz4"):
        lines.append(f"{target_alias}.producer.compression.{compression}.level = "
                     f"{compression_level}")
    return "\n".join(lines) + "\n"


# --- process sampling ---------------------------------------------------------------


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_rss(pid: int) -> tuple[float, int]:
    """(user + system CPU seconds, RSS bytes) of a process and its descendants."""
    import psutil

    cpu, rss = 0.0, 0
    for p in _tree(pid):
        try:
            t = p.cpu_times()
            cpu += t.user + t.system
            rss += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return cpu, rss


class ProcSampler:
    """Samples CPU seconds and RSS of named process trees every ``interval`` seconds.

    A component is added with ``watch(name, pid)`` (before or while running); its
    timelines are ``cpu[name]`` and ``rss[name]``. The last CPU value of a process that
    exited is kept (its CPU does not vanish from later look-ups).
    """

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.pids: dict[str, int] = {}
        self.cpu: dict[str, list[Sample]] = {}
        self.rss: dict[str, list[Sample]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="proc-sampler")

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self.pids[name] = pid
            self.cpu.setdefault(name, [])
            self.rss.setdefault(name, [])
        self._sample_one(name, pid, time.time())

    def _sample_one(self, name: str, pid: int, now: float) -> None:
        cpu, rss = tree_cpu_rss(pid)
        with self._lock:
            series = self.cpu[name]
            if series and cpu < series[-1][1]:
                cpu = series[-1][1]   # exited: keep what it had used
            series.append((now, cpu))
            self.rss[name].append((now, float(rss)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.time()
            with self._lock:
                items = list(self.pids.items())
            for name, pid in items:
                self._sample_one(name, pid, now)

    def sample_now(self) -> None:
        """One extra sample of every component (e.g. right at a measured moment)."""
        now = time.time()
        with self._lock:
            items = list(self.pids.items())
        for name, pid in items:
            self._sample_one(name, pid, now)

    def __enter__(self) -> ProcSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_between(self, name: str, t0: float, t1: float) -> float:
        with self._lock:
            s = list(self.cpu.get(name, []))
        return interpolate(s, t1) - interpolate(s, t0) if s else 0.0

    def peak_rss(self, names: Sequence[str], t0: float = 0.0, t1: float = float("inf")
                 ) -> float:
        """Peak of the summed RSS of ``names`` (sampled at the same instants)."""
        with self._lock:
            series = [list(self.rss.get(n, [])) for n in names]
        by_time: dict[float, float] = {}
        for s in series:
            for t, v in s:
                if t0 <= t <= t1:
                    by_time[t] = by_time.get(t, 0.0) + v
        return max(by_time.values(), default=0.0)


_THREAD_GROUPS = (("rdk:", "librdkafka"), ("python", "python"))


def task_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of a process: ``{tid: (name, seconds)}``."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return out


def named_thread_cpu(start: Mapping[int, tuple[str, float]],
                     end: Mapping[int, tuple[str, float]],
                     names: Mapping[int, str]) -> dict[str, float]:
    """CPU seconds between two ``task_cpu`` snapshots, by thread name.

    ``names`` maps thread ids to Python thread names (py-spy's ``--threads`` frames);
    other threads keep their OS name (librdkafka's ``rdk:*``). Digits are folded to
    ``N`` so per-partition threads add up.
    """
    out: dict[str, float] = {}
    for tid, (os_name, cpu) in end.items():
        before = start.get(tid, (os_name, 0.0))[1]
        name = names.get(tid) or os_name
        group = re.sub(r"\d+", "N", name)
        out[group] = out.get(group, 0.0) + cpu - before
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a live process's threads, grouped by thread name.

    librdkafka names its threads ``rdk:main``, ``rdk:broker...``; a Python 3.11 process
    leaves its own threads named after the executable. Threads that already exited are
    not listed (their CPU is in the process total): ``exited`` is the difference.
    """
    import os

    out: dict[str, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / ticks
            group = next((g for prefix, g in _THREAD_GROUPS if name.startswith(prefix)), name)
            out[group] = out.get(group, 0.0) + cpu
            total += cpu
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        proc_total = (int(fields[11]) + int(fields[12])) / ticks
    except OSError:
        return {}
    out["exited"] = max(0.0, proc_total - total)
    return dict(out)


def raw_consumer(brokers: str, group: str, overrides: dict[str, Any] | None = None) -> Any:
    """The bare client with the consumer defaults our services use: load generators and
    readers of the benchmark must not run through our wrappers (they are what is measured)."""
    import confluent_kafka as ck

    from replicator.core.kafka import CONSUMER_DEFAULTS, PRODUCER_ONLY, client_config
    from replicator.core.settings import KafkaSettings

    return ck.Consumer(client_config(KafkaSettings(brokers=brokers),
                                     {**CONSUMER_DEFAULTS, "group.id": group}, overrides,
                                     drop=PRODUCER_ONLY))


def raw_producer(brokers: str, overrides: dict[str, Any] | None = None) -> Any:
    """The bare client with our producer defaults (idempotent, acks=all)."""
    import confluent_kafka as ck

    from replicator.core.kafka import CONSUMER_ONLY, PRODUCER_DEFAULTS, client_config
    from replicator.core.settings import KafkaSettings

    return ck.Producer(client_config(KafkaSettings(brokers=brokers), PRODUCER_DEFAULTS,
                                     overrides, drop=CONSUMER_ONLY))
