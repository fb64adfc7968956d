"""Ingress against the embedded destination broker (Tansu) and moto (S3 + SQS).

Segments are written straight into the destination bucket with ``formats.segment_io``
(egress is not needed here); S3 notifications reach ingress through a real SQS queue.

Longer than 400 lines: one test per ingress behaviour against the real servers, sharing
the harness at the top (bucket, queue, topics), which other test modules import.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from formats.base import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    SegmentMetadata,
    WriterOptions,
)
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from ingress.controller import Ingress
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, read_to_end
from replicator.core.keys import SegmentKey, topic_meta_key
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import KafkaSettings, Settings, load_settings
from replicator.core.sqs import SqsQueue, make_sqs_client
from replicator.core.wire import Checkpoint
from replicator.devstack.aws import create_bucket, create_queue, set_bucket_notifications
from tests.conftest import FAST_GROUP_CONFIG, RECENT_MS, unique_name

if TYPE_CHECKING:
    from ingress.sink import KafkaSink

REGION = "us-west-1"
SOURCE_REGION = "us-east-1"
FMT = get_format("parquet")


def rich_record(partition: int, offset: int) -> Record:
    """Null keys, tombstones, empty values, duplicate and null headers, both ts types."""
    key = None if offset % 5 == 0 else f"k{offset % 17}".encode()
    value: bytes | None = f"p{partition}-o{offset}-".encode() * 3
    if offset % 7 == 0:
        value = None
    elif offset % 11 == 0:
        value = b""
    headers: tuple[tuple[str, bytes | None], ...] = ()
    if offset % 3 == 0:
        headers = (("h", b"1"), ("h", None), ("dup", b"x"), ("dup", b"x"), ("", b""))
    ts_type = TIMESTAMP_LOG_APPEND_TIME if offset % 4 == 0 else TIMESTAMP_CREATE_TIME
    return Record(offset, RECENT_MS + offset * 10, key, value, headers, ts_type)


@dataclass
class Env:
    """One test's bucket, queue, topics and settings on the shared servers."""

    moto: str
    brokers: str
    bucket: str
    queue: str
    source: str
    dest: str
    data: dict[str, Any]
    store: S3ObjectStore
    s3: Any
    sqs: Any

    def settings(self, **ingress: Any) -> Settings:
        data = json.loads(json.dumps(self.data))
        data["ingress"].update(ingress)
        return load_settings(data=data, environ={})

    def segment_key(self, partition: int, start: int, end: int, level: int = 0,
                    topic: str | None = None) -> SegmentKey:
        return SegmentKey("data", SOURCE_REGION, topic or self.source, partition, level,
                          start, end)

    def write(self, key: SegmentKey, offsets: list[int] | None = None, *,
              make: Callable[[int, int], Record] = rich_record) -> list[Record]:
        offs = offsets if offsets is not None else list(range(key.start, key.end + 1))
        records = [make(key.partition, o) for o in offs]
        up = SegmentUpload(self.store, FMT, "temp", WriterOptions())
        for i in range(0, len(records), 5000):
            up.write_batch(records_to_batch(records[i:i + 5000]))
        temp = up.finish(SegmentMetadata.for_key(key, len(records)))
        publish_segment(self.store, temp.key, key)
        return records

    def write_meta(self, partitions: int, configs: dict[str, str] | None = None,
                   topic: str | None = None) -> None:
        self.store.put(topic_meta_key("data", SOURCE_REGION, topic or self.source),
                       json.dumps({"partitions": partitions,
                                   "configs": configs or {}}).encode())


