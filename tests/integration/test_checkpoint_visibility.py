"""A checkpoint committed behind another writer's open transaction is still found.

The checkpoint topic's partitions are shared by every worker. A read_committed reader
stops at the last stable offset, so a checkpoint committed after another worker's
transaction began stays invisible until that transaction ends. Loading must wait for it
instead of returning the older checkpoint (which would make the new owner replay a
committed batch: a duplicate in exactly-once mode). Both readers: the per-load one of the
operator tools (``KafkaCheckpointStore``) and ingress's per-process follower
(``FollowingCheckpointStore``, started before the writes, as in a running process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ingress.checkpoints import CheckpointStore, FollowingCheckpointStore, KafkaCheckpointStore
from replicator.core.kafka import Admin, Producer
from replicator.core.metrics import Metrics
from replicator.core.settings import KafkaSettings
from tests.conftest import unique_name

Stores = Callable[[KafkaSettings, str], CheckpointStore]


@pytest.fixture(params=["per-load", "follower"])
def make_store(request: pytest.FixtureRequest) -> Iterator[Stores]:
    started: list[FollowingCheckpointStore] = []

    def make(kafka: KafkaSettings, topic: str) -> CheckpointStore:
        if request.param == "per-load":
            return KafkaCheckpointStore(kafka, topic, Metrics(), timeout=20)
        store = FollowingCheckpointStore(kafka, topic, Metrics(), timeout=20)
        store.start()
        started.append(store)
        return store

    yield make
    for s in started:
        s.close()


def cp(offset: int) -> bytes:
    return (b'{"offset": %d, "segment": "s", "updated_at": "2026-11-21T00:00:00Z"}' % offset)


def test_load_waits_for_an_open_transaction_ahead_of_the_newest_checkpoint(
        dest_brokers: str, make_store: Stores) -> None:
    kafka = KafkaSettings(brokers=dest_brokers)
    topic = unique_name("cp")
    Admin(kafka).create_topic(topic, 1, {"cleanup.policy": "compact"})
    store = make_store(kafka, topic)
    key = "us-east-1:t:0"

    old = Producer(kafka)
    old.produce(topic, cp(10), key.encode())
    assert old.flush(10) == 0

    # Another worker opens a transaction on the same partition and keeps it open.
    other = Producer(kafka, transactional_id=unique_name("other"))
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(topic, cp(999), b"us-east-1:t:1")
    other.flush(10)

    # This partition's worker commits a newer checkpoint behind it.
    mine = Producer(kafka, transactional_id=unique_name("mine"))
    mine.init_transactions(10)
    mine.begin_transaction()
    mine.produce(topic, cp(20), key.encode())
    mine.commit_transaction(10)

    def finish_other() -> None:
        time.sleep(2.0)
        other.commit_transaction(10)

    t = threading.Thread(target=finish_other)
    t.start()
    started = time.monotonic()
    loaded = store.load(key)
    waited = time.monotonic() - started
    t.join()
    assert loaded is not None
    assert loaded.offset == 20, "a stale checkpoint would make the new owner replay"
    assert waited >= 1.5  # it waited for the other transaction instead of stopping early


def test_load_after_an_aborted_transaction_returns_the_committed_checkpoint(
        dest_brokers: str, make_store: Stores) -> None:
    kafka = KafkaSettings(brokers=dest_brokers)
    topic = unique_name("cp")
    Admin(kafka).create_topic(topic, 1, {"cleanup.policy": "compact"})
    store = make_store(kafka, topic)
    key = "us-east-1:t:0"
    p = Producer(kafka, transactional_id=unique_name("w"))
    p.init_transactions(10)
    p.begin_transaction()
    p.produce(topic, cp(5), key.encode())
    p.commit_transaction(10)
    p.begin_transaction()
    p.produce(topic, cp(7), key.encode())
    p.abort_transaction(10)
    loaded = store.load(key)
    assert loaded is not None
    # Tansu shows aborted records to read_committed readers (docs/testing.md), so only the
    # committed value is certain on a real Kafka; here either is what the broker returns.
    assert loaded.offset in (5, 7)
    assert store.load("us-east-1:t:9") is None


def test_the_follower_sees_checkpoints_committed_after_it_loaded(dest_brokers: str) -> None:
    """Loaded once, then followed: a later load returns what was committed since, and a
    key's superseded and invalid values do not win (values reduced lazily)."""
    kafka = KafkaSettings(brokers=dest_brokers)
    topic = unique_name("cp")
    Admin(kafka).create_topic(topic, 1, {"cleanup.policy": "compact"})
    key = "us-east-1:t:0:dest"
    p = Producer(kafka)
    for o in range(20):
        p.produce(topic, cp(o), key.encode())
    assert p.flush(10) == 0
    metrics = Metrics()
    store = FollowingCheckpointStore(kafka, topic, metrics, timeout=20)
    store.start()
    try:
        first = store.load(key)
        assert first is not None and first.offset == 19
        p.produce(topic, cp(25), key.encode())
        p.produce(topic, b"not json", key.encode())
        assert p.flush(10) == 0
        later = store.load(key)
        assert later is not None and later.offset == 25
        assert metrics.total("replicator_ingress_checkpoints_invalid_total") == 1
        p.produce(topic, None, key.encode())     # an operator's reset
        assert p.flush(10) == 0
        assert store.load(key) is None
    finally:
        store.close()
