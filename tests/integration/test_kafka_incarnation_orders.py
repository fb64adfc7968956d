"""A source topic deleted and created again in the orders of events users meet, on Apache
Kafka (docs/architecture.md, "Topic incarnations"): recreated with fewer partitions while
the tail of the higher ones is not replayed yet, with more partitions, idle since egress
restarted, twice in a row, and while egress is down.

Each scenario compares the destination (read_committed) record by record with every
record of every incarnation, per partition: the earlier topic's records, then the next
one's, each exactly once. No loss is reported (ingress's lost and skipped counters,
egress's lost counter, no ERROR of the replicator's loggers) and no archived object of an
earlier incarnation changes. Each new incarnation gets more records than the one before,
so its log reaches past every position archived earlier; while egress runs, its first
record is archived before the others are produced (``produce_to_the_new_topic``).

The scenarios share the session's brokers and moto server; each has its own topic,
bucket, queue and groups (the ``pipe`` fixture), so they cost only their own egress and
ingress start-ups (a few seconds each).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from egress.controller import Egress
from ingress.controller import Ingress
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, Producer, read_to_end
from replicator.core.keys import BASE_INCARNATION, SegmentKey
from replicator.core.wire import TopicMetadata
from replicator.devstack.processes import free_port
from replicator.devstack.toml_writer import write_toml
from tests.chaos.harness import metric_values
from tests.conftest import FAST_GROUP_CONFIG
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    running_egress,
    running_ingress,
    topic_id_of,
    wait_for,
)

pytestmark = pytest.mark.apache

Expected = dict[int, list[bytes]]
"""Per destination partition, every record value in the order it must arrive."""

REPLICATOR_LOGGERS = ("egress", "ingress", "replicator")


def produce(pipe: Pipeline, tag: str, partitions: int | range, n: int,
            expected: Expected, *, first: int = 0) -> None:
    """``n`` records into each of ``partitions`` (a count: the first ones) of the source
    topic, appended to ``expected``."""
    p = Producer(pipe.source_kafka)
    for part in range(partitions) if isinstance(partitions, int) else partitions:
        for i in range(first, first + n):
            value = f"{tag}-{part}-{i}".encode()
            p.produce(pipe.topic, value=value, partition=part)
            expected.setdefault(part, []).append(value)
    assert p.flush(30) == 0
    assert not p.take_failures()


def recreate(pipe: Pipeline, admin: Admin, partitions: int) -> str:
    """Delete the source topic and create it again with ``partitions``; its new id."""
    old_id = admin.topic_id(pipe.topic)
    admin.delete_topics([pipe.topic])

    def created_again() -> bool:
        try:
            return admin.create_topic(pipe.topic, partitions)
        except ReplicatorError:
            return False               # still being deleted
    wait_for(created_again, 60, "the topic created again")
    wait_for(lambda: admin.topic_id(pipe.topic) not in (None, old_id), 30, "the new topic id")
    new_id = admin.topic_id(pipe.topic)
    assert new_id is not None
    return new_id


def produce_to_the_new_topic(pipe: Pipeline, tag: str, partitions: int, n: int,
                             expected: Expected) -> None:
    """``n`` records into each partition of a topic just created again while egress runs:
    one first, archived before the others are produced, then the rest.

    The first record keeps the new log shorter than the position egress reads the earlier
    topic from, so egress sees the offsets go back (a reset). Records produced past that
    position before egress's next fetch would be fetched with no reset: which topic they
    came from cannot be told then, they are dropped and read again from the new topic's
    oldest record (docs/architecture.md "Topic incarnations"), an order only
    ``test_records_produced_past_the_read_position_before_egress_fetches_again`` makes.
    """
    done = sum(archived(pipe).values())
    produce(pipe, tag, partitions, 1, expected)
    wait_archived(pipe, done + partitions, "the new topic's first records archived")
    produce(pipe, tag, partitions, n - 1, expected, first=1)


def archive(pipe: Pipeline) -> dict[str, tuple[str, bytes]]:
    """Every segment object of the source topic: key -> (etag, bytes)."""
    prefix = f"data/{SOURCE_REGION}/{pipe.topic}/"
    return {o.key: (o.etag, pipe.store.get(o.key)) for o in pipe.store.list(prefix)
            if SegmentKey.try_parse(o.key) is not None}


def archived(pipe: Pipeline) -> dict[tuple[str, int], int]:
    """Positions archived per (incarnation, partition), level-0 segments."""
    out: dict[tuple[str, int], int] = defaultdict(int)
    for o in pipe.store.list(f"data/{SOURCE_REGION}/{pipe.topic}/"):
        k = SegmentKey.try_parse(o.key)
        if k is not None and k.level == 0:
            out[(k.incarnation, k.partition)] += k.span
    return dict(out)


def wait_archived(pipe: Pipeline, total: int, what: str) -> None:
    wait_for(lambda: sum(archived(pipe).values()) >= total, 60, what)


def destination(pipe: Pipeline) -> dict[int, list[bytes | None]]:
    out: dict[int, list[bytes | None]] = defaultdict(list)
    for m in read_to_end(pipe.dest_kafka, pipe.dest_topic, timeout=30):
        part = m.partition()
        assert part is not None
        out[part].append(m.value())
    return dict(out)


def wait_replayed(pipe: Pipeline, expected: Expected, what: str, timeout: float = 90) -> None:
    """Until the destination holds as many records as ``expected``, then exactly them."""
    total = sum(len(v) for v in expected.values())

    def count() -> int:
        try:
            return sum(len(v) for v in destination(pipe).values())
        except ReplicatorError:
            return 0                   # the destination topic is not there yet
    wait_for(lambda: count() >= total, timeout, what)
    got = destination(pipe)
    assert {p: got.get(p, []) for p in expected} == expected
    assert sum(len(v) for v in got.values()) == total, "records in unexpected partitions"


def assert_nothing_lost(ing: Ingress | None, egresses: Sequence[Egress],
                        caplog: pytest.LogCaptureFixture) -> None:
    if ing is not None:
        for name in ("messages_lost", "messages_skipped", "segments_lost",
                     "late_after_lost_messages"):
            assert ing.metrics.total(f"replicator_ingress_{name}_total") == 0, name
    for eg in egresses:
        assert eg.metrics.total("egress_source_lost_messages_total") == 0
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records
              if r.levelno >= logging.ERROR and r.name.startswith(REPLICATOR_LOGGERS)
              and not unrelated(r.getMessage())]
    assert not errors, errors


def unrelated(message: str) -> bool:
    """An ERROR that is no report about the records (seen on Apache Kafka at ingress's first
    start: the configs of the destination topic it just created described before the broker
    knows it, retried at the next check)."""
    return "cannot compare the configs of destination topic" in message \
        and "Unknown topic or partition" in message


def meta(pipe: Pipeline) -> TopicMetadata:
    return TopicMetadata.parse(
        pipe.store.get(f"data/{SOURCE_REGION}/{pipe.topic}/_topic.json"), where="t")


@contextmanager
def egress_of(pipe: Pipeline, started: list[Egress]) -> Iterator[Egress]:
    eg = Egress(pipe.egress_settings(max_segment_messages=10), store=pipe.store)
    started.append(eg)
    with running_egress(eg):
        yield eg


def test_recreated_with_fewer_partitions_before_the_tail_of_the_higher_ones_is_replayed(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    """4 partitions recreated with 2 while ingress is down and partitions 2-3 of the
    first topic still have records it has not replayed: ingress replays that tail, though
    ``_topic.json`` now says 2 partitions."""
    admin, expected, egresses = Admin(pipe.source_kafka), Expected(), list[Egress]()
    pipe.create_source(4)
    produce(pipe, "a", 4, 15, expected)
    caplog.set_level(logging.WARNING)
    with egress_of(pipe, egresses):
        with running_ingress(pipe.ingress_settings()) as ing:
            wait_replayed(pipe, expected, "the first topic's head replayed")
            assert_nothing_lost(ing, [], caplog)
        produce(pipe, "a-tail", range(2, 4), 20, expected)     # 0-1 end with the head
        wait_archived(pipe, 4 * 15 + 2 * 20, "the tail of partitions 2-3 archived")
        before = archive(pipe)
        recreate(pipe, admin, 2)
        produce_to_the_new_topic(pipe, "b", 2, 40, expected)
        wait_archived(pipe, 4 * 15 + 2 * 20 + 2 * 40, "the new topic archived")
        with running_ingress(pipe.ingress_settings()) as ing:
            wait_replayed(pipe, expected, "the tail of 2-3 and the new topic replayed")
            assert_nothing_lost(ing, egresses, caplog)
    after = archive(pipe)
    assert {k: after[k] for k in before} == before
    assert [i.partitions for i in meta(pipe).incarnations] == [4, 2]


def test_recreated_with_more_partitions(pipe: Pipeline,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """2 partitions recreated with 4 while egress and ingress run: the destination grows
    to 4 and partitions 2-3 hold only the new topic's records."""
    admin, expected, egresses = Admin(pipe.source_kafka), Expected(), list[Egress]()
    pipe.create_source(2)
    produce(pipe, "a", 2, 20, expected)
    caplog.set_level(logging.WARNING)
    with egress_of(pipe, egresses), running_ingress(pipe.ingress_settings()) as ing:
        wait_replayed(pipe, expected, "the first topic replayed")
        before = archive(pipe)
        recreate(pipe, admin, 4)
        produce_to_the_new_topic(pipe, "b", 4, 30, expected)
        wait_replayed(pipe, expected, "the new topic replayed after the first")
        assert_nothing_lost(ing, egresses, caplog)
    after = archive(pipe)
    assert {k: after[k] for k in before} == before
    assert [i.partitions for i in meta(pipe).incarnations] == [2, 4]


