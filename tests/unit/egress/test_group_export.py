"""Group-offset export: which groups, which topics, written only when changed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from egress.group_export import GroupExporter, GroupFilter, at_rest, plan_exports
from egress.metrics import EgressMetrics
from replicator.core.errors import KafkaRetriableError
from replicator.core.keys import group_export_key
from replicator.core.metrics import Metrics
from replicator.core.settings import GroupExportSettings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import GroupExport

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


class FakeAdmin:
    def __init__(self, groups: dict[str, dict[tuple[str, int], int]]) -> None:
        self.groups = groups
        self.failing: set[str] = set()
        self.reads = 0

    def list_groups(self) -> list[str]:
        return sorted(self.groups)

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        self.reads += 1
        if group in self.failing:
            raise KafkaRetriableError(f"coordinator of {group} not available")
        return dict(self.groups[group])


def exporter(admin: FakeAdmin, store: MemoryObjectStore, **settings: object
             ) -> GroupExporter:
    return GroupExporter(admin, store, prefix="data", region="eu", settings=GroupExportSettings(
        **settings), own_group="replicator.egress", metrics=EgressMetrics(Metrics()),
        wall=lambda: NOW)


def exported(store: MemoryObjectStore, topic: str, group: str) -> dict[int, int]:
    key = group_export_key("data", "eu", topic, group)
    return GroupExport.parse(store.get(key), where=key).offsets


def test_filter_matches_whole_ids_and_never_the_own_group() -> None:
    f = GroupFilter.of(["app.*", "billing"], ["app-test.*"], ["replicator.egress"])
    assert f.wants("app-orders") and f.wants("billing")
    assert not f.wants("my-app")          # whole-id match, not search
    assert not f.wants("billing-2")
    assert not f.wants("app-test-1")      # excluded
    assert not GroupFilter.of([".*"], [], ["replicator.egress"]).wants("replicator.egress")


def test_plan_keeps_only_replicated_topics_per_group() -> None:
    plan = plan_exports({"g1": {("orders", 0): 5, ("orders", 2): 9, ("other", 0): 1},
                         "g2": {("other", 1): 3}}, {"orders"})
    assert plan == {("orders", "g1"): {0: 5, 2: 9}}


def test_export_writes_once_and_again_only_on_change() -> None:
    admin = FakeAdmin({"app": {("orders", 0): 10, ("orders", 1): 4},
                       "replicator.egress": {("orders", 0): 99}})
    store = MemoryObjectStore()
    ex = exporter(admin, store)
    assert ex.export({"orders"}) == 1
    assert exported(store, "orders", "app") == {0: 10, 1: 4}
    assert ex.export({"orders"}) == 0     # unchanged: no PUT
    admin.groups["app"][("orders", 1)] = 7
    assert ex.export({"orders"}) == 1
    assert exported(store, "orders", "app") == {0: 10, 1: 7}
    with pytest.raises(Exception, match=r"replicator\.egress"):
        store.get(group_export_key("data", "eu", "orders", "replicator.egress"))


def test_a_restarted_exporter_compares_with_the_bucket() -> None:
    admin = FakeAdmin({"app": {("orders", 0): 10}})
    store = MemoryObjectStore()
    assert exporter(admin, store).export({"orders"}) == 1
    assert exporter(admin, store).export({"orders"}) == 0
    admin.groups["app"][("orders", 0)] = 11
    assert exporter(admin, store).export({"orders"}) == 1


def test_a_group_that_cannot_be_read_does_not_stop_the_others() -> None:
    admin = FakeAdmin({"a": {("orders", 0): 1}, "b": {("orders", 0): 2}})
    admin.failing.add("a")
    store = MemoryObjectStore()
    ex = exporter(admin, store)
    assert ex.export({"orders"}) == 1
    assert exported(store, "orders", "b") == {0: 2}
    admin.failing.clear()
    assert ex.export({"orders"}) == 1     # a's turn comes at the next round
    assert exported(store, "orders", "a") == {0: 1}


def test_group_ids_with_any_characters_round_trip_through_the_key() -> None:
    admin = FakeAdmin({"team a/orders:v2%": {("orders", 0): 3}})
    store = MemoryObjectStore()
    exporter(admin, store).export({"orders"})
    [obj] = store.list("data/eu/orders/_groups/")
    assert obj.key == "data/eu/orders/_groups/team%20a%2Forders%3Av2%25.json"
    assert exported(store, "orders", "team a/orders:v2%") == {0: 3}


def test_exclude_and_include_settings() -> None:
    admin = FakeAdmin({"app": {("orders", 0): 1}, "ingress.b": {("orders", 0): 2}})
    store = MemoryObjectStore()
    exporter(admin, store, exclude=["ingress\\..*"]).export({"orders"})
    assert [o.key for o in store.list("data/")] == ["data/eu/orders/_groups/app.json"]


def test_a_group_at_rest_past_the_last_record_says_where_the_records_end() -> None:
    # Partition 0: last record 9, commit marker 10, egress's position 11. The group read
    # everything (11); partition 1's group is behind egress; partition 2 is not read here.
    store = MemoryObjectStore()
    admin = FakeAdmin({"app": {("orders", 0): 11, ("orders", 1): 3, ("orders", 2): 50}})
    tails = {("orders", 0): (10, 11), ("orders", 1): (7, 7)}
    ex = GroupExporter(admin, store, prefix="data", region="eu",
                       settings=GroupExportSettings(), own_group="replicator.egress",
                       metrics=EgressMetrics(Metrics()), wall=lambda: NOW,
                       tails=lambda: tails)
    assert ex.export(["orders"]) == 1
    key = group_export_key("data", "eu", "orders", "app")
    assert GroupExport.parse(store.get(key), where=key).no_records_from == {0: 10}
    # Stable at rest: nothing written again, even after the partition moved elsewhere.
    tails = {}
    assert ex.export(["orders"]) == 0
    # A new commit drops what was said for the old offset.
    admin.groups["app"][("orders", 0)] = 12
    assert ex.export(["orders"]) == 1
    assert GroupExport.parse(store.get(key), where=key).no_records_from == {}
    assert at_rest("orders", {0: 11}, {("orders", 0): (10, 11)}, None) == {0: 10}
    assert at_rest("orders", {0: 10}, {("orders", 0): (10, 11)}, None) == {}
    assert at_rest("orders", {0: 12}, {("orders", 0): (10, 11)}, None) == {}


@pytest.mark.parametrize("restarted", [False, True])
def test_a_recreated_topic_gets_a_new_export_for_the_same_offsets(restarted: bool) -> None:
    # The topic is deleted and created again; the group commits the same offsets on the new
    # topic. The export of the earlier topic must not stand for the new one (failover would
    # translate it through the earlier incarnation's map), whether this process wrote it or
    # found it in the bucket at its first round.
    admin = FakeAdmin({"app": {("orders", 0): 10}})
    store = MemoryObjectStore()
    ids = {"orders": "IdA"}

    def make() -> GroupExporter:
        return GroupExporter(admin, store, prefix="data", region="eu",
                             settings=GroupExportSettings(), own_group="replicator.egress",
                             metrics=EgressMetrics(Metrics()), wall=lambda: NOW,
                             topic_ids=ids.__getitem__)

    ex = make()
    assert ex.export({"orders"}) == 1
    ids["orders"] = "IdB"
    if restarted:
        ex = make()
    assert ex.export({"orders"}) == 1
    key = group_export_key("data", "eu", "orders", "app")
    export = GroupExport.parse(store.get(key), where=key)
    assert (export.topic_id, export.offsets) == ("IdB", {0: 10})
    assert ex.export({"orders"}) == 0
