"""A source topic recreated with fewer partitions: ingress keeps replaying every partition
any incarnation had (docs/architecture.md, "Topic incarnations"): the earlier topic's tail of
its higher partitions is never cut off when egress rewrites ``_topic.json`` with the new
count before ingress replayed it.
"""

from __future__ import annotations

import types
from datetime import UTC, datetime

from ingress.controller import Ingress
from ingress.metrics import IngressMetrics
from ingress.topics import SourceState, check_sources
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.test_ingress_topics import FakeAdmin

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def workers(store: MemoryObjectStore, st: SourceState, dest: FakeAdmin) -> list[int]:
    check_sources([st], store, dest, "data", IngressMetrics.create(Metrics()))
    stub = types.SimpleNamespace(sources={("r1", "t"): st},
                                 assigned={("t", p) for p in range(8)})
    return sorted(p for _, _, p in Ingress._desired(stub))  # type: ignore[arg-type]


def test_workers_of_the_earlier_incarnations_partitions_stay() -> None:
    store, dest = MemoryObjectStore("b"), FakeAdmin()
    st = SourceState(IngressSourceSettings(region="r1", topic="t"))
    key = "data/r1/t/_topic.json"
    store.put(key, TopicMetadata(4, {}, "t", "r1", NOW, {},
                                 (Incarnation("X", "", partitions=4),)).encode())
    assert workers(store, st, dest) == [0, 1, 2, 3]
    # X deleted, Y created with 2 partitions; egress rewrote the count.
    store.put(key, TopicMetadata(2, {}, "t", "r1", NOW, {},
                                 (Incarnation("X", "", partitions=4),
                                  Incarnation("Y", "Y", {0: 9, 1: 9}, {0: 0, 1: 0},
                                              partitions=2))).encode())
    assert workers(store, st, dest) == [0, 1, 2, 3]


def test_a_topic_json_without_counts_is_read_as_before() -> None:
    store, dest = MemoryObjectStore("b"), FakeAdmin()
    st = SourceState(IngressSourceSettings(region="r1", topic="t"))
    store.put("data/r1/t/_topic.json",
              TopicMetadata(3, {}, "t", "r1", NOW, {}).encode())
    assert workers(store, st, dest) == [0, 1, 2]
