"""A purged sink delivers nothing more, on Apache Kafka (the at-least-once worker that
missed its revoke deadline: ``ReplaySink.purge`` before the partition is released).

Records are enqueued with a long linger so they sit in the client's queue; the purge drops
them, every later produce is refused, and the partition holds only what was acknowledged
before the purge.
"""

from __future__ import annotations

import pytest

from ingress.acks import SharedAcks, SharedAckSink
from ingress.rows import Rows
from ingress.sink import KafkaSink
from replicator.core.errors import KafkaFatalError, KafkaRetriableError
from replicator.core.kafka import Admin
from replicator.core.settings import KafkaSettings
from replicator.ops.verify import read_partition
from tests.conftest import FAST_GROUP_CONFIG, RECENT_MS, unique_name

pytestmark = pytest.mark.apache


def rows(lo: int, hi: int) -> Rows:
    # Recent timestamps: the suite's brokers check retention every second, and records of
    # a fixed date long past (7-day retention) vanished before the read.
    n = hi - lo
    return Rows(list(range(lo, hi)), [RECENT_MS] * n, [b"k"] * n,
                [b"v%d" % o for o in range(lo, hi)], [None] * n)


def test_purged_sink_delivers_nothing_more(dest_brokers: str) -> None:
    kafka = KafkaSettings(brokers=dest_brokers,
                          config={**FAST_GROUP_CONFIG, "linger.ms": 5000})
    topic = unique_name("purge")
    assert Admin(kafka).create_topic(topic, 1)
    sink = KafkaSink(kafka, topic=topic, partition=0, checkpoint_topic=topic,
                     transactional_id=None)
    sink.start()
    sink.produce(rows(0, 10))
    sink.flush()                       # acknowledged: stays
    sink.produce(rows(10, 1000))       # queued (linger 5 s): must never arrive
    sink.purge()
    with pytest.raises(KafkaFatalError):
        sink.produce(rows(1000, 1010))
    sink.close()
    got = [m.value() for m in read_partition(kafka, topic, 0)]
    assert got == [b"v%d" % o for o in range(10)]


def test_a_shared_producer_purged_for_one_partition_delivers_nothing_more_of_any(
        dest_brokers: str) -> None:
    """At-least-once, one producer per process: partition 0's worker missed its revoke
    deadline with records queued. The whole producer is purged and replaced (librdkafka
    purges per producer): nothing queued reaches partition 0 or 1, partition 0's sink is
    refused from then on, partition 1's fails once (its session redoes from its
    checkpoint), and a new session of partition 1 writes through the new producer.
    """
    kafka = KafkaSettings(brokers=dest_brokers,
                          config={**FAST_GROUP_CONFIG, "linger.ms": 5000})
    topic = unique_name("purge")
    assert Admin(kafka).create_topic(topic, 2)
    shared = SharedAcks(kafka, timeout=30)
    shared.start()
    s0, s1 = (SharedAckSink(shared, topic=topic, partition=p, checkpoint_topic=topic)
              for p in (0, 1))
    s0.start()
    s1.start()
    s0.produce(rows(0, 10))
    s0.flush()                         # acknowledged: stays
    s0.produce(rows(10, 1000))         # queued (linger 5 s): must never arrive
    s1.produce(rows(0, 500))           # queued too: dropped with the producer
    s0.purge()
    with pytest.raises(KafkaFatalError):
        s0.produce(rows(1000, 1010))
    with pytest.raises(KafkaRetriableError):
        s1.outstanding()
    s1.close()
    again = SharedAckSink(shared, topic=topic, partition=1, checkpoint_topic=topic)
    again.start()
    again.produce(rows(0, 5))
    again.flush()
    again.close()
    assert [m.value() for m in read_partition(kafka, topic, 0)] == \
        [b"v%d" % o for o in range(10)]
    assert [m.value() for m in read_partition(kafka, topic, 1)] == \
        [b"v%d" % o for o in range(5)]
