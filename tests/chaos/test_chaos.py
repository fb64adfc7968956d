"""Randomized fault rounds against the real processes; lost / duplicated / reordered per round.

Each round (seeded: ``CHAOS_SEED`` + round number, printed first) produces a few thousand
sample records into the source topic and, within an 8-second fault window, does some of:
SIGKILL egress and/or either ingress at random moments (restarted after a random downtime),
SIGSTOP a broker for 2-5 s (a network partition), inject S3 faults through the proxy (5xx,
503 SlowDown, connection resets, stalls, slow responses, replies lost after the request took
effect, full outages), and duplicate / delay / reorder SQS events. Then everything is
restarted, the destination must catch up, and both destination topics are compared with the
source record by record (``replicator.ops.verify``).

The brokers are Apache Kafka when ``KAFKA_HOME`` is set (what CI runs), else Tansu. On
Apache Kafka exactly-once is measured directly: a read_committed reader of the destination
must see every record exactly once (duplicates = 0). On Tansu, which shows aborted
transactions' records and sometimes holds committed ones back (RELIABILITY.md), duplicates
shaped like a re-produced aborted transaction are allowed and records only a
read_uncommitted reader sees are counted as "held", not lost.

``CHAOS_SEED`` (default 20261121) fixes the rounds' plans (thread interleavings still vary);
``CHAOS_ROUNDS`` (default 6) is an upper bound and ``CHAOS_BUDGET`` (default 160 s) the time
the rounds may take: no round starts that would probably end past it, so the default run fits
the 4-minute CI budget on a loaded 2-core machine (at least one round always runs). For a long
run: ``CHAOS_ROUNDS=40 CHAOS_BUDGET=3600``. ``CHAOS_REPORT`` names a JSON file for the figures
(default: ``chaos-report.json`` next to the logs, whose directory is printed).

Longer than 400 lines: the round plans, their execution and the per-round verdicts belong
together; the processes and faults themselves are in ``harness.py`` and ``fault_proxy.py``.
"""

from __future__ import annotations

import functools
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from replicator.devstack.sample import sample_records
from replicator.ops.verify import classify
from tests.chaos.fault_proxy import KINDS, NO_FAULTS, FaultProfile, Trigger
from tests.chaos.harness import (
    BATCH_SIZE,
    PARTITIONS,
    TOPIC,
    ChaosStack,
    Managed,
    SourceProducer,
    checkpoint_history,
    checkpoint_offsets,
    duplicate_runs,
    metric_values,
    missing_ranges,
    partition_digests,
    split_duplicates,
)

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "6"))
BUDGET = float(os.environ.get("CHAOS_BUDGET", "160"))
SEED = int(os.environ.get("CHAOS_SEED", "20261121"))
WINDOW = 8.0
CATCH_UP_TIMEOUT = 150.0
KILL_POINTS = {
    "random": "at a random moment",
    "upload": "while it uploads a segment (its PUT to temp/ never arrives)",
    "copy": "between copy and commit (its copy to the final key took effect)",
    "producing": "twice: then again while it replays the backlog (between produce and "
                 "checkpoint)",
}
EGRESS_KILLS = ("random", "upload", "copy")
INGRESS_KILLS = ("producing", "random")
# A kill point that is not reached within this time falls back to a plain kill.
KILL_POINT_WAIT = 3.0


@dataclass
class RoundPlan:
    seed: int
    records: int
    profile: FaultProfile
    outage: tuple[float, float] | None
    kills: list[tuple[float, str, float, str]]
    freeze: tuple[float, str, float] | None
    sqs_chaos: bool

    def describe(self) -> str:
        rates = ", ".join(f"{k} {v:.0%}" for k, v in self.profile.rates.items() if v)
        parts = [f"{self.records} records", f"S3 faults [{rates or 'none'}]"]
        if self.outage:
            parts.append(f"S3 outage {self.outage[1]:.1f}s at {self.outage[0]:.1f}s")
        for t, name, down, how in self.kills:
            parts.append(f"SIGKILL {name} {KILL_POINTS[how]} from {t:.1f}s (down {down:.1f}s)")
        if self.freeze:
            parts.append(f"SIGSTOP {self.freeze[1]} broker {self.freeze[2]:.1f}s at "
                         f"{self.freeze[0]:.1f}s")
        if self.sqs_chaos:
            parts.append("SQS events duplicated/delayed/reordered")
        return "; ".join(parts)