@pytest.fixture
def env(moto_endpoint: str, dest_brokers: str) -> Env:
    bucket, queue = unique_name("dest"), unique_name("events")
    s3 = make_s3_client(endpoint_url=moto_endpoint, region=REGION, access_key_id="test",
                        secret_access_key="test")
    sqs = make_sqs_client(endpoint_url=moto_endpoint, region=REGION, access_key_id="test",
                          secret_access_key="test")
    create_bucket(s3, bucket, REGION)
    create_queue(sqs, queue)
    set_bucket_notifications(s3, bucket, SqsQueue(sqs, queue).arn, prefix="data/")
    source = unique_name("src")
    data = {
        "region": REGION,
        "s3": {"bucket": bucket, "endpoint_url": moto_endpoint, "access_key_id": "test",
               "secret_access_key": "test"},
        "kafka": {"brokers": dest_brokers, "config": dict(FAST_GROUP_CONFIG)},
        "metrics": {"port": 0},
        "ingress": {
            "group_id": unique_name("ingress"),
            "sqs_queue": queue,
            "segment_events_topic": unique_name("events"),
            "checkpoint_topic": unique_name("checkpoints"),
            "batch_size": 500,
            "sqs_wait_time": "1s",
            "topic_check_interval": "500ms",
            "rescan_interval": "30s",
            "revoke_timeout": "10s",
            "sources": [{"region": SOURCE_REGION, "topic": source,
                         "destination_topic": source + ".copy",
                         "lost_segment_timeout": "30s", "late_segment_retries": 3,
                         "first_segment_delay": "0s"}],
        },
    }
    store = S3ObjectStore(s3, bucket)
    return Env(moto_endpoint, dest_brokers, bucket, queue, source, source + ".copy", data,
               store, s3, sqs)


@contextmanager
def running(settings: Settings, **kw: Any) -> Iterator[Ingress]:
    """An ``Ingress`` running ``run()`` in a thread; stopped and closed on exit.

    Each one is its own instance (``ingress.instance_id``, unique unless the settings name
    one): on one host, instances would otherwise share the host name in their
    transactional.id and fence each other.
    """
    ingress_cfg = settings.ingress
    if ingress_cfg is not None and ingress_cfg.instance_id is None:
        settings = settings.model_copy(update={"ingress": ingress_cfg.model_copy(
            update={"instance_id": unique_name("instance")})})
    ing = Ingress(settings, **kw)
    ing.start()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            ing.run()
        except BaseException as e:
            errors.append(e)
            raise

    t = threading.Thread(target=target, name="ingress-run", daemon=True)
    t.start()
    try:
        yield ing
    finally:
        ing.stop()
        t.join(30)
        ing.close()
    assert not errors, errors


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


Row = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int, int]


def read_topic(brokers: str, topic: str, *, timeout: float = 20) -> dict[int, list[Row]]:
    """Every record of ``topic`` (read_committed) by partition: (partition, key, value,
    headers, timestamp, timestamp type)."""
    kafka = KafkaSettings(brokers=brokers)
    n = Admin(kafka).partition_count(topic)
    if n is None:
        raise KeyError(topic)
    out: dict[int, list[Row]] = {p: [] for p in range(n)}
    for m in read_to_end(kafka, topic, partitions=list(out), timeout=timeout):
        ts_type, ts = m.timestamp()
        p = m.partition()
        assert p is not None
        out[p].append((p, m.key(), m.value(), list(m.headers() or []), ts, ts_type))
    return out


def expected_rows(partition: int, records: list[Record]) -> list[Row]:
    # LogAppendTime sources keep their broker time, as CreateTime, in the copy.
    return [(partition, r.key, r.value, list(r.headers), r.timestamp_ms, TIMESTAMP_CREATE_TIME)
            for r in records]


def count(brokers: str, topic: str) -> int:
    try:
        return sum(len(v) for v in read_topic(brokers, topic, timeout=5).values())
    except (AssertionError, KeyError, ReplicatorError):
        return -1


def checkpoints(brokers: str, topic: str) -> dict[str, list[Checkpoint]]:
    out: dict[str, list[Checkpoint]] = {}
    for m in read_to_end(KafkaSettings(brokers=brokers), topic, timeout=15):
        key = m.key()
        assert key is not None
        out.setdefault(key.decode(), []).append(Checkpoint.decode(m.value()))
    return out


def send_fake_event(env: Env, key: SegmentKey) -> None:
    """An S3 'created' event for a key that does not exist (yet)."""
    body = {"Records": [{"eventName": "ObjectCreated:Put", "eventTime": "2026-01-01T00:00:00Z",
                         "s3": {"bucket": {"name": env.bucket},
                                "object": {"key": key.to_key(), "size": 1}}}]}
    env.sqs.send_message(QueueUrl=SqsQueue(env.sqs, env.queue).url, MessageBody=json.dumps(body))


# --- tests -----------------------------------------------------------------------------


