"""Batches cut to fit a destination topic's ``max.message.bytes`` (``ingress.limits``), and
the at-least-once producer that enqueues a cut partition one chunk at a time.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingress.acks import SharedAcks, SharedAckSink
from ingress.limits import DestinationLimits, chunk_bounds, refused_record
from ingress.rows import Rows
from replicator.core.batch_limits import (
    BATCH_OVERHEAD,
    DEFAULT_BATCH_SIZE,
    batch_size_for,
    budget,
    record_size,
)
from replicator.core.errors import RecordRefused, ReplicatorError
from replicator.core.kafka import Producer
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint, Refusal
from replicator.ops.topics import IngressSource
from tests.unit.ingress_fakes import FakeClient, fake_producer

KAFKA_DEFAULT_LIMIT = 1_048_588


def rows_of(values: list[bytes]) -> Rows:
    n = len(values)
    return Rows(list(range(100, 100 + n)), [1] * n, [b"k"] * n, list(values), [None] * n)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
       room=st.integers(50, 5000))
def test_chunks_cover_the_batch_in_order_and_each_fits(sizes: list[int], room: int) -> None:
    rows = rows_of([b"x" * s for s in sizes])
    bounds = chunk_bounds(rows, room)
    assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(len(sizes)))
    for lo, hi in bounds:
        assert hi > lo
        total = sum(record_size(b"k", b"x" * s, None) for s in sizes[lo:hi])
        assert total <= room or hi - lo == 1      # a record larger than room goes alone


def test_topics_at_kafkas_default_limit_are_never_cut() -> None:
    """No cost at the default: librdkafka's batches (batch.size) fit the limit already."""
    limits = DestinationLimits()
    limits.update("t", KAFKA_DEFAULT_LIMIT)
    assert limits.room("t") is None and limits.room("unknown") is None
    big = rows_of([b"x" * 1000] * 5000)
    assert limits.cut("t", big) == [big]
    assert batch_size_for({}, KAFKA_DEFAULT_LIMIT) is None
    limits.update("small", 100_000)
    assert limits.room("small") == budget(100_000) < 100_000 - BATCH_OVERHEAD
    assert batch_size_for({}, 100_000) == budget(100_000)
    assert batch_size_for({"batch.size": 50_000}, 100_000) is None
    assert DestinationLimits.for_config({}).batch_size == DEFAULT_BATCH_SIZE


def test_a_changed_limit_is_announced_but_not_the_first_reading() -> None:
    limits = DestinationLimits()
    seen: list[str] = []
    limits.on_change(seen.append)
    assert not limits.update("t", 100_000)
    assert not limits.update("t", 100_000)
    assert limits.update("t", 1_000_000)
    assert seen == ["t"]


def test_a_size_refusal_names_the_first_record_too_large_on_its_own() -> None:
    rows = rows_of([b"a" * 10, b"b" * 200_000, b"c" * 300_000])
    err = refused_record(rows, RecordRefused("x", reason="Broker: Message size too large"),
                         100_000, "dest[0]")
    assert err.offset == 101 and err.size == record_size(b"k", b"b" * 200_000, None)
    assert "source offset 101" in str(err) and "max.message.bytes=100000" in str(err)
    other = refused_record(rows, RecordRefused("x", reason="Broker: Topic authorization "
                                                           "failed"), 100_000, "dest[0]")
    assert other.offset == 100


class Gated:
    """A ``SharedAcks`` over a fake client that answers only when told."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
        self.limits = DestinationLimits()
        self.limits.update("small", limit)
        self.clients: list[FakeClient] = []

        def make() -> Producer:
            p, c = fake_producer(monkeypatch, auto=False, name="ingress producer",
                                 track_acks=True)
            self.clients.append(c)
            return p

        self.shared = SharedAcks(KafkaSettings(brokers="fake:1"), timeout=10,
                                 make_producer=make, limits=self.limits)
        self.shared.start()

    def sink(self) -> SharedAckSink:
        s = SharedAckSink(self.shared, topic="small", partition=0, checkpoint_topic="cps")
        s.start()
        return s


def test_at_least_once_enqueues_a_cut_partition_one_chunk_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sinks (fan-in) write one partition of a topic limited to 10 KB: the records
    queued in the client never exceed one chunk (librdkafka would batch everything queued
    for the partition into one request the broker refuses)."""
    g = Gated(monkeypatch, 10_000)
    room = g.limits.room("small")
    assert room is not None
    a, b = g.sink(), g.sink()
    client = g.clients[-1]
    errors: list[ReplicatorError] = []

    def produce(s: SharedAckSink, lo: int) -> None:
        try:
            s.produce(Rows(list(range(lo, lo + 30)), [1] * 30, [b"k"] * 30,
                           [b"x" * 1000] * 30, [None] * 30))
        except ReplicatorError as e:
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(s, lo)) for s, lo in ((a, 0), (b, 100))]
    for t in threads:
        t.start()
    most = 0
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in threads) or client.queued:
        assert time.monotonic() < deadline
        with client.lock:
            queued = sum(record_size(q.key, q.value, None) for q in client.queued)
            most = max(most, queued)
            client.answer()
        time.sleep(0.002)
    for t in threads:
        t.join()
    assert errors == []
    assert 0 < most <= room
    assert len(client.log) == 60
    assert a.outstanding(0.0) == 0 and b.outstanding(0.0) == 0


def test_a_request_too_large_as_a_whole_is_named_from_its_first_record() -> None:
    rows = rows_of([b"a" * 300] * 400)
    err = refused_record(rows, RecordRefused("x", reason="Broker: Message size too large"),
                         100_000, "dest[0]")
    assert err.offset == 100 and "request of 400 record(s)" in str(err)
    assert "none too large on its own" in str(err)


def test_a_refusal_in_the_checkpoint_round_trips_and_shows_in_replicator_topics() -> None:
    now = datetime.now(UTC)
    cp = Checkpoint(6, "seg", now, refused=Refusal(10, 150_040, "max.message.bytes=100000",
                                                    "Broker: Message size too large"))
    assert Checkpoint.decode(cp.encode()) == cp
    assert Checkpoint.decode(Checkpoint(6, "seg", now).encode()).refused is None
    # An unparsable one only informs operators: ignored, the checkpoint stays valid.
    doc = json.loads(cp.encode())
    doc["refused"] = {"offset": "x"}
    assert Checkpoint.decode(json.dumps(doc).encode()).refused is None
    row = IngressSource("us-east-1", "t", "t.copy", "topic", 2, checkpointed=2,
                        refused={0: "offset 10 (150040 bytes; destination "
                                    "max.message.bytes=100000): too large"})
    assert row.state.startswith("stopped at a refused record: [0] offset 10")
    assert row.as_dict()["refused"] == {"0": row.refused[0]}
