"""A purged sink delivers nothing more, on Apache Kafka (the at-least-once worker that
missed its revoke deadline: ``ReplaySink.purge`` before the partition is released).

Records are enqueued with a long linger so they sit in the client's queue; the purge drops
them, every later produce is refused, and the partition holds only what was acknowledged
before the purge.
"""

from __future__ import annotations

import pytest

from ingress.rows import Rows
from ingress.sink import KafkaSink
from replicator.core.errors import KafkaFatalError
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
