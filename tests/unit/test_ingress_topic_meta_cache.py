"""The replay workers of one process share each source topic's ``_topic.json`` read: one
GET per re-read interval, not one per worker."""

from __future__ import annotations

import pytest

from ingress.incarnations import IncarnationTracker
from ingress.topic_meta_cache import TopicMetaCache
from replicator.core.errors import StorageError
from replicator.core.keys import PartitionRef
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.test_ingress_controller import make, meta

TOPIC_JSON = "data/us-east-1/t/_topic.json"


class CountingStore(MemoryObjectStore):
    def __init__(self) -> None:
        super().__init__("b")
        self.gets: list[str] = []
        self.failing = False

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        if self.failing:
            raise StorageError(f"get {key}: 503 Slow Down")
        return super().get(key)


def test_workers_of_a_topic_share_one_read_per_interval() -> None:
    store = CountingStore()
    store.put(TOPIC_JSON, TopicMetadata(
        8, incarnations=(Incarnation("IdA", ""), Incarnation("IdB", "IdB"))).encode())
    clock = [0.0]
    cache = TopicMetaCache(store, 2.0, monotonic=lambda: clock[0])
    trackers = [IncarnationTracker(store, PartitionRef("data", "us-east-1", "t", p), "w",
                                   object(), monotonic=lambda: clock[0], cache=cache)
                for p in range(8)]
    for t in trackers:
        assert t.locations() == ("", ["IdB"])
    assert store.gets == [TOPIC_JSON]                 # one GET for eight workers
    clock[0] += 2.0
    for t in trackers:
        t.locations()
    assert store.gets == [TOPIC_JSON] * 2
    # A failed read is not kept: the next worker reads again.
    clock[0] += 2.0
    store.failing = True
    with pytest.raises(StorageError):
        trackers[0].locations()
    store.failing = False
    trackers[1].locations()
    assert len(store.gets) == 4
    assert trackers[1].live_id() == "IdB"


def test_the_ingress_process_gives_its_workers_one_cache() -> None:
    ing, store, admin = make([{"region": "us-east-1", "topic": "t",
                               "destination_topic": "all"}])
    try:
        admin.topics["all"] = 4
        meta(store, "us-east-1", "t", 4)
        ing._check_topics()
        ing.assigned = {("all", p) for p in range(4)}
        ing._reconcile()
        caches = {id(w.incarnations.lineage._cache) for w in ing.workers.values()}
        assert len(ing.workers) == 4 and len(caches) == 1 and ing._topic_meta is not None
    finally:
        ing.close()


def test_workers_waiting_for_their_first_position_share_the_read_too() -> None:
    from ingress.first_position import PENDING, FirstPosition
    store = CountingStore()
    store.put(TOPIC_JSON, TopicMetadata(4, first_positions={0: 0}).encode())
    clock = [0.0]
    cache = TopicMetaCache(store, 2.0, monotonic=lambda: clock[0])
    firsts = [FirstPosition(store, PartitionRef("data", "us-east-1", "t", p), enabled=True,
                            monotonic=lambda: clock[0], cache=cache) for p in range(4)]
    assert [f.get() for f in firsts] == [0, PENDING, PENDING, PENDING]
    assert store.gets == [TOPIC_JSON]
