"""A purged sink delivers nothing more, on Apache Kafka (the at-least-once worker that
missed its revoke deadline: ``ReplaySink.purge`` before the partition is released).

Records are enqueued with a long linger so they sit in the client's queue; the purge drops
them, every later produce is refused, and the partition holds only what was acknowledged
before the purge.
"""

from __future__ import annotations

import time

import pytest

from ingress.rows import Rows
from ingress.sink import KafkaSink
from replicator.core.errors import KafkaFatalError
from replicator.core.kafka import Admin
from replicator.core.settings import KafkaSettings
from replicator.ops.verify import read_partition
from tests.conftest import FAST_GROUP_CONFIG, unique_name

pytestmark = pytest.mark.apache


def rows(lo: int, hi: int) -> Rows:
    n = hi - lo
    return Rows(list(range(lo, hi)), [1_700_000_000_000] * n, [b"k"] * n,
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
    want = [b"v%d" % o for o in range(10)]
    # Read until the acknowledged records show (a loaded broker may answer the first
    # reader before its log is readable), then compare: nothing purged may follow them.
    deadline = time.monotonic() + 60
    got = [m.value() for m in read_partition(kafka, topic, 0)]
    while len(got) < len(want) and time.monotonic() < deadline:
        time.sleep(0.5)
        got = [m.value() for m in read_partition(kafka, topic, 0)]
    assert got == want