def plan_round(seed: int, targets: list[str], round_no: int) -> RoundPlan:
    rnd = random.Random(seed)
    rates = {k: (rnd.uniform(0.04, 0.15) if rnd.random() < 0.6 else 0.0) for k in KINDS}
    rates["slow"] = rnd.uniform(0.0, 0.1)
    rates["stall"] = min(rates["stall"], 0.02)
    rates["lost_reply"] = min(rates["lost_reply"], 0.05)
    profile = FaultProfile(rates, stall_seconds=rnd.uniform(1.0, 3.0),
                           slow_seconds=rnd.uniform(0.1, 0.8))
    outage = (rnd.uniform(0, WINDOW - 3), rnd.uniform(1, 4)) if rnd.random() < 0.4 else None
    # Kill points rotate with the round number, so every few rounds cover each of them.
    kills = [(rnd.uniform(0.5, WINDOW - 2), name, rnd.uniform(0.2, 3.0),
              (EGRESS_KILLS if name == "egress" else INGRESS_KILLS)[
                  (round_no + i) % (3 if name == "egress" else 2)])
             for i, name in enumerate(rnd.sample(targets, rnd.randint(1, len(targets))))]
    freeze = ((rnd.uniform(0, WINDOW - 4), rnd.choice(["source", "destination"]),
               rnd.uniform(2, 5)) if rnd.random() < 0.6 else None)
    return RoundPlan(seed, rnd.randint(2000, 4000), profile, outage, sorted(kills), freeze,
                     rnd.random() < 0.7)


@dataclass
class LaneResult:
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    dup_transaction_shaped: int = 0
    dup_other: int = 0
    destination_records: int = 0
    held: int = 0


