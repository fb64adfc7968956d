"""Offset holes at the source, on Apache Kafka: aborted transactions, an open transaction
(the last stable offset) and a topic compacted by the broker's log cleaner.

Egress must copy exactly what a read_committed consumer sees, name its segments so that
they touch (``next.start == prev.end + 1``) across the holes, and never call a hole lost;
ingress must replay the copy without waiting for, or declaring lost, anything. Tansu shows
aborted records to read_committed readers and has no log cleaner, so these run only on a
real broker (``KAFKA_HOME``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from egress.controller import Egress
from ingress.controller import Ingress
from replicator.core.kafka import Admin, Producer
from replicator.core.settings import KafkaSettings
from replicator.ops.verify import read_partition
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)
from tests.integration.test_egress import assert_touching, segment_keys
from tests.integration.test_egress import read_partition as read_segments
from tests.integration.test_ingress import read_topic

pytestmark = pytest.mark.apache


def lost_total(ctl: Egress | Ingress, name: str) -> float:
    return ctl.metrics.total(name)


def replicate_and_verify(pipe: Pipeline, partitions: int, *,
                         before_stop: Callable[[Egress], None] | None = None,
                         done: Callable[[Ingress], bool] | None = None) -> None:
    """Run egress and ingress until the copy equals the source (or ``done()``); check
    segments touch and that nothing was called lost on either side."""
    with running_egress(_egress(pipe)) as eg, running_ingress(pipe.ingress_settings()) as ing:
        if before_stop is not None:
            before_stop(eg)
        if done is not None:
            wait_for(lambda: bool(done(ing)), 90, "the replay")
        else:
            wait_for(lambda: pipe.verify().ok, 90, "the copy to equal the source")
        # Everything consumed: no lag left, transaction markers at the end included.
        wait_for(lambda: [eg.metrics.value(
            "egress_consumer_lag", {"region": SOURCE_REGION, "topic": pipe.topic,
                                    "partition": str(p)}) for p in range(partitions)]
                 == [0] * partitions, 10, "egress lag 0")
        assert lost_total(eg, "egress_source_lost_messages_total") == 0
        assert lost_total(ing, "replicator_ingress_segments_lost_total") == 0
        assert lost_total(ing, "replicator_ingress_segments_late") == 0
    if done is None:
        report = pipe.verify()
        assert report.ok, report_text(report)
    for p in range(partitions):
        keys = segment_keys(pipe.store, pipe.topic, p)
        assert_touching(keys, keys[0].start)


def offsets_left(pipe: Pipeline) -> set[int]:
    """The offsets the source partition 0 still holds."""
    return {o for m in read_partition(pipe.source_kafka, pipe.topic, 0)
            if (o := m.offset()) is not None}


def _egress(pipe: Pipeline) -> Egress:
    return Egress(pipe.egress_settings(max_segment_messages=7), store=pipe.store)


def test_transactional_source_copies_only_committed_records(pipe: Pipeline) -> None:
    """Committed and aborted transactions interleaved on two partitions, and a
    transaction left open while egress runs (read_committed stops at the last stable
    offset) that commits later: the copy holds exactly the committed records."""
    pipe.create_source(2)
    tx = Producer(pipe.source_kafka, transactional_id=unique_name("tx"))
    tx.init_transactions(30)
    sent = {"committed": 0, "aborted": 0}

    def txn(tag: str, n: int, commit: bool, p: Producer = tx) -> None:
        p.begin_transaction()
        for i in range(n):
            p.produce(pipe.topic, value=f"{tag}-{i}".encode(), key=f"k{i}".encode(),
                      partition=i % 2, timestamp=RECENT_MS + i)
        assert p.flush(30) == 0
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
        sent["committed" if commit else "aborted"] += n

    for round_ in range(4):
        txn(f"c{round_}", 10, True)
        txn(f"x{round_}", 6, False)
    # Another producer's transaction stays open: read_committed readers stop before it.
    other = Producer(pipe.source_kafka, transactional_id=unique_name("tx-open"))
    other.init_transactions(30)
    other.begin_transaction()
    for i in range(8):
        other.produce(pipe.topic, value=f"open-{i}".encode(), partition=i % 2,
                      timestamp=RECENT_MS + i)
    assert other.flush(30) == 0
    txn("after-open", 10, True)  # committed, but behind the open transaction

    def segment_values() -> set[bytes | None]:
        return {r.value for p in range(2) for r in read_segments(pipe.store, pipe.topic, p)}

    def commit_the_open_one(eg: Egress) -> None:
        # Egress stops at the last stable offset: nothing past the open transaction yet.
        wait_for(lambda: {b"c3-8", b"c3-9"} <= segment_values(), 30,
                 "the records before the open transaction")
        time.sleep(2)
        assert not any(v is not None and (v.startswith(b"open-") or v.startswith(b"after-"))
                       for v in segment_values()), "egress read past the last stable offset"
        other.commit_transaction(30)
        sent["committed"] += 8

    replicate_and_verify(pipe, 2, before_stop=commit_the_open_one)
    got = [r for p in range(2) for r in read_segments(pipe.store, pipe.topic, p)]
    values = [r.value or b"" for r in got]
    assert not any(v.startswith(b"x") for v in values), "aborted records in segments"
    assert len(got) == sent["committed"] == 58
    # The holes were really there: transaction markers and aborted records take offsets.
    offsets = sorted(r.offset for r in read_segments(pipe.store, pipe.topic, 0))
    assert offsets[-1] - offsets[0] + 1 > len(offsets)


def compact_source(pipe: Pipeline) -> None:
    """Create a one-partition compacted source, write overwritten keys and tombstones, and
    wait until the broker's cleaner has removed the older values and the log settled."""
    # Small segments and an eager cleaner, so compaction happens within seconds (the
    # session brokers run the cleaner every 0.5 s).
    pipe.create_source(1, {"cleanup.policy": "compact", "segment.ms": "200",
                           "min.cleanable.dirty.ratio": "0.01",
                           "min.compaction.lag.ms": "0", "delete.retention.ms": "100"})
    p = Producer(pipe.source_kafka)
    n = 0
    # A segment rolls when a record's timestamp is segment.ms past the segment's first one
    # (record time, not wall time): one second apart per record.
    # Rounds 0-3 write every key, round 4 only the even ones (some as tombstones): what
    # survives is spread out, holes between nearly every pair of records.
    for round_ in range(5):
        for k in range(0, 40, 2 if round_ == 4 else 1):
            value = None if (round_ == 4 and k % 10 == 0) else f"r{round_}-k{k}".encode()
            p.produce(pipe.topic, value=value, key=f"k{k}".encode(), partition=0,
                      timestamp=RECENT_MS + n * 1000)
            n += 1
        assert p.flush(30) == 0
    for _ in range(3):  # the last rounds' segment closes, so it can be cleaned too
        p.produce(pipe.topic, value=b"roll", key=b"roll", partition=0,
                  timestamp=RECENT_MS + n * 1000)
        n += 1
        assert p.flush(30) == 0

    seen: list[int] = []

    def compacted_and_settled() -> bool:
        # The cleaner removed overwritten records, and the topic stopped changing (so the
        # source compared with the copy below is the one egress read).
        seen.append(sum(1 for _ in read_partition(pipe.source_kafka, pipe.topic, 0)))
        return seen[-1] < n - 100 and len(seen) >= 8 and len(set(seen[-8:])) == 1

    wait_for(compacted_and_settled, 90, "the broker to compact the source topic")


