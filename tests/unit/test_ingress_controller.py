"""Controller placement logic with in-memory seams (no broker): which workers run where."""

from __future__ import annotations

import json
from typing import Any, cast

from ingress.checkpoints import MemoryCheckpointStore
from ingress.controller import Ingress
from ingress.segment_events import MemorySegmentEvents
from ingress.sink import MemorySink
from replicator.core.settings import load_settings
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_ingress_topics import FakeAdmin


class FakeConsumer:
    def __init__(self) -> None:
        self.subscriptions: list[list[str]] = []

    def subscribe(self, topics: list[str], **kw: Any) -> None:
        self.subscriptions.append(topics)

    def unsubscribe(self) -> None:
        self.subscriptions.append([])

    def close(self) -> None:
        return


def subscriptions(ing: Ingress) -> list[list[str]]:
    return cast(FakeConsumer, ing.consumer).subscriptions


def make(sources: list[dict[str, Any]]) -> tuple[Ingress, MemoryObjectStore, FakeAdmin]:
    settings = load_settings(data={
        "region": "us-west-1", "s3": {"bucket": "b"}, "kafka": {"brokers": "x:1"},
        "metrics": {"port": 0},
        "ingress": {"sqs_queue": "q", "sources": sources, "rescan_interval": "1h"}},
        environ={})
    store = MemoryObjectStore("b")
    admin = FakeAdmin()
    checkpoints = MemoryCheckpointStore()
    ing = Ingress(settings, store=store, events=MemorySegmentEvents(), checkpoints=checkpoints,
                  admin=admin, make_sink=lambda src, topic, p: MemorySink(checkpoints))
    ing.consumer = FakeConsumer()  # type: ignore[assignment]
    return ing, store, admin


def meta(store: MemoryObjectStore, region: str, topic: str, partitions: int) -> None:
    store.put(f"data/{region}/{topic}/_topic.json",
              json.dumps({"partitions": partitions}).encode())


def test_two_sources_aggregated_into_one_topic() -> None:
    ing, store, admin = make([
        {"region": "us-east-1", "topic": "t", "destination_topic": "all"},
        {"region": "eu-west-1", "topic": "t", "destination_topic": "all"}])
    try:
        ing._check_topics()
        assert subscriptions(ing) == []  # nothing known yet: nothing subscribed
        meta(store, "us-east-1", "t", 2)
        meta(store, "eu-west-1", "t", 4)
        ing._check_topics()
        assert admin.topics == {"all": 4}  # created for the larger source
        assert not any(st.stopped for st in ing.sources.values())
        assert subscriptions(ing) == [["all"]]
    finally:
        ing.close()


def test_placement_follows_assignment_and_partition_counts() -> None:
    ing, store, admin = make([
        {"region": "us-east-1", "topic": "t", "destination_topic": "all"},
        {"region": "eu-west-1", "topic": "u", "destination_topic": "all"}])
    try:
        admin.topics["all"] = 4
        admin.can_grow = False
        meta(store, "us-east-1", "t", 2)
        meta(store, "eu-west-1", "u", 4)
        ing._check_topics()
        assert subscriptions(ing) == [["all"]]
        ing.assigned = {("all", 1), ("all", 3)}
        ing._reconcile()
        assert sorted(ing.workers) == [("eu-west-1", "u", 1), ("eu-west-1", "u", 3),
                                       ("us-east-1", "t", 1)]
        ing.assigned = {("all", 3)}
        ing._reconcile()
        assert sorted(ing.workers) == [("eu-west-1", "u", 3)]
    finally:
        ing.close()


def test_source_with_too_few_destination_partitions_stops_and_resumes() -> None:
    ing, store, admin = make([{"region": "us-east-1", "topic": "t"}])
    try:
        admin.topics["t"] = 2
        meta(store, "us-east-1", "t", 3)
        ing._check_topics()
        ing._check_topics()
        st = ing.sources[("us-east-1", "t")]
        assert st.stopped == "t has 2 partition(s), the source 3"
        assert ing.metrics.value("replicator_ingress_source_errors_total",
                                 {"region": "us-east-1", "topic": "t",
                                  "reason": "partitions"}) == 1  # counted once
        assert subscriptions(ing) == []
        admin.topics["t"] = 3  # an operator added partitions
        ing._check_topics()
        assert st.stopped is None and subscriptions(ing) == [["t"]]
        assert ing.metrics.value("replicator_ingress_source_stopped",
                                 {"region": "us-east-1", "topic": "t"}) == 0
    finally:
        ing.close()


def test_a_stalled_partition_makes_readyz_false() -> None:
    ing, store, admin = make([{"region": "us-east-1", "topic": "t"}])
    try:
        admin.topics["t"] = 1
        meta(store, "us-east-1", "t", 1)
        ing._check_topics()
        ing._started = True
        ing.assigned = {("t", 0)}
        ing._reconcile()
        assert ing.ready()
        ing.workers[("us-east-1", "t", 0)].stalled = True
        assert not ing.ready() and ing.stalled() == [("us-east-1", "t", 0)]
        ing.workers[("us-east-1", "t", 0)].stalled = False
        assert ing.ready()
    finally:
        ing.close()
