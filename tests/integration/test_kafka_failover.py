"""Failover of consumer groups on Apache Kafka (docs/failover.md): a group that committed
offsets in the source resumes in the destination at exactly the record that follows —
compared record by record with the source, transaction markers and aborted records among
the holes; a group ahead of replication waits and then catches up, never backwards; a group
with members in the destination is never touched.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from egress.controller import Egress
from ingress.checkpoints import KafkaCheckpointStore
from replicator.cli.main import main
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition
from replicator.core.metrics import Metrics
from replicator.core.offset_map import entries_of, live_entries, translate
from replicator.core.settings import IngressSettings, Settings
from replicator.ops.groups import (
    ACTIVE,
    SYNCED,
    TO_SYNC,
    WAITING,
    GroupRow,
    plan,
    read_exports,
    read_offset_map,
    sync,
)
from replicator.ops.verify import read_partition
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import Pipeline, running_egress, running_ingress, wait_for
from tests.integration.test_egress import read_partition as read_segments
from tests.integration.test_kafka_source_holes import compact_source

pytestmark = pytest.mark.apache

PARTITIONS = 3
Rec = tuple[bytes | None, bytes | None]


def _produce_transactions(pipe: Pipeline, tag: str, rounds: int) -> None:
    """Committed and aborted transactions on every partition: markers and aborted records
    make holes in the source offsets."""
    tx = Producer(pipe.source_kafka, transactional_id=unique_name("tx"))
    tx.init_transactions(30)
    n = 0
    for r in range(rounds):
        tx.begin_transaction()
        for i in range(3 + r % 4):
            for p in range(PARTITIONS):
                tx.produce(pipe.topic, value=f"{tag}-{r}-{i}-{p}".encode(),
                           key=f"k{n}".encode(), partition=p, timestamp=RECENT_MS + n)
                n += 1
        if r % 3 == 2:
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)


def _source_partition(pipe: Pipeline, p: int) -> list[tuple[int, Rec]]:
    return [(m.offset() or 0, (m.key(), m.value()))
            for m in read_partition(pipe.source_kafka, pipe.topic, p)]


def _source(pipe: Pipeline) -> dict[int, list[tuple[int, Rec]]]:
    """The committed source records per partition, with their offsets."""
    return {p: _source_partition(pipe, p) for p in range(PARTITIONS)}


def _settings(pipe: Pipeline) -> tuple[Settings, Settings]:
    egress = pipe.egress_settings(max_segment_messages=20,
                                  egress={"group_export": {"interval": "1s"}})
    ingress = pipe.ingress_settings(batch_size=7)
    return egress, ingress


def _config(pipe: Pipeline, tmp_path: Path) -> Path:
    """An ingress config file of the pipeline, for the operator commands."""
    return pipe.ingress_config_file(tmp_path, destination_topic=pipe.dest_topic,
                                    checkpoint_topic=pipe.checkpoint_topic)


def _plan(pipe: Pipeline, ingress: Settings) -> list[GroupRow]:
    cfg: IngressSettings = ingress.require("ingress")
    cps = KafkaCheckpointStore(ingress.kafka, cfg.checkpoint_topic, Metrics(),
                               timeout=30).load_all()
    return plan(read_exports(pipe.store, "data", cfg), cfg.sources, Admin(ingress.kafka),
                read_offset_map(ingress.kafka, cfg.offset_map_topic), cps)


def _resume(pipe: Pipeline, group: str, partitions: int = PARTITIONS
            ) -> dict[int, list[Rec]]:
    """What a consumer of ``group`` reads in the destination from its committed offsets
    (assigned at them, as a member of the group would start, without a group join)."""
    committed = Admin(pipe.dest_kafka).group_offsets(group)
    consumer = Consumer(pipe.dest_kafka, unique_name("reader"), {"enable.partition.eof": True})
    out: dict[int, list[Rec]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    consumer.assign([TopicPartition(pipe.dest_topic, p, committed[(pipe.dest_topic, p)])
                     for p in range(partitions)])
    try:
        def done() -> bool:
            fetched = consumer.fetch(500, 0.2)
            for (_, p), msgs in fetched.runs.items():
                out[p] += [(m.key(), m.value()) for m in msgs]
            at_end.update(p for _, p in fetched.ends)
            return at_end >= set(range(partitions))
        wait_for(done, 60, "the destination read to its end")
    finally:
        consumer.close()
    return out


def test_a_group_resumes_in_the_destination_exactly_after_what_it_read(
        pipe: Pipeline, tmp_path: Path) -> None:
    pipe.create_source(PARTITIONS)
    _produce_transactions(pipe, "a", 12)
    source = _source(pipe)
    rng = random.Random(7)
    admin = Admin(pipe.source_kafka)
    # Anywhere in each partition: before the first record, on a record, on a marker or an
    # aborted record, at the end.
    ends = {p: max(o for o, _ in recs) + 2 for p, recs in source.items()}
    group = unique_name("app")
    first = {p: rng.randint(0, ends[p]) for p in range(PARTITIONS)}
    first[0] = 0
    admin.alter_group_offsets(group, {(pipe.topic, p): o for p, o in first.items()})
    # A group that also consumes in the destination: never touched there.
    live = unique_name("live")
    admin.alter_group_offsets(live, {(pipe.topic, 0): 5})
    egress_settings, ingress_settings = _settings(pipe)

    with running_egress(Egress(egress_settings, store=pipe.store)):
        with running_ingress(ingress_settings):
            wait_for(lambda: pipe.verify().ok, 90, "the copy")
            wait_for(lambda: len(read_exports(pipe.store, "data",
                                              ingress_settings.require("ingress"))) == 2,
                     30, "the group exports")
            member = Consumer(pipe.dest_kafka, live, {"enable.partition.eof": False})
            member.subscribe([pipe.dest_topic])
            try:
                wait_for(lambda: (member.poll(0.2), bool(member.assignment()))[1], 30,
                         "the live destination member")
                rows = _plan(pipe, ingress_settings)
                sync(rows, Admin(pipe.dest_kafka))
            finally:
                member.close()
        assert {r.state for r in rows if r.group == live} == {ACTIVE}
        assert Admin(pipe.dest_kafka).group_offsets(live) == {}
        assert {r.state for r in rows if r.group == group} == {TO_SYNC}, rows
        got = _resume(pipe, group)
        for p in range(PARTITIONS):
            expected = [rec for o, rec in source[p] if o >= first[p]]
            assert got[p] == expected, (p, first[p])

        # The group reads on in the source, past what is replicated while ingress is down:
        # it waits at the replicated end, then catches up exactly.
        _produce_transactions(pipe, "b", 6)
        source = _source(pipe)
        later = {p: rng.randint(ends[p], max(o for o, _ in source[p]) + 1)
                 for p in range(PARTITIONS)}
        admin.alter_group_offsets(group, {(pipe.topic, p): o for p, o in later.items()})
        wait_for(lambda: all(r.source_committed == later[r.partition]
                             for r in _plan(pipe, ingress_settings) if r.group == group),
                 30, "the new export")
        rows = _plan(pipe, ingress_settings)
        mine = [r for r in rows if r.group == group]
        assert {r.state for r in mine} == {WAITING}, mine
        before = Admin(pipe.dest_kafka).group_offsets(group)
        sync(rows, Admin(pipe.dest_kafka))
        moved = Admin(pipe.dest_kafka).group_offsets(group)
        assert all(moved[k] >= before[k] for k in before)  # as far as the data, forward
        with running_ingress(ingress_settings):
            wait_for(lambda: pipe.verify().ok, 90, "the copy of the new records")
            rows = _plan(pipe, ingress_settings)
            assert {r.state for r in rows if r.group == group} == {TO_SYNC}, rows
            sync(rows, Admin(pipe.dest_kafka))
    got = _resume(pipe, group)
    for p in range(PARTITIONS):
        expected = [rec for o, rec in source[p] if o >= later[p]]
        assert got[p] == expected, (p, later[p])
    # Pruning the map below every exported group keeps their translations.
    cfg: IngressSettings = ingress_settings.require("ingress")
    before_prune = read_offset_map(pipe.dest_kafka, cfg.offset_map_topic)
    res = CliRunner().invoke(main, ["groups", "sync", "--config", str(_config(pipe, tmp_path)),
                                    "--prune"])
    assert res.exit_code == 0, res.output
    pruned = int(res.output.split("pruned ")[1].split()[0])
    after_prune = read_offset_map(pipe.dest_kafka, cfg.offset_map_topic)
    parts = [k for k in before_prune if k[1] == pipe.topic]
    assert pruned > 0
    assert sum(len(after_prune[k]) for k in parts) == sum(len(before_prune[k]) for k in parts) \
        - pruned
    assert {r.state for r in _plan(pipe, ingress_settings) if r.group == group} == {SYNCED}


def test_a_group_of_a_compacted_source_resumes_exactly(pipe: Pipeline, tmp_path: Path
                                                      ) -> None:
    compact_source(pipe)
    # A destination that keeps every record it gets (ingress reports the differing
    # cleanup.policy and goes on): its own cleaner would otherwise remove overwritten keys
    # and tombstones on its own schedule, and the comparison below is record by record.
    assert Admin(pipe.dest_kafka).create_topic(pipe.dest_topic, 1, {"cleanup.policy": "delete",
                                                                    "retention.ms": "-1"})
    group = unique_name("app")
    egress_settings, ingress_settings = _settings(pipe)
    end = max(o for o, _ in _source_partition(pipe, 0))
    with running_egress(Egress(egress_settings, store=pipe.store)), \
            running_ingress(ingress_settings) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing).get(0) == end, 90, "the replay")
        # What was replicated (the cleaner may still drop a tombstone from the source).
        replicated = [(r.offset, (r.key, r.value)) for r in read_segments(pipe.store,
                                                                          pipe.topic, 0)]
        # Positions across the log: records and the holes the cleaner left.
        commits = list(range(0, end + 2, 5))
        results = {}
        for c in commits:
            g = f"{group}-{c}"
            Admin(pipe.source_kafka).alter_group_offsets(g, {(pipe.topic, 0): c})
            results[c] = g
        wait_for(lambda: len(read_exports(pipe.store, "data",
                                          ingress_settings.require("ingress")))
                 == len(commits), 60, "the group exports")
        rows = _plan(pipe, ingress_settings)
        assert {r.state for r in rows} == {TO_SYNC}, rows
        # The operator command, as docs/failover.md's runbook runs it.
        config = _config(pipe, tmp_path)
        res = CliRunner().invoke(main, ["groups", "sync", "--config", str(config)])
        assert res.exit_code == 0, res.output
        assert f"committed {len(commits)} partition offset(s) of {len(commits)} group(s)" \
            in res.output
        res = CliRunner().invoke(main, ["groups", "show", "--config", str(config), "--output",
                                        "json"])
        assert res.exit_code == 0, res.output
        shown = json.loads(res.output[res.output.index("["):])
        assert {r["state"] for r in shown} == {"synced"} and len(shown) == len(commits)
    for c, g in sorted(results.items()):
        got = _resume(pipe, g, partitions=1)[0]
        assert got == [rec for o, rec in replicated if o >= c], c


def test_a_group_at_rest_after_a_transaction_is_synced_at_the_replicated_end(
        pipe: Pipeline) -> None:
    # A transactional source at rest: records 0-4, the commit marker at 5. A consumer that
    # read everything commits its position, past the marker: 6 (last record + 2).
    pipe.create_source(1)
    tx = Producer(pipe.source_kafka, transactional_id=unique_name("tx"))
    tx.init_transactions(30)
    tx.begin_transaction()
    for i in range(5):
        tx.produce(pipe.topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=0,
                   timestamp=RECENT_MS + i)
    tx.commit_transaction(30)
    group = unique_name("app")
    reader = Consumer(pipe.source_kafka, group, {"enable.partition.eof": True})
    reader.assign([TopicPartition(pipe.topic, 0, 0)])
    got: list[int] = []
    try:
        def at_end() -> bool:
            fetched = reader.fetch(100, 0.2)
            got.extend(m.offset() or 0 for run in fetched.runs.values() for m in run)
            return bool(fetched.ends) and len(got) == 5
        wait_for(at_end, 60, "the source read to its end")
        [position] = reader.position([TopicPartition(pipe.topic, 0)])
        assert position.offset == 6, position          # past the final commit marker
        assert reader.commit([TopicPartition(pipe.topic, 0, position.offset)]) == {}
    finally:
        reader.close()
    egress_settings, ingress_settings = _settings(pipe)
    cfg: IngressSettings = ingress_settings.require("ingress")
    with running_egress(Egress(egress_settings, store=pipe.store)), \
            running_ingress(ingress_settings) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing).get(0) == 4, 90, "the replay")
        wait_for(lambda: any(e.group == group and e.no_records_from == {0: 5}
                             for e in read_exports(pipe.store, "data", cfg)),
                 30, "the export of the group at rest")
        [row] = [r for r in _plan(pipe, ingress_settings) if r.group == group]
        assert (row.source_committed, row.replicated_to, row.state) == (6, 5, TO_SYNC), row
        sync([row], Admin(pipe.dest_kafka))
        [row] = [r for r in _plan(pipe, ingress_settings) if r.group == group]
        assert row.state == SYNCED, row
    # The group resumes at the destination's end of the replicated data: nothing to read,
    # nothing skipped (the five records sit below its offset).
    committed = Admin(pipe.dest_kafka).group_offsets(group)[(pipe.dest_topic, 0)]
    copied = list(read_partition(pipe.dest_kafka, pipe.dest_topic, 0))
    assert [m.value() for m in copied] == [f"v{i}".encode() for i in range(5)]
    assert committed == (copied[-1].offset() or 0) + 1
    assert _resume(pipe, group, partitions=1) == {0: []}


def test_the_entries_of_a_recreated_destination_topic_are_never_used(pipe: Pipeline) -> None:
    # Kafka gives a topic created again a new id: entries written for the old one (the
    # ids ingress records) are left out, so nothing translates into a log that is gone.
    admin = Admin(pipe.dest_kafka)
    assert admin.topic_id(pipe.dest_topic) is None
    assert admin.create_topic(pipe.dest_topic, 1)
    first = admin.topic_id(pipe.dest_topic)
    assert first
    admin.delete_topics([pipe.dest_topic])

    def created_again() -> bool:
        try:
            return admin.create_topic(pipe.dest_topic, 1)
        except ReplicatorError:
            return False           # still being deleted
    wait_for(created_again, 60, "the topic created again")
    # The broker answers from its metadata, which may still hold the deleted topic for a
    # moment (what the writer's doubt after offsets go back is for).
    wait_for(lambda: admin.topic_id(pipe.dest_topic) not in (None, first), 30, "the new id")
    second = admin.topic_id(pipe.dest_topic)
    assert second
    old = entries_of(list(range(10)), 0, from_origin=True, incarnation=first)
    new = entries_of(list(range(10, 20)), 0, first=10, incarnation=second)
    live = live_entries([*old, *new], admin.topic_id(pipe.dest_topic))
    assert live == new
    assert translate(live, 5, 20).state == "unmapped"
    assert translate(live, 15, 20).offset == 5