@dataclass
class RoundResult:
    round: int
    seed: int
    plan: str
    seconds: float = 0.0
    catch_up_seconds: float = 0.0
    s3_faults: dict[str, int] = field(default_factory=dict)
    s3_requests: int = 0
    sqs_duplicated: int = 0
    sqs_delayed: int = 0
    lanes: dict[str, LaneResult] = field(default_factory=dict)
    unexpected_exits: dict[str, list[int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosStack]:
    keep = os.environ.get("CHAOS_DIR")  # logs and report kept there (pytest prunes tmp dirs)
    workdir = Path(keep) if keep else tmp_path_factory.mktemp("chaos")
    workdir.mkdir(parents=True, exist_ok=True)
    s = ChaosStack(workdir).start()
    try:
        yield s
    finally:
        codes = s.close()
        print(f"chaos: exit codes on SIGTERM {codes}; logs in {s.dir / 'logs'}")


def run_events(events: list[tuple[float, Callable[[], None]]], t0: float) -> None:
    for t, fn in sorted(events, key=lambda e: e[0]):
        delay = t0 + t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        fn()


def arm_kill(stack: ChaosStack, proc: Managed, how: str) -> None:
    """SIGKILL ``proc`` at its next kill point ``how`` (or plainly, if not reached soon)."""
    assert stack.proxy is not None
    proxy = stack.proxy
    if how == "random":
        proc.sigkill()
        return
    def kill_at_point() -> None:
        stack.kill_points[f"{proc.name}: {how}"] += 1
        proc.sigkill()

    if how in ("upload", "copy"):
        trigger = (Trigger("PUT", "/chaos-source/temp/", kill_at_point) if how == "upload"
                   else Trigger("PUT", "/chaos-source/data/", kill_at_point, after_forward=True,
                                header="x-amz-copy-source"))
        proxy.arm(trigger)

        def fallback() -> None:
            time.sleep(KILL_POINT_WAIT)
            if proxy.disarm() is trigger:
                proc.sigkill()

        threading.Thread(target=fallback, daemon=True).start()
        return

    def kill_during_recovery() -> None:
        # Kill, let a backlog of segments build up, restart, and kill again while the new
        # process replays that backlog: right after its produced counter first moves (one
        # batch of a segment is done, the next ones are being produced). That lands between
        # produce and checkpoint far more often than a random kill.
        proc.sigkill()
        time.sleep(rnd_delay(how, 2.0, 4.0))
        proc.ensure_running()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if produced_total(proc):
                time.sleep(rnd_delay(how, 0.0, 0.02))
                kill_at_point()
                return
            time.sleep(0.005)
        proc.sigkill()

    threading.Thread(target=kill_during_recovery, daemon=True).start()


_delays = random.Random(0)


def rnd_delay(how: str, low: float, high: float) -> float:
    return _delays.uniform(low, high)


def produced_total(proc: Managed) -> float | None:
    text = proc.metrics()
    if text is None:
        return None
    return sum(metric_values(text, "replicator_ingress_messages_produced_total").values())


def wait_caught_up(stack: ChaosStack, targets: dict[int, int], timeout: float) -> float:
    t0 = time.monotonic()
    while True:
        for p in stack.processes():
            p.ensure_running()
        behind = {}
        for lane in stack.lanes:
            offsets = checkpoint_offsets(lane.process.metrics())
            lag = {p: last - offsets.get(p, -1) for p, last in targets.items()
                   if offsets.get(p, -1) < last}
            if lag:
                behind[lane.mode] = lag
        if not behind:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            tails = "\n\n".join(f"--- {p.name}\n{p.log_tail()}" for p in stack.processes())
            pytest.fail(f"not caught up within {timeout:.0f}s: behind {behind}\n{tails}")
        time.sleep(0.5)


def verify_lanes(stack: ChaosStack, result: RoundResult) -> None:
    source = {p: partition_digests(stack.source_kafka, TOPIC, p) for p in range(PARTITIONS)}
    for lane in stack.lanes:
        cps = checkpoint_history(stack.dest_kafka, lane.checkpoint_topic) \
            if lane.mode == "exactly-once" else {}
        lr = LaneResult()
        for p in range(PARTITIONS):
            dst = partition_digests(stack.dest_kafka, lane.dest_topic, p)
            lost, dup, reordered = classify(source[p], dst)
            lr.lost += lost
            lr.duplicated += dup
            lr.reordered += reordered
            lr.destination_records += len(dst)
            if lost:
                uncommitted = partition_digests(stack.dest_kafka, lane.dest_topic, p,
                                                "read_uncommitted")
                if stack.kind == "tansu":
                    # Tansu sometimes holds read_committed readers at a transaction whose
                    # commit already returned (its records are in the log): "held", not
                    # lost. A real broker moves the last stable offset with the commit.
                    really_lost = classify(source[p], uncommitted)[0]
                    lr.held += lost - really_lost
                    lr.lost += really_lost - lost
                result.notes.append(
                    f"{lane.mode} {lane.dest_topic}[{p}]: {lost} lost, missing source offsets "
                    f"{missing_ranges(source[p], dst)[:5]}; read_committed sees {len(dst)} "
                    f"records, read_uncommitted {len(uncommitted)} (missing there: "
                    f"{missing_ranges(source[p], uncommitted)[:5]}); checkpoints "
                    f"{checkpoint_offsets(lane.process.metrics()).get(p)}")
            if lane.mode == "exactly-once" and dup:
                txn, other = split_duplicates(duplicate_runs(source[p], dst), cps.get(p, []),
                                              BATCH_SIZE)
                lr.dup_transaction_shaped += txn
                lr.dup_other += other
        # Figures are cumulative over the topic: a round reports what it added.
        prev = dict(lane.totals)
        lane.totals.update(lost=lr.lost, duplicated=lr.duplicated, reordered=lr.reordered)
        result.lanes[lane.mode] = LaneResult(
            lr.lost - prev["lost"], lr.duplicated - prev["duplicated"],
            lr.reordered - prev["reordered"],
            lr.dup_transaction_shaped - prev.get("dup_transaction_shaped", 0),
            lr.dup_other - prev.get("dup_other", 0), lr.destination_records, lr.held)
        lane.totals["held_at_verification"] = lane.totals.get("held_at_verification", 0) \
            + lr.held
        lane.totals["dup_transaction_shaped"] = lr.dup_transaction_shaped
        lane.totals["dup_other"] = lr.dup_other


def run_round(stack: ChaosStack, producer: SourceProducer, n: int) -> RoundResult:
    seed = SEED + n
    plan = plan_round(seed, [p.name for p in stack.processes()], n)
    print(f"\nchaos round {n} ({stack.kind}): seed {seed} (CHAOS_SEED={SEED}): "
          f"{plan.describe()}", flush=True)
    result = RoundResult(n, seed, plan.describe())
    proxy = stack.proxy
    assert proxy is not None
    t_start = time.monotonic()
    proxy.take_counts()
    requests_before = proxy.requests
    proxy.configure(plan.profile, seed)
    _delays.seed(seed)
    for lane in stack.lanes:
        lane.sqs_chaos.rnd.seed(seed)
        if plan.sqs_chaos:
            lane.sqs_chaos.active.set()
    events: list[tuple[float, Callable[[], None]]] = []
    if plan.outage:
        secs = plan.outage[1]
        events.append((plan.outage[0], lambda: proxy.outage(secs)))
    for t, name, down, how in plan.kills:
        proc = stack.process(name)
        events.append((t, functools.partial(arm_kill, stack, proc, how)))
        events.append((min(t + KILL_POINT_WAIT + down, WINDOW), proc.ensure_running))
    if plan.freeze:
        t, broker, dur = plan.freeze
        events.append((t, lambda: stack.freeze(broker)))
        events.append((t + dur, lambda: stack.thaw(broker)))
    # Recent timestamps: a real broker deletes records older than its retention (7 days).
    records = sample_records(plan.records, PARTITIONS, seed=seed, value_size=200)
    prod = threading.Thread(target=producer.produce, args=(records, 12, WINDOW * 0.6 / 12),
                            daemon=True)
    t0 = time.monotonic()
    prod.start()
    run_events(events, t0)
    time.sleep(max(0.0, t0 + WINDOW - time.monotonic()))
    # End of the fault window: heal everything.
    time.sleep(0.2)  # a kill point may still be pending
    proxy.disarm()
    proxy.configure(NO_FAULTS, seed)
    for broker in list(stack.frozen):
        stack.thaw(broker)
    for lane in stack.lanes:
        lane.sqs_chaos.active.clear()
    prod.join(180)
    assert not prod.is_alive(), "the source producer hung"
    assert not producer.errors, producer.errors
    t_heal = time.monotonic()
    wait_caught_up(stack, dict(producer.last_offsets), CATCH_UP_TIMEOUT)
    result.catch_up_seconds = time.monotonic() - t_heal
    verify_lanes(stack, result)
    result.s3_faults = dict(proxy.take_counts())
    result.s3_requests = proxy.requests - requests_before
    result.sqs_duplicated = sum(lane.sqs_chaos.duplicated for lane in stack.lanes)
    result.sqs_delayed = sum(lane.sqs_chaos.delayed for lane in stack.lanes)
    for lane in stack.lanes:
        lane.sqs_chaos.duplicated = lane.sqs_chaos.delayed = 0
    result.unexpected_exits = {p.name: list(p.unexpected_exits) for p in stack.processes()
                               if p.unexpected_exits}
    result.seconds = time.monotonic() - t_start
    lanes = "; ".join(f"{m}: lost {r.lost} duplicated {r.duplicated} reordered {r.reordered}"
                      + (f" (held by an open transaction {r.held})" if r.held else "")
                      + (f" (transaction-shaped {r.dup_transaction_shaped}, other "
                         f"{r.dup_other})" if m == "exactly-once" else "")
                      for m, r in result.lanes.items())
    for note in result.notes:
        print(f"chaos round {n}: {note}", flush=True)
    print(f"chaos round {n}: {result.seconds:.1f}s (catch-up {result.catch_up_seconds:.1f}s), "
          f"S3 {result.s3_requests} requests, faults {result.s3_faults}, SQS copies "
          f"{result.sqs_duplicated}, delayed {result.sqs_delayed}; {lanes}", flush=True)
    return result


# The suite-wide 300 s timeout would cut a long run short: the budget bounds this test.
@pytest.mark.timeout(int(BUDGET) + 300)
def test_chaos_rounds(stack: ChaosStack) -> None:
    t0 = time.monotonic()
    producer = SourceProducer(stack.source_kafka, TOPIC)
    results: list[RoundResult] = []
    for n in range(ROUNDS):
        elapsed = time.monotonic() - t0
        longest = max((r.seconds for r in results), default=0.0)
        if results and elapsed + longest > BUDGET:
            print(f"chaos: stopping after {n} round(s): {elapsed:.0f}s used of the "
                  f"{BUDGET:.0f}s budget (CHAOS_BUDGET)")
            break
        results.append(run_round(stack, producer, n))
    totals: dict[str, dict[str, int]] = {}
    for lane in stack.lanes:
        totals[lane.mode] = dict(lane.totals)
    exits = {p.name: p.unexpected_exits for p in stack.processes() if p.unexpected_exits}
    kills = {p.name: p.kills for p in stack.processes()}
    kill_points = dict(stack.kill_points)
    external = {p.name: p.external_terms for p in stack.processes() if p.external_terms}
    summary: dict[str, Any] = {
        "broker": stack.kind, "seed": SEED, "rounds": len(results), "records": producer.produced,
        "seconds": round(time.monotonic() - t0, 1), "kills": kills,
        "kill_points_reached": kill_points,
        "s3_faults": _sum_dicts(r.s3_faults for r in results),
        "s3_requests": sum(r.s3_requests for r in results),
        "sqs_copies": sum(r.sqs_duplicated for r in results),
        "sqs_delayed": sum(r.sqs_delayed for r in results),
        "totals": totals, "unexpected_exits": exits, "external_sigterms": external,
        "rounds_detail": [_as_dict(r) for r in results]}
    print("\nchaos summary: " + json.dumps({k: v for k, v in summary.items()
                                              if k != "rounds_detail"}), flush=True)
    report = Path(os.environ.get("CHAOS_REPORT") or stack.dir / "chaos-report.json")
    report.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"chaos report: {report}")
    for mode, t in totals.items():
        assert t["lost"] == 0, f"{mode}: records lost"
        assert t["reordered"] == 0, f"{mode}: records reordered"
    if stack.kind == "apache":
        # Measured directly: a read_committed reader sees every record exactly once.
        assert totals["exactly-once"]["duplicated"] == 0, "exactly-once: records duplicated"
        assert totals["exactly-once"].get("held_at_verification", 0) == 0
    assert totals["exactly-once"].get("dup_other", 0) == 0, \
        "exactly-once: duplicates that are not a re-produced aborted transaction"
    assert not exits, f"processes exited by themselves: {exits}"


def _sum_dicts(ds: Iterator[dict[str, int]] | Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _as_dict(r: RoundResult) -> dict[str, Any]:
    d = dict(vars(r))
    d["lanes"] = {m: vars(x) for m, x in r.lanes.items()}
    return d
