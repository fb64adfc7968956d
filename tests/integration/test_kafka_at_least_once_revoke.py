"""At-least-once, end to end with two real ``replicator-ingress`` processes on Apache
Kafka: a worker that misses its revoke deadline must not keep producing beside the new
owner (ingress/README.md, "Revoke deadline").

Process A replays two partitions through a producer the destination broker throttles
(a ``producer_byte_rate`` quota on A's ``client.id``, set with ``kafka-configs.sh``): its
acknowledgements come slowly, so records sit unacknowledged in its producer's queue. B
joins; the eager rebalance revokes both partitions from A, whose workers cannot settle
within ``revoke_timeout``: the revoke callback purges and replaces A's shared producer
before the partitions are released. One partition moves to B, the other comes back to A;
the quota is then lifted. An idempotent producer has no fencing, so without the purge A's
queued records of the moved partition would still be delivered after B's first ones
(records of one partition interleaved: a compacted destination could keep a stale value).

Each destination partition must read as the source's offsets from 0, then at most one redo
from a checkpoint (the new session, A's or B's), then contiguous to the end: nothing lost,
and no record of the former owner after the new owner's first.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from replicator.core.errors import ReplicatorError
from replicator.devstack.processes import free_port, kafka_home
from replicator.devstack.toml_writer import write_toml
from tests.conftest import unique_name
from tests.integration.test_ingress import Env, checkpoints, env, read_topic, wait_for
from tests.integration.test_ingress_crash import (
    metrics_text,
    plain_record,
    start,
)

__all__ = ["env"]  # the fixture, shared with test_ingress.py

pytestmark = pytest.mark.apache

PARTITIONS = 2
PER_PARTITION = 3_000
BATCH = 100
SLOW_BYTES_PER_SECOND = 5_000


def set_producer_rate(brokers: str, client_id: str, rate: int | None) -> None:
    """Throttle (or no longer) the produce requests of ``client_id`` on the broker."""
    change = (["--add-config", f"producer_byte_rate={rate}"] if rate is not None
              else ["--delete-config", "producer_byte_rate"])
    subprocess.run([str(kafka_home() / "bin" / "kafka-configs.sh"), "--bootstrap-server",
                    brokers, "--alter", "--entity-type", "clients", "--entity-name",
                    client_id, *change], check=True, capture_output=True, timeout=120)


def process_config(env: Env, tmp_path: Path, name: str, port: int,
                   client: dict[str, object]) -> Path:
    data = json.loads(json.dumps(env.data))
    data["metrics"] = {"port": port, "host": "127.0.0.1"}
    data["kafka"]["config"].update({"session.timeout.ms": 3000, "heartbeat.interval.ms": 300,
                                    **client})
    data["ingress"].update({"delivery": "at-least-once", "batch_size": BATCH,
                            "instance_id": name, "revoke_timeout": "1s"})
    cfg = tmp_path / f"{name}.toml"
    write_toml(cfg, data)
    return cfg


def checkpointed(port: int) -> dict[int, float]:
    """The partitions a process checkpointed (its metrics), with their offsets."""
    text = metrics_text(port) or ""
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r'^replicator_ingress_checkpoint_offset\{[^}]*partition="(\d+)"[^}]*\} (\S+)$',
        text, re.M)}


def runs(offsets: list[int]) -> list[tuple[int, int]]:
    """``offsets`` as runs of consecutive values: (first, last) each."""
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def all_replayed(env: Env, topic: str) -> bool:
    """Every partition checkpointed its last offset (the newest checkpoint or not: a
    former owner's stale one may follow it when the guard is missing)."""
    try:
        cps = checkpoints(env.brokers, topic)
    except ReplicatorError:  # not readable to its end yet: checked again
        return False
    return all(any(c.offset == PER_PARTITION - 1
                   for c in cps.get(f"us-east-1:{env.source}:{p}:{env.dest}", []))
               for p in range(PARTITIONS))


def test_a_worker_past_its_revoke_deadline_never_writes_beside_the_new_owner(
        env: Env, tmp_path: Path) -> None:
    env.write_meta(PARTITIONS)
    for p in range(PARTITIONS):
        env.write(env.segment_key(p, 0, PER_PARTITION - 1), make=plain_record)
    slow = unique_name("slow-ingress")
    ports = {"a": free_port(), "b": free_port()}
    # A: small produce requests, one at a time, so the quota paces its acknowledgements
    # and most of what it produced waits in its queue.
    cfgs = {"a": process_config(env, tmp_path, "a", ports["a"],
                                {"client.id": slow, "batch.size": 2048,
                                 "max.in.flight.requests.per.connection": 1}),
            "b": process_config(env, tmp_path, "b", ports["b"], {})}
    logs = {k: tmp_path / f"{k}.log" for k in cfgs}
    set_producer_rate(env.brokers, slow, SLOW_BYTES_PER_SECOND)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["a"] = start(cfgs["a"], logs["a"])
        wait_for(lambda: len(checkpointed(ports["a"])) == PARTITIONS, 60,
                 "A to checkpoint both partitions")
        procs["b"] = start(cfgs["b"], logs["b"])
        wait_for(lambda: bool(checkpointed(ports["b"])), 60, "B to take a partition over")
        moved = set(checkpointed(ports["b"]))
        set_producer_rate(env.brokers, slow, None)
        wait_for(lambda: all_replayed(env, env.data["ingress"]["checkpoint_topic"]), 90,
                 "both partitions to be replayed")
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            assert proc.wait(30) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    a_log = logs["a"].read_text()
    # The scenario happened: A's workers missed the deadline with records unacknowledged.
    assert "did not stop within" in a_log, a_log[-3000:]
    got = read_topic(env.brokers, env.dest, timeout=60)
    shapes = {p: runs([int(r[1][1:]) for r in rows if r[1] is not None])
              for p, rows in got.items()}
    print(f"moved to B: {sorted(moved)}; runs of source offsets per partition: {shapes}")
    assert len(moved) == 1
    for p, shape in shapes.items():
        # Contiguous from 0, then at most one redo from a checkpoint (no gap), contiguous to
        # the end: a former owner's records after the new owner's first would start a
        # third run (without the purge: [(0, 480), (400, 2999), (481, 699)]).
        assert len(shape) <= 2, f"partition {p} interleaved: {shape}"
        assert shape[0][0] == 0 and shape[-1][1] == PER_PARTITION - 1, (p, shape)
        if len(shape) == 2:
            assert shape[1][0] <= shape[0][1] + 1, f"partition {p} lost records: {shape}"
