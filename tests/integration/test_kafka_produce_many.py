"""``Producer.produce_many`` on Apache Kafka: the replay hot path (a loop run in C).

Every record arrives once, in order, with its key, value, timestamp and headers, also when
the client's local queue fills mid-batch (the loop stops at the refused record, waits, and
goes on after it); a record the client refuses for good is named by its id.
"""

from __future__ import annotations

import pytest

from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, Producer
from replicator.core.settings import KafkaSettings
from replicator.ops.verify import read_partition
from tests.conftest import FAST_GROUP_CONFIG, RECENT_MS, unique_name

pytestmark = pytest.mark.apache


Headers = list[tuple[str, bytes | None]] | None


def _columns(n: int, *, headers: bool) -> tuple[list[int], list[bytes | None],
                                                list[bytes | None], list[Headers], list[int]]:
    ts = [RECENT_MS + i for i in range(n)]
    keys: list[bytes | None] = [None if i % 7 == 0 else b"k%d" % i for i in range(n)]
    values: list[bytes | None] = [None if i % 11 == 0 else b"v%d" % i for i in range(n)]
    hdrs: list[Headers] = [[("h", b"%d" % i), ("empty", None)] if headers and i % 3 == 0
                           else None for i in range(n)]
    return ts, keys, values, hdrs, [1000 + i for i in range(n)]


@pytest.mark.parametrize("headers", [True, False], ids=["some-headers", "no-headers"])
def test_every_record_arrives_in_order_through_a_full_local_queue(
        dest_brokers: str, headers: bool) -> None:
    # A local queue of 16 messages: a batch of 3,000 fills it over and over.
    kafka = KafkaSettings(brokers=dest_brokers, config={
        **FAST_GROUP_CONFIG, "queue.buffering.max.messages": 16, "linger.ms": 1})
    topic = unique_name("many")
    assert Admin(kafka).create_topic(topic, 2)
    p = Producer(kafka)
    ts, keys, values, hdrs, ids = _columns(3000, headers=headers)
    p.produce_many(topic, 1, ts, keys, values, hdrs, ids)
    assert p.flush(60) == 0
    p.check_deliveries(topic)
    got = list(read_partition(kafka, topic, 1))
    assert [m.value() for m in got] == values
    assert [m.key() for m in got] == keys
    assert [m.timestamp()[1] for m in got] == ts
    assert [m.headers() for m in got] == [
        None if h is None else [(k, v) for k, v in h] for h in hdrs]


def test_a_refused_record_is_named_by_its_id(dest_brokers: str) -> None:
    kafka = KafkaSettings(brokers=dest_brokers, config={
        **FAST_GROUP_CONFIG, "message.max.bytes": 10_000})
    topic = unique_name("many")
    assert Admin(kafka).create_topic(topic, 1)
    p = Producer(kafka, overrides={"message.max.bytes": 10_000})
    ts, keys, values, hdrs, ids = _columns(50, headers=False)
    values[37] = b"x" * 20_000          # larger than the client accepts
    with pytest.raises(ReplicatorError, match=rf"\[0\]@{ids[37]}\b"):
        p.produce_many(topic, 0, ts, keys, values, hdrs, ids)
    assert p.flush(60) == 0
    # Everything before it was enqueued, nothing after it.
    assert [m.value() for m in read_partition(kafka, topic, 0)] == values[:37]


def test_columns_of_different_lengths_are_refused(dest_brokers: str) -> None:
    kafka = KafkaSettings(brokers=dest_brokers, config=FAST_GROUP_CONFIG)
    p = Producer(kafka)
    ts, keys, values, hdrs, ids = _columns(10, headers=False)
    with pytest.raises(ValueError, match="different lengths"):
        p.produce_many("t", 0, ts, keys[:9], values, hdrs, ids)


def test_acknowledgements_are_counted_per_partition_once_per_record(dest_brokers: str) -> None:
    """``track_acks``: a batch is counted by its last record's report; batches of one and
    two records, a batch through a full local queue, the offset map's ends and single
    records all add up to exactly what was produced, per partition."""
    kafka = KafkaSettings(brokers=dest_brokers, config={
        **FAST_GROUP_CONFIG, "queue.buffering.max.messages": 16, "linger.ms": 1})
    topic = unique_name("acks")
    assert Admin(kafka).create_topic(topic, 2)
    p = Producer(kafka, track_acks=True)
    ends: list[tuple[int, int]] = []
    sent = {0: 0, 1: 0}
    for part, n, with_ends in [(0, 1, False), (0, 2, False), (1, 3000, False),
                               (0, 1, True), (1, 2, True), (0, 500, True)]:
        ts, keys, values, hdrs, ids = _columns(n, headers=False)
        p.produce_many(topic, part, ts, keys, values, hdrs, ids,
                       on_ends=(lambda i, r: ends.append((i, r.offset))) if with_ends
                       else None)
        sent[part] += n
    p.produce(topic, b"single", partition=1)
    sent[1] += 1
    assert p.flush(60) == 0
    assert not p.take_failures()
    assert {part: p.done(topic, part) for part in (0, 1)} == sent
    assert sorted(i for i, _ in ends) == [0, 0, 0, 1, 499]


def test_a_failed_record_without_its_own_callback_is_reported() -> None:
    """The producer-wide callback drops successes at once but keeps every failure."""
    from confluent_kafka import KafkaError, Message

    p = Producer(KafkaSettings(brokers="127.0.0.1:1"), track_acks=True)
    p._delivered(None, Message(topic="t", partition=0, offset=5))
    assert p.take_failures() == []
    p._delivered(KafkaError(KafkaError._MSG_TIMED_OUT), Message(topic="t", partition=3))
    failed = p.take_failures("t", 3)
    assert [(f.topic, f.partition) for f in failed] == [("t", 3)]