def test_compacted_source_topic_has_holes_but_no_loss(pipe: Pipeline) -> None:
    """A source topic compacted by the broker (keys overwritten, tombstones): egress
    copies what is left, segments touch across the removed offsets, no loss reported."""
    compact_source(pipe)
    # A destination that keeps what it gets: with the source's settings (which travel) the
    # destination's own cleaner removes tombstones on its own schedule (delete.retention.ms
    # 100), and the copy is compared record by record below. Ingress reports the differing
    # cleanup.policy and goes on.
    assert Admin(pipe.dest_kafka).create_topic(pipe.dest_topic, 1, {"cleanup.policy": "delete",
                                                                    "retention.ms": "-1"})
    left = offsets_left(pipe)
    end = max(left)
    # The cleaner may still remove a record or two (a tombstone's second pass) while egress
    # reads, so the copy is compared with what egress read, and that with the log.
    replicate_and_verify(pipe, 1, done=lambda ing: pipe.checkpoint_offsets(ing).get(0) == end)
    segments = read_segments(pipe.store, pipe.topic, 0)
    offsets = [r.offset for r in segments]
    now_left = offsets_left(pipe)
    assert now_left <= set(offsets) <= left  # what the compacted log holds, holes included
    assert offsets[-1] - offsets[0] + 1 > len(offsets), "no offset holes: not compacted"
    copy = read_topic(pipe.dest_brokers, pipe.dest_topic)[0]
    assert [(row[1], row[2], row[4]) for row in copy] == \
        [(r.key, r.value, r.timestamp_ms) for r in segments]


def test_source_settings_travel_only_when_set_on_the_topic(pipe: Pipeline) -> None:
    """Apache Kafka describes every topic config with its source; only those set on the
    source topic reach _topic.json and the destination topic, not the cluster's
    defaults (which the destination cluster has its own of)."""
    pipe.create_source(1, {"retention.ms": "172800000", "max.message.bytes": "2000000"})
    p = Producer(pipe.source_kafka)
    p.produce(pipe.topic, value=b"v", partition=0, timestamp=RECENT_MS)
    assert p.flush(30) == 0
    replicate_and_verify(pipe, 1)
    conf = Admin(KafkaSettings(brokers=pipe.dest_brokers)).topic_config(pipe.dest_topic)
    assert conf == {"retention.ms": "172800000", "max.message.bytes": "2000000"}
    meta = pipe.store.get(f"data/{SOURCE_REGION}/{pipe.topic}/_topic.json")
    assert b"segment.bytes" not in meta and b"cleanup.policy" not in meta
