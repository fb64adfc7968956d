"""Exactly-once measured directly on Apache Kafka: SIGKILL ingress mid-transaction, three
times, then count what a read_committed reader of the destination sees.

Each kill lands while the worker replays a backlog of 500-record transactions (right after
its produced counter moves): the records of the open transaction are in the destination
log but never committed. A real broker hides them from read_committed readers (Tansu does
not, which is why the Tansu runs count duplicates "shaped like a transaction" instead), so
here every source record must be seen exactly once: duplicates = 0, lost = 0. The log
itself must show that transactions really were cut: a read_uncommitted reader sees more
records than a read_committed one.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Literal

import pytest

from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Consumer, TopicPartition, read_to_end
from replicator.core.settings import KafkaSettings
from replicator.devstack.processes import free_port
from replicator.devstack.toml_writer import write_toml
from tests.conftest import unique_name
from tests.integration.test_ingress import Env, checkpoints, env, read_topic, wait_for
from tests.integration.test_ingress_crash import (
    checkpoint_offset,
    metrics_text,
    plain_record,
    start,
)

__all__ = ["env"]  # the fixture, shared with test_ingress.py

pytestmark = pytest.mark.apache

BATCH = 500
SEGMENTS = 4
PER_SEGMENT = 15_000
KILLS = 3
MAX_KILLS = 8


def produced(port: int) -> float | None:
    text = metrics_text(port)
    if text is None:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith("replicator_ingress_messages_produced_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def log_count(brokers: str, topic: str,
              isolation: Literal["read_committed", "read_uncommitted"]) -> int:
    """Records of partition 0 of ``topic`` a reader with ``isolation`` sees."""
    return sum(1 for _ in read_to_end(KafkaSettings(brokers=brokers), topic, partitions=[0],
                                      isolation=isolation, timeout=60, idle_timeout=60))


def aborted_records(env: Env) -> bool:
    """Whether the destination log holds records no read_committed reader sees."""
    return (log_count(env.brokers, env.dest, "read_uncommitted")
            > log_count(env.brokers, env.dest, "read_committed"))


def test_sigkill_mid_transaction_three_times_then_every_record_exactly_once(
        env: Env, tmp_path: Path) -> None:
    env.write_meta(1)
    total = SEGMENTS * PER_SEGMENT
    for i in range(SEGMENTS):
        env.write(env.segment_key(0, i * PER_SEGMENT, (i + 1) * PER_SEGMENT - 1),
                  make=plain_record)
    port = free_port()
    data = json.loads(json.dumps(env.data))
    data["metrics"] = {"port": port, "host": "127.0.0.1"}
    data["kafka"]["config"].update({"session.timeout.ms": 3000, "heartbeat.interval.ms": 300})
    data["ingress"]["batch_size"] = BATCH
    cfg = tmp_path / "ingress.toml"
    write_toml(cfg, data)
    log = tmp_path / "ingress.log"
    rnd = random.Random(13)
    kills_at: list[float | None] = []
    # At least KILLS kills, and more (up to MAX_KILLS) until one of them cut a transaction:
    # a kill that lands between two transactions proves nothing about abort isolation.
    while len(kills_at) < KILLS or (len(kills_at) < MAX_KILLS and not aborted_records(env)):
        proc = start(cfg, log)
        try:
            wait_for(lambda: (produced(port) or 0) > 0, 90, "the process to produce")
            before = produced(port) or 0

            def next_batch(b: float = before) -> bool:
                return (produced(port) or 0) > b

            wait_for(next_batch, 30, "the next batch")
            time.sleep(rnd.uniform(0.0, 0.05))  # inside the next transaction
            kills_at.append(checkpoint_offset(port))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    last = start(cfg, log)
    try:
        wait_for(lambda: checkpoint_offset(port) == total - 1, 120, "the last run to finish")
        last.send_signal(signal.SIGTERM)
        assert last.wait(30) == 0
    finally:
        if last.poll() is None:
            last.kill()
    assert all(k is not None and k < total - 1 for k in kills_at), kills_at

    got = [r[1] for r in read_topic(env.brokers, env.dest, timeout=60)[0]]
    counts = Counter(got)
    expected = {f"k{o}".encode() for o in range(total)}
    lost = len(expected - set(got))
    duplicated = len(got) - len(counts)
    print(f"killed at checkpoints {kills_at}: {total} records, lost={lost} "
          f"duplicated={duplicated}")
    assert (lost, duplicated) == (0, 0)
    assert got == [f"k{o}".encode() for o in range(total)]  # and in order
    # The kills really cut transactions: their records are in the log, aborted.
    assert log_count(env.brokers, env.dest, "read_uncommitted") > total
    cps = [c.offset for c in checkpoints(env.brokers,
                                         data["ingress"]["checkpoint_topic"])[
        f"us-east-1:{env.source}:0:{env.dest}"]]
    assert cps == sorted(set(cps)) and cps[-1] == total - 1


MEMBERS_PARTITIONS = 64
MEMBERS_PER_PARTITION = 1_000
MEMBERS_BATCH = 250
MAX_FREEZES = 20


def process_config(env: Env, tmp_path: Path, name: str, port: int) -> Path:
    """The config file of one ingress process of a two-process group (its own instance id,
    so its transactional.id, and its own metrics port)."""
    data = json.loads(json.dumps(env.data))
    data["metrics"] = {"port": port, "host": "127.0.0.1"}
    data["kafka"]["config"].update({"session.timeout.ms": 3000, "heartbeat.interval.ms": 300})
    data["ingress"].update({"batch_size": MEMBERS_BATCH, "instance_id": name,
                            "revoke_timeout": "5s", "producers": 2})
    cfg = tmp_path / f"{name}.toml"
    write_toml(cfg, data)
    return cfg


def all_checkpointed(env: Env, topic: str, last: int) -> bool:
    try:
        cps = checkpoints(env.brokers, topic)
    except ReplicatorError:  # not readable to its end yet: checked again
        return False
    done = {k for k, v in cps.items() if v and v[-1].offset == last}
    return len(done) == MEMBERS_PARTITIONS


def produced_partitions(port: int) -> set[int]:
    """The partitions an ingress process has produced records to (its metrics)."""
    text = metrics_text(port) or ""
    return {int(line.split('partition="', 1)[1].split('"', 1)[0])
            for line in text.splitlines()
            if line.startswith("replicator_ingress_messages_produced_total{")
            and float(line.rsplit(" ", 1)[1]) > 0}


def open_transactions(brokers: str, topic: str, partitions: set[int]) -> set[int]:
    """Those of ``partitions`` of ``topic`` holding records of an unfinished transaction:
    the last stable offset stays below the high watermark, unmoved, for 1.5 s (called while
    their producer is frozen, so a transaction found open stays open). A consumer's
    watermark request (ListOffsets "latest") answers the last stable offset when it reads
    read_committed, the high watermark when it reads read_uncommitted.
    """
    kafka = KafkaSettings(brokers=brokers)
    readers = {isolation: Consumer(kafka, unique_name("lso"), {"isolation.level": isolation})
               for isolation in ("read_committed", "read_uncommitted")}

    def ends(isolation: str) -> dict[int, int]:
        return {p: readers[isolation].watermarks(TopicPartition(topic, p))[1]
                for p in partitions}

    try:
        stable = ends("read_committed")
        stuck = set(partitions)
        for _ in range(3):
            time.sleep(0.5)
            high = ends("read_uncommitted")
            again = ends("read_committed")
            stuck &= {p for p in partitions if again[p] == stable[p] < high[p]}
        return stuck
    finally:
        for reader in readers.values():
            reader.close()


def test_two_processes_64_partitions_one_killed_mid_transaction_and_restarted(
        env: Env, tmp_path: Path) -> None:
    """Two ingress processes share 64 partitions, each through its transactional producers
    (a pool of two: ``ingress.producers``); one is SIGKILLed while its transactions
    (batches of several partitions) are open, with records in the log (seen while it is
    frozen), and restarted with the same instance id.
    read_committed, the destination equals the source: 0 duplicates, 0 lost, in order.
    """
    n, per = MEMBERS_PARTITIONS, MEMBERS_PER_PARTITION
    env.write_meta(n)
    for p in range(n):
        env.write(env.segment_key(p, 0, per - 1), make=plain_record)
    ports = {"a": free_port(), "b": free_port()}
    cfgs = {k: process_config(env, tmp_path, k, port) for k, port in ports.items()}
    log = tmp_path / "ingress.log"
    procs = {k: start(cfg, log) for k, cfg in cfgs.items()}
    try:
        for port in ports.values():
            wait_for(lambda port=port: (produced(port) or 0) > 0, 60,  # type: ignore[misc]
                     "both processes to produce")
        # Freeze a (SIGSTOP) and look whether it left a transaction open with records in
        # the log; only then kill it. A kill between two transactions, or during a commit
        # already sent, proves nothing about abort isolation: otherwise a is resumed and
        # frozen again after its next transaction (each freeze lasts under the 3 s session
        # timeout, so a stays in the group).
        rnd = random.Random(7)
        cut: set[int] = set()
        for _ in range(MAX_FREEZES):
            before = produced(ports["a"]) or 0
            wait_for(lambda b=before: (produced(ports["a"]) or 0) > b,  # type: ignore[misc]
                     30, "a's next transaction")
            time.sleep(rnd.uniform(0.0, 0.1))
            mine = produced_partitions(ports["a"])
            os.kill(procs["a"].pid, signal.SIGSTOP)
            cut = open_transactions(env.brokers, env.dest, mine)
            if cut:
                break
            os.kill(procs["a"].pid, signal.SIGCONT)
        assert cut, f"a was never caught inside a transaction in {MAX_FREEZES} tries"
        print(f"a killed with transactions open on partitions {sorted(cut)}")
        os.kill(procs["a"].pid, signal.SIGKILL)
        procs["a"].wait(10)
        procs["a"] = start(cfgs["a"], log)
        wait_for(lambda: all_checkpointed(env, env.data["ingress"]["checkpoint_topic"],
                                          per - 1), 120, "every partition to be replayed")
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            assert proc.wait(30) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    got = read_topic(env.brokers, env.dest, timeout=60)
    expected = [f"k{o}".encode() for o in range(per)]
    wrong = {p: (len(rows), len(set(r[1] for r in rows))) for p, rows in got.items()
             if [r[1] for r in rows] != expected}
    total = sum(len(rows) for rows in got.values())
    print(f"{n} partitions, {n * per} records: read_committed {total}; partitions that "
          f"differ (records, distinct): {wrong}")
    assert not wrong and total == n * per
    # The kill cut open transactions: their records are in the logs, aborted.
    uncommitted = sum(1 for _ in read_to_end(KafkaSettings(brokers=env.brokers), env.dest,
                                             isolation="read_uncommitted", timeout=60))
    assert uncommitted > n * per