def test_an_idle_topic_recreated_after_egress_restarted(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    """Egress restarts after the first topic's last record (it names no segment after
    the restart), then the topic is recreated: the new topic gets its own location and the
    first one's segments stay as they are."""
    admin, expected, egresses = Admin(pipe.source_kafka), Expected(), list[Egress]()
    pipe.create_source(2)
    first_id = topic_id_of(admin, pipe.topic)
    produce(pipe, "a", 2, 20, expected)
    caplog.set_level(logging.WARNING)
    with running_ingress(pipe.ingress_settings()) as ing:
        with egress_of(pipe, egresses):
            wait_archived(pipe, 40, "the first topic archived")
        wait_replayed(pipe, expected, "the first topic replayed")
        before = archive(pipe)
        with egress_of(pipe, egresses) as eg:
            wait_for(lambda: eg.metrics.total("egress_assigned_partitions") == 2, 30,
                     "the restarted egress assigned the idle topic")
            second_id = recreate(pipe, admin, 2)
            produce_to_the_new_topic(pipe, "b", 2, 30, expected)
            wait_replayed(pipe, expected, "the new topic replayed after the first")
            assert_nothing_lost(ing, egresses, caplog)
    after = archive(pipe)
    assert {k: after[k] for k in before} == before
    assert [i.topic_id for i in meta(pipe).incarnations] == [first_id, second_id]


def test_two_recreates_in_a_row(pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    """A, then B, then C, each with records, while ingress is down after A: ingress
    steps from A's end through B to C, skipping neither."""
    admin, expected, egresses = Admin(pipe.source_kafka), Expected(), list[Egress]()
    pipe.create_source(2)
    ids = [topic_id_of(admin, pipe.topic)]
    produce(pipe, "a", 2, 10, expected)
    caplog.set_level(logging.WARNING)
    with egress_of(pipe, egresses):
        with running_ingress(pipe.ingress_settings()) as ing:
            wait_replayed(pipe, expected, "A replayed")
        before = archive(pipe)
        ids.append(recreate(pipe, admin, 2))
        produce_to_the_new_topic(pipe, "b", 2, 20, expected)
        wait_archived(pipe, 2 * 10 + 2 * 20, "B archived")
        ids.append(recreate(pipe, admin, 2))
        produce_to_the_new_topic(pipe, "c", 2, 30, expected)
        wait_archived(pipe, 2 * 10 + 2 * 20 + 2 * 30, "C archived")
        with running_ingress(pipe.ingress_settings()) as ing:
            wait_replayed(pipe, expected, "B then C replayed after A")
            assert_nothing_lost(ing, egresses, caplog)
    after = archive(pipe)
    assert {k: after[k] for k in before} == before
    assert [i.topic_id for i in meta(pipe).incarnations] == ids
    assert len({inc for inc, _p in archived(pipe)}) == 3


def test_recreated_while_egress_is_down(pipe: Pipeline,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """Egress stops, the topic is deleted, created again and gets more records than the
    first one had (Kafka deleted the group's offsets with the topic): the restarted egress
    archives the new topic from its first record in its own location."""
    admin, expected, egresses = Admin(pipe.source_kafka), Expected(), list[Egress]()
    pipe.create_source(2)
    first_id = topic_id_of(admin, pipe.topic)
    produce(pipe, "a", 2, 20, expected)
    caplog.set_level(logging.WARNING)
    with running_ingress(pipe.ingress_settings()) as ing:
        with egress_of(pipe, egresses):
            wait_replayed(pipe, expected, "the first topic replayed")
        before = archive(pipe)
        second_id = recreate(pipe, admin, 2)
        produce(pipe, "b", 2, 35, expected)
        with egress_of(pipe, egresses):
            wait_replayed(pipe, expected, "the new topic replayed after the first")
            assert_nothing_lost(ing, egresses, caplog)
    after = archive(pipe)
    assert {k: after[k] for k in before} == before
    assert [i.topic_id for i in meta(pipe).incarnations] == [first_id, second_id]


@contextmanager
def egress_process(pipe: Pipeline, directory: Path
                   ) -> Iterator[tuple[subprocess.Popen[bytes], Callable[..., float]]]:
    """A ``replicator-egress`` process of the pipeline (one that can be frozen with
    SIGSTOP) and a reader of its metrics."""
    port = free_port()
    cfg = directory / "egress.toml"
    write_toml(cfg, {
        "region": SOURCE_REGION,
        "s3": {"bucket": pipe.bucket, "endpoint_url": pipe.moto, "access_key_id": "test",
               "secret_access_key": "test"},
        # A session that outlives the freeze: the member keeps its partitions; and
        # librdkafka's default metadata refresh (5 min), as in production: the thawed
        # consumer fetches before any refresh could show it the recreate.
        "kafka": {"brokers": pipe.source_brokers,
                  "config": {**FAST_GROUP_CONFIG, "session.timeout.ms": 30000,
                             "topic.metadata.refresh.interval.ms": 300000}},
        "metrics": {"host": "127.0.0.1", "port": port},
        "egress": {"group_id": pipe.egress_group, "shutdown_timeout": "10s",
                   "topic_metadata_interval": "1s",
                   "topics": {pipe.topic: {"max_segment_messages": 10,
                                           "max_segment_age": "500ms"}}}})
    exe = Path(sys.executable).parent / "replicator-egress"
    with open(directory / "egress.log", "wb") as out:
        proc = subprocess.Popen([str(exe), "--config", str(cfg)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)

    def metric(name: str, missing: float = 0.0) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                values = metric_values(r.read().decode(), name)
        except OSError:
            return -1.0
        return sum(values.values()) if values else missing
    try:
        yield proc, metric
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted at the end"])
def test_records_produced_past_the_read_position_before_egress_fetches_again(
        pipe: Pipeline, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        restarted: bool) -> None:
    """Egress is frozen (SIGSTOP, its session outlasting it) at the end of the first topic
    (20 records, all archived) while the topic is deleted, created again and given 30
    records: thawed, its fetch at position 20 returns the new topic's records 20-29 with
    no sign of the recreate. Every record of both topics is archived (the new one's read
    again from its oldest); none may be reported lost: the first topic's last known high
    watermark (20) says it was read to its end (egress/recreate_loss.py).

    ``restarted``: egress restarted at the end of the first topic first, so no segment is
    named (no topic id read) after its assignment: the idle partition's watermark says
    where the topic ended."""
    admin, expected = Admin(pipe.source_kafka), Expected()
    pipe.create_source(1)
    produce(pipe, "a", 1, 20, expected)
    if restarted:
        (tmp_path / "first").mkdir()
        with egress_process(pipe, tmp_path / "first"):
            wait_archived(pipe, 20, "the first topic archived")
    with egress_process(pipe, tmp_path) as (proc, metric):
        wait_archived(pipe, 20, "the first topic archived")
        if restarted:
            wait_for(lambda: metric("replicator_egress_assigned_partitions") == 1, 30,
                     "the partition assigned again")
            # A premise, not an assertion: fetch responses (their watermark) and a tick of
            # the idle partition before the freeze (every 0.5 s and 1 s); nothing shows
            # them outside the process. Missed, the ERROR says "its end is not known".
            time.sleep(5)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            recreate(pipe, admin, 1)
            produce(pipe, "c", 1, 30, expected)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        try:
            # One more record once those are fetched: egress stops waiting for a reset
            # (30 s) as soon as records of the same epoch come after the segment.
            wait_for(lambda: metric("replicator_egress_messages_total") >= 30, 60,
                     "the records after the thaw fetched")
            produce(pipe, "c", 1, 1, expected, first=30)
            wait_for(lambda: archived(pipe).get((BASE_INCARNATION, 0)) == 20 and sum(
                archived(pipe).values()) == 51, 60, "the new topic archived in full")
        except AssertionError as e:     # a premise, not the finding
            pytest.fail(f"premise: {e}; archived {archived(pipe)}")
        lost = metric("replicator_egress_source_lost_messages_total")
        either = metric("replicator_egress_recreate_unattributed_positions_total")
    log_text = (tmp_path / "egress.log").read_text()
    saw = [m for m in ("beyond the source log", "before the resume position",
                       "no committed offset", "lost (another member") if m in log_text]
    if saw:     # egress saw the recreate (a reset, a new assignment): not this order
        pytest.skip(f"premise not reached: egress logged {saw}")
    errors = [line for line in log_text.splitlines() if " ERROR " in line]
    assert lost == 0, f"{lost} reported lost: " + " | ".join(errors)
    assert not errors, errors
    assert "the new topic is read from its oldest record" in log_text
    # The dropped records were fetched after the first topic's id was last read: reported
    # as either topic's (they were the new one's, read again), never as lost.
    assert 1 <= either <= 31, either
    caplog.set_level(logging.WARNING)
    with running_ingress(pipe.ingress_settings()) as ing:
        wait_replayed(pipe, expected, "both topics replayed, each exactly once")
        assert_nothing_lost(ing, [], caplog)