def test_replays_identically_through_out_of_order_duplicate_and_deleted_events(
        env: Env, broker_kind: str) -> None:
    """Two partitions with rich records; the destination is created from _topic.json.

    Partition 0: segments written newest first, a multipart-sized one (moto sends two events),
    an event that arrives before its object exists, and a level-0 segment deleted while its
    event is queued but covered by a compacted one. Partition 1: offsets with holes (segments
    touch by position), and a segment overlapping its neighbour.
    """
    env.write_meta(2, {"retention.ms": "86400000", "cleanup.policy": "delete",
                       "message.timestamp.type": "LogAppendTime"})
    # Partition 0, newest first.
    env.write(env.segment_key(0, 600, 899))
    env.write(env.segment_key(0, 300, 599))
    early = env.segment_key(0, 900, 999)
    level0 = env.segment_key(0, 0, 149)
    env.write(level0)
    env.write(env.segment_key(0, 150, 299))
    env.write(env.segment_key(0, 0, 299, level=1))
    env.store.delete(level0.to_key())  # compaction removed it; its events are queued
    expected = {0: [rich_record(0, o) for o in range(1000)]}
    # Partition 1: even offsets only; a segment ends on its last record.
    evens = list(range(0, 400, 2))
    env.write(env.segment_key(1, 0, 198), evens[:100])
    env.write(env.segment_key(1, 100, 398), [o for o in evens if o >= 100])  # overlaps
    expected[1] = [rich_record(1, o) for o in evens]

    settings = env.settings()
    with running(settings) as ing:
        wait_for(lambda: count(env.brokers, env.dest) >= 1000 - 100 + 200, 40,
                 "first replay")
        send_fake_event(env, early)  # an event that comes before its object
        wait_for(lambda: ing.metrics.total("replicator_ingress_segments_missing_total") >= 1,
                 20, "the announced object to be found missing")
        env.write(early)  # now the object exists
        wait_for(lambda: count(env.brokers, env.dest) >= 1200, 20, "late object")
        assert ing.metrics.total("replicator_ingress_sqs_events_received_total") >= 8
        assert ing.metrics.total("replicator_ingress_sqs_events_ignored_total") >= 1  # meta
        assert ing.metrics.total("replicator_ingress_segments_lost_total") == 0

    got = read_topic(env.brokers, env.dest)
    assert got[0] == expected_rows(0, expected[0])
    assert got[1] == expected_rows(1, expected[1])
    admin = Admin(settings.kafka)
    assert admin.partition_count(env.dest) == 2
    conf = admin.topic_config(env.dest)
    if broker_kind == "apache":  # Tansu describes a topic's settings as defaults
        assert conf == {"retention.ms": "86400000", "cleanup.policy": "delete"}
    cps = checkpoints(env.brokers, settings.ingress.checkpoint_topic)  # type: ignore[union-attr]
    key0 = f"{SOURCE_REGION}:{env.source}:0:{env.dest}"
    assert cps[key0][-1].offset == 999
    offsets = [c.offset for c in cps[key0]]
    assert offsets == sorted(set(offsets))  # checkpoints only move forward
    assert cps[f"{SOURCE_REGION}:{env.source}:1:{env.dest}"][-1].offset == 398


