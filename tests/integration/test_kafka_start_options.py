"""Every start option, egress and ingress together, on Apache Kafka: what each combination
copies and skips on topics that already hold records (docs/configuration.md, "Where
replication starts").

Nine source topics, one per combination of egress ``start`` (earliest, latest, a time) and
ingress ``start`` (first-position, earliest-available, latest), two partitions each. Per
partition, in offset order: 20 old records (two hours old), 10 recent ones (a minute old;
the time start is ten minutes ago), then, once egress has started, 20 new ones, and 20
more once ingress has started. Egress runs as processes: a first one resolves and commits
its starts and is killed (SIGKILL) before any segment; two others then share the group (a
rebalance, a second member taking over) and archive. Ingress starts once the 20 new
records are archived. What each partition's copy must hold, exactly once (read_committed):

* egress archives 0-69 (earliest), 20-69 (the time), 30-69 (latest: its start, committed
  by the killed process, is where the next members begin, not a later end of the log);
* ingress replays all of it (first-position, earliest-available) or only what reaches the
  bucket after it started, 50-69 (latest), the rest skipped loudly and counted.

Before the fix, egress took its own start commit for a resume, recorded no first position,
and ingress (first-position, the default) waited for it for ever: nothing of the latest
topics arrived. An ingress ``latest`` started before any segment skipped the first one to
arrive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import Admin, Producer, read_to_end
from replicator.core.keys import SegmentKey
from replicator.core.settings import KafkaSettings, Settings, load_settings
from replicator.devstack.processes import free_port
from replicator.devstack.toml_writer import write_toml
from tests.conftest import FAST_GROUP_CONFIG, unique_name
from tests.integration.pipeline import (
    CREDS,
    DEST_REGION,
    SOURCE_REGION,
    Pipeline,
    running_ingress,
    wait_for,
)
from tests.integration.test_ingress_crash import metrics_text

pytestmark = pytest.mark.apache

EGRESS_STARTS = ("earliest", "latest", "time")
INGRESS_STARTS = ("first-position", "earliest-available", "latest")
PARTITIONS = 2
OLD, RECENT, NEW, LATER = 20, 10, 20, 20
ARCHIVED_FROM = {"earliest": 0, "time": OLD, "latest": OLD + RECENT}
INGRESS_FROM = OLD + RECENT + NEW          # ingress latest: what arrives after it started
END = OLD + RECENT + NEW + LATER


def produce(kafka: KafkaSettings, topics: list[str], n: int, at: datetime) -> None:
    p = Producer(kafka)
    base = int(at.timestamp() * 1000)
    for topic in topics:
        for part in range(PARTITIONS):
            for j in range(n):
                p.produce(topic, value=f"{topic}|{part}|{base + j}".encode(), partition=part,
                          timestamp=base + j)
    assert p.flush(30) == 0


def egress_config(pipe: Pipeline, topics: dict[str, str], age: str) -> dict[str, Any]:
    return {
        "region": SOURCE_REGION,
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, **CREDS},
        "kafka": {"brokers": pipe.source_brokers, "config": dict(FAST_GROUP_CONFIG)},
        "metrics": {"port": free_port(), "host": "127.0.0.1"},
        "egress": {"group_id": pipe.egress_group, "shutdown_timeout": "10s",
                   "topic_metadata_interval": "1s",
                   "topics": {t: {"start": start, "max_segment_messages": 200,
                                  "max_segment_age": age} for t, start in topics.items()}},
    }


def ingress_settings(pipe: Pipeline, combos: dict[str, tuple[str, str]]) -> Settings:
    return load_settings(data={
        "region": DEST_REGION,
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, **CREDS},
        "kafka": {"brokers": pipe.dest_brokers, "config": dict(FAST_GROUP_CONFIG)},
        "metrics": {"port": 0},
        "ingress": {
            "group_id": pipe.ingress_group, "sqs_queue": pipe.queue,
            "segment_events_topic": pipe.events_topic,
            "checkpoint_topic": pipe.checkpoint_topic, "batch_size": 200,
            "sqs_wait_time": "1s", "topic_check_interval": "1s",
            "rescan_interval": "30s", "revoke_timeout": "10s",
            "sources": [{"region": SOURCE_REGION, "topic": t,
                         "destination_topic": t + ".copy", "start": i,
                         "lost_segment_timeout": "60s", "first_segment_delay": "2s"}
                        for t, (_e, i) in combos.items()]},
    }, environ={})


@contextmanager
def egress_process(config: dict[str, Any], tmp: Path, name: str
                   ) -> Iterator[subprocess.Popen[bytes]]:
    cfg = tmp / f"{name}.toml"
    write_toml(cfg, config)
    exe = Path(sys.executable).parent / "replicator-egress"
    with open(tmp / f"{name}.log", "ab") as out:
        proc = subprocess.Popen([str(exe), "--config", str(cfg)], stdout=out, stderr=out,
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def starts_committed(admin: Admin, group: str, combos: dict[str, tuple[str, str]]) -> bool:
    """Whether every latest and time start is committed where it resolves to."""
    try:
        committed = admin.group_offsets(group)
    except KafkaRetriableError:       # the coordinator still loading, say
        return False
    return all(committed.get((t, p)) == ARCHIVED_FROM[e] for t, (e, _i) in combos.items()
               if e != "earliest" for p in range(PARTITIONS))


def metric_sum(port: int, name: str) -> float:
    text = metrics_text(port) or ""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def archived_ends(pipe: Pipeline, topic: str) -> dict[int, int]:
    ends: dict[int, int] = {}
    for info in pipe.store.list(f"data/{SOURCE_REGION}/{topic}/"):
        k = SegmentKey.try_parse(info.key)
        if k is not None:
            ends[k.partition] = max(ends.get(k.partition, -1), k.end)
    return ends


def copied_offsets(kafka: KafkaSettings, topic: str, part: int) -> list[int]:
    """Source offsets of the records the copy holds, in order (read_committed), from the
    values (``topic|partition|timestamp``): the n-th record produced to a partition is at
    offset n."""
    return [int(m.value().decode().rsplit("|", 1)[1])  # type: ignore[union-attr]
            for m in read_to_end(kafka, topic, partitions=[part], timeout=60, idle_timeout=5)]


def test_every_start_combination_copies_exactly_what_it_promises(
        pipe: Pipeline, tmp_path: Path) -> None:
    now = datetime.now(UTC)
    since = (now - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = unique_name("start")
    combos = {f"{base}.{e}.{i}": (e, i) for e in EGRESS_STARTS for i in INGRESS_STARTS}
    topics = list(combos)
    egress_starts = {t: since if e == "time" else e for t, (e, _i) in combos.items()}
    admin = Admin(pipe.source_kafka)
    for t in topics:
        assert admin.create_topic(t, PARTITIONS)
    # Offsets: old 0-19, recent 20-29 (what the time start copies from).
    stamps: dict[int, int] = {}
    for n, when in ((OLD, now - timedelta(hours=2)), (RECENT, now - timedelta(minutes=1))):
        n0 = len(stamps)
        produce(pipe.source_kafka, topics, n, when)
        stamps.update({n0 + j: int(when.timestamp() * 1000) + j for j in range(n)})

    with ExitStack() as stack:
        # 1. A first egress resolves and commits its starts, then dies before any segment
        #    (a long segment age keeps the earliest and time topics' segments open).
        first = stack.enter_context(egress_process(
            egress_config(pipe, egress_starts, "120s"), tmp_path, "egress-a"))

        wait_for(lambda: starts_committed(admin, pipe.egress_group, combos), 90,
                 "the first egress to commit its latest and time starts")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        assert not any(archived_ends(pipe, t) for t in topics), "a segment before the kill"
        # The chosen starts are the first positions, recorded before any segment.
        assert {t: json.loads(pipe.store.get(f"data/{SOURCE_REGION}/{t}/_topic.json"))[
                    "first_positions"] for t, (e, _i) in combos.items() if e != "earliest"} \
            == {t: dict.fromkeys(map(str, range(PARTITIONS)), ARCHIVED_FROM[e])
                for t, (e, _i) in combos.items() if e != "earliest"}

        # 2. Records produced while no egress runs, then two members share the group.
        n0 = len(stamps)
        produce(pipe.source_kafka, topics, NEW, now)
        stamps.update({n0 + j: int(now.timestamp() * 1000) + j for j in range(NEW)})
        configs = [egress_config(pipe, egress_starts, "500ms") for _ in range(2)]
        for n, cfg in enumerate(configs):
            stack.enter_context(egress_process(cfg, tmp_path, f"egress-{'bc'[n]}"))
        wait_for(lambda: all(archived_ends(pipe, t) == dict.fromkeys(range(PARTITIONS),
                                                                     n0 + NEW - 1)
                             for t in topics), 120, "the new records archived")

        # 3. Ingress starts; then more records.
        with running_ingress(ingress_settings(pipe, combos)) as ing:
            def at(position: int) -> bool:
                pos = ing.positions()
                return all(pos.get((SOURCE_REGION, t, p)) == position
                           for t in topics for p in range(PARTITIONS))

            wait_for(lambda: at(INGRESS_FROM - 1), 120, "ingress to replay the archive")
            n1 = len(stamps)
            later = datetime.now(UTC)
            produce(pipe.source_kafka, topics, LATER, later)
            stamps.update({n1 + j: int(later.timestamp() * 1000) + j for j in range(LATER)})
            wait_for(lambda: at(END - 1), 120, "ingress to replay the later records")
            lost = ing.metrics.total("replicator_ingress_messages_lost_total")
            skipped = {t: ing.metrics.total("replicator_ingress_messages_skipped_total",
                                            topic=t) for t in topics}
        egress_lost = sum(metric_sum(cfg["metrics"]["port"],
                                     "replicator_egress_source_lost_messages_total")
                          for cfg in configs)

    assert lost == 0 and egress_lost == 0
    by_stamp = {s: o for o, s in stamps.items()}
    for t, (e, i) in combos.items():
        frm = INGRESS_FROM if i == "latest" else ARCHIVED_FROM[e]
        for p in range(PARTITIONS):
            got = [by_stamp[s] for s in copied_offsets(pipe.dest_kafka, t + ".copy", p)]
            assert got == list(range(frm, END)), (t, p, got[:5], len(got))
    # Skipped by choice (ingress latest) is counted; nothing else is.
    assert skipped == {t: (INGRESS_FROM - ARCHIVED_FROM[e]) * PARTITIONS if i == "latest"
                       else 0 for t, (e, i) in combos.items()}