def test_late_lost_and_corrupt_segments(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """Partition 0: a held-back segment arrives within the timeout and replay continues.
    Partition 1: a segment that never arrives is declared lost with its exact range.
    Partition 2: a corrupt object at a valid key is reported, no crash loop, others fine.
    """
    env.write_meta(3)
    env.data["ingress"]["sources"][0]["lost_segment_timeout"] = "4s"
    settings = env.settings()

    exp0 = env.write(env.segment_key(0, 0, 99))
    held = env.segment_key(0, 100, 199)
    env.write(env.segment_key(0, 200, 299))
    exp1 = env.write(env.segment_key(1, 0, 49))
    exp1_after = env.write(env.segment_key(1, 100, 149))   # 50-99 never arrives
    env.store.put(env.segment_key(2, 0, 49).to_key(), b"PAR1 this is not a segment")
    exp2 = env.write(env.segment_key(2, 50, 99))
    with caplog.at_level(logging.INFO), running(settings) as ing:
        lbl = {"region": SOURCE_REGION, "topic": env.source}
        wait_for(lambda: (ing.metrics.value("replicator_ingress_segments_late",
                                            {**lbl, "partition": "0"}) or 0) == 100, 30,
                 "partition 0 late")
        exp0 += env.write(held)
        exp0 += [rich_record(0, o) for o in range(200, 300)]
        wait_for(lambda: (ing.metrics.value("replicator_ingress_checkpoint_offset",
                                            {**lbl, "partition": "0"}) or 0) == 299, 20,
                 "partition 0 after the held-back segment")
        wait_for(lambda: ing.metrics.value("replicator_ingress_segments_lost_total",
                                           {**lbl, "partition": "1"}) == 1, 20, "lost range")
        wait_for(lambda: (ing.metrics.value("replicator_ingress_checkpoint_offset",
                                            {**lbl, "partition": "1"}) or 0) == 149, 20,
                 "partition 1 after the lost range")
        assert ing.metrics.value("replicator_ingress_messages_lost_total",
                                 {**lbl, "partition": "1"}) == 50
        wait_for(lambda: (ing.metrics.value("replicator_ingress_checkpoint_offset",
                                            {**lbl, "partition": "2"}) or 0) == 99, 20,
                 "partition 2 after the corrupt segment")
        # Read once from the first listing, and at most once more if the object's own
        # "created" event arrives after that read (an event makes a bad segment worth one
        # more try: the object may have been replaced). Never in a loop.
        assert ing.metrics.value("replicator_ingress_segments_corrupt_total",
                                 {**lbl, "partition": "2"}) in (1, 2)
        assert ing.metrics.total("replicator_ingress_worker_errors_total") == 0  # no loops
    got = read_topic(env.brokers, env.dest)
    assert got[0] == expected_rows(0, exp0)
    assert got[1] == expected_rows(1, exp1 + exp1_after)
    assert got[2] == expected_rows(2, exp2)
    lost = [r.getMessage() for r in caplog.records if "LOST" in r.getMessage()]
    assert len(lost) == 2, lost
    assert any(f"{env.source}[1]" in m and "positions 50-99 (50)" in m for m in lost), lost
    assert any(f"{env.source}[2]" in m and "positions 0-49 (50)" in m for m in lost), lost
    assert any(r.levelno == logging.ERROR and "cannot be read" in r.getMessage()
               and "/2/0/" in r.getMessage() for r in caplog.records)


def test_destination_with_too_few_partitions(env: Env, broker_kind: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """The destination topic exists with 2 partitions, the source has 4. Apache Kafka grows
    it (CreatePartitions) and every partition is replayed; a broker that refuses (Tansu
    implements no CreatePartitions) gets that source stopped loudly, naming both counts."""
    env.write_meta(4)
    settings = env.settings()
    admin = Admin(settings.kafka)
    admin.create_topic(env.dest, 2)
    expected = {p: env.write(env.segment_key(p, 0, 29)) for p in range(4)}
    with caplog.at_level(logging.INFO), running(settings) as ing:
        lbl = {"region": SOURCE_REGION, "topic": env.source}
        if broker_kind == "tansu":
            wait_for(lambda: ing.metrics.value("replicator_ingress_source_errors_total",
                                               {**lbl, "reason": "partitions"}) == 1, 20,
                     "the source to be stopped")
            assert not any(w[1] == env.source for w in ing.workers)
        else:
            for p in range(4):
                def replayed(p: int = p) -> bool:
                    return ing.metrics.value("replicator_ingress_checkpoint_offset",
                                             {**lbl, "partition": str(p)}) == 29

                wait_for(replayed, 30, f"partition {p} replayed")
            assert ing.metrics.total("replicator_ingress_source_errors_total") == 0
    if broker_kind == "tansu":
        stopped = [r.getMessage() for r in caplog.records if "STOPPED" in r.getMessage()]
        assert stopped and "has 2 partition(s) but the source has 4" in stopped[0]
        assert admin.partition_count(env.dest) == 2
        return
    assert admin.partition_count(env.dest) == 4
    assert any(f"grew destination topic {env.dest} from 2 to 4" in r.getMessage()
               for r in caplog.records)
    got = read_topic(env.brokers, env.dest)
    assert {p: got[p] for p in range(4)} == {p: expected_rows(p, expected[p])
                                             for p in range(4)}


def test_two_instances_split_partitions_and_rebalance(env: Env) -> None:
    """A second instance joins mid-replay and a member leaves: every record once, in order."""
    parts = 4
    env.write_meta(parts)
    per = 2000
    for p in range(parts):
        env.write(env.segment_key(p, 0, per - 1), make=_plain)
    settings = env.settings(batch_size=200)
    total_first = parts * per
    with running(settings) as a:
        wait_for(lambda: len(a.workers) == parts, 30, "first instance to own everything")
        with running(settings) as b:
            wait_for(lambda: len(a.workers) + len(b.workers) == parts
                     and len(a.workers) > 0 and len(b.workers) > 0, 30, "a split")
            wait_for(lambda: count(env.brokers, env.dest) >= total_first, 40, "first round")
            for p in range(parts):  # new segments arrive while both run (events → owners)
                env.write(env.segment_key(p, per, 2 * per - 1), make=_plain)
            wait_for(lambda: count(env.brokers, env.dest) >= 2 * total_first, 40,
                     "second round")
        # b left: a takes every partition back and replays what comes next.
        wait_for(lambda: len(a.workers) == parts, 30, "a to own everything again")
        for p in range(parts):
            env.write(env.segment_key(p, 2 * per, 3 * per - 1), make=_plain)
        wait_for(lambda: count(env.brokers, env.dest) >= 3 * total_first, 40, "third round")
    got = read_topic(env.brokers, env.dest)
    for p in range(parts):
        assert [r[1] for r in got[p]] == [b"k%d" % o for o in range(3 * per)], f"partition {p}"


def _plain(partition: int, offset: int) -> Record:
    return Record(offset, RECENT_MS + offset, b"k%d" % offset, b"v" * 100, (),
                  TIMESTAMP_CREATE_TIME)


def sinks_of_one_id(env: Env) -> Callable[[], KafkaSink]:
    """Started transactional sinks of one ``transactional.id`` into a new destination
    topic (each fences the one before)."""
    from ingress.sink import KafkaSink

    settings = env.settings()
    admin = Admin(settings.kafka)
    admin.create_topic(env.dest, 1)
    admin.create_topic("cp-" + env.dest, 1)
    tid = unique_name("tid")

    def sink() -> KafkaSink:
        s = KafkaSink(settings.kafka, topic=env.dest, partition=0,
                      checkpoint_topic="cp-" + env.dest, transactional_id=tid, timeout=10)
        s.start()
        return s
    return sink


def test_a_new_owner_fences_the_old_producer(env: Env, broker_kind: str) -> None:
    """Same transactional.id: the newer sink fences the older; its commit raises
    ProducerFenced (a worker then starts a new session only while its process still owns
    the partition; a revoked one has stopped already) and nothing of it is committed
    after the fence (on Apache Kafka a read_committed reader sees only the new owner's
    record; Tansu shows aborted transactions' records too)."""
    from ingress.rows import Rows
    from replicator.core.errors import ProducerFenced

    sink = sinks_of_one_id(env)

    def rows(o: int) -> Rows:
        return Rows([o], [RECENT_MS], [b"k"], [b"v%d" % o], [None])

    old = sink()
    old.begin()
    old.produce(rows(0))
    new = sink()  # fences old; old's open transaction is aborted by the broker
    with pytest.raises(ProducerFenced):
        old.produce_checkpoint("k", Checkpoint(0, "s", datetime_now()))
        old.commit()
    old.abort()  # a no-op now: nothing to abort for a fenced producer
    old.close()
    new.begin()
    new.produce(rows(1))
    new.produce_checkpoint("k", Checkpoint(1, "s", datetime_now()))
    new.commit()
    new.close()
    assert [c.offset for c in checkpoints(env.brokers, "cp-" + env.dest)["k"]] == [1]
    if broker_kind == "apache":
        assert [r[2] for r in read_topic(env.brokers, env.dest)[0]] == [b"v1"]


def test_a_producer_fenced_in_the_background_raises_fenced_on_its_next_record(
        env: Env) -> None:
    """The client learns of the fence from a produce request in flight and fails for
    good; every later record is refused with a bare "fatal error". The error raised is
    still ProducerFenced (the worker stops the session, not the process), also when the
    fatal error's one report was already taken by a poll."""
    from ingress.rows import Rows
    from replicator.core.errors import ProducerFenced

    sink = sinks_of_one_id(env)

    old = sink()
    old.begin()
    new = sink()
    old.produce(Rows([0], [RECENT_MS], [b"k"], [b"v0"], [None]))  # sent after the fence
    deadline = time.monotonic() + 30
    fatal = False
    while not fatal and time.monotonic() < deadline:
        try:
            old.producer.poll(0.2)
        except ProducerFenced:  # the fatal error's one report, taken here
            fatal = True
    assert fatal
    with pytest.raises(ProducerFenced):
        old.produce_checkpoint("k", Checkpoint(0, "s", datetime_now()))
    old.close()
    new.close()


def datetime_now() -> datetime:
    return datetime.now(UTC)
