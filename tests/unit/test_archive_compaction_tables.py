"""Which table compaction's hook keeps in step with its deletes: never one it creates, none
for a topic ``[catalog]`` does not select, and for a topic deleted and created again the
table of the inputs' incarnation. A real pyiceberg SQL catalog (SQLite) over a
MemoryObjectStore and a compaction run in-process; each test fails without its fix.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from replicator.archive.committer import ArchiveCommitter
from replicator.core.keys import SegmentKey, topic_meta_key
from replicator.core.settings import Settings, load_settings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.test_archive_committer import catalog_settings, listed
from tests.unit.test_archive_expiry import run
from tests.unit.test_compaction_controller import k
from tests.unit.test_compaction_helpers import make_records, write_segment

TOPIC_CFG = {"min_segment_age": "1h", "min_segment_count": 2, "min_segment_size": 1,
             "max_segment_count": 100, "max_segment_size": "1GiB"}


def put(store: MemoryObjectStore, key: SegmentKey) -> SegmentKey:
    write_segment(store, key, make_records(key.start, key.end))
    return key


def two_topics_one_listed(tmp: Path) -> Settings:
    """``orders.v1`` and ``orders_v1`` render to one identifier: ``catalog.topics`` lists
    one of them (what ``check_mapping`` advises); compaction compacts both.
    """
    return load_settings(data={
        "region": "r1", "s3": {"bucket": "b", "prefix": "data"},
        "kafka": {"brokers": "127.0.0.1:1"}, "metrics": {"port": 0},
        "compaction": {"spark_master": "inline", "replication_grace": "0s",
                       "topics": {"orders.v1": TOPIC_CFG, "orders_v1": TOPIC_CFG}},
        "catalog": {"enabled": True, "topics": ["orders_v1"], "snapshot_retention": "0s",
                    "properties": {"uri": f"sqlite:///{tmp}/catalog.db"},
                    "warehouse": f"file://{tmp}/warehouse"}}, environ={})


@pytest.mark.parametrize("order", ["compaction first", "follow step first"])
def test_the_hook_gives_no_table_to_a_topic_catalog_topics_leaves_out(
        tmp_path: Path, order: str) -> None:
    settings = two_topics_one_listed(tmp_path)
    store = MemoryObjectStore("b")
    inputs = {t: [put(store, k(0, 0, 9, topic=t)), put(store, k(0, 10, 19, topic=t))]
              for t in ("orders.v1", "orders_v1")}
    committer = ArchiveCommitter(settings, store)
    committer.check_mapping()   # passes: only orders_v1 is selected
    if order == "follow step first":
        assert [r.table for r in committer.sync_all()] == ["replicator.r1.orders_v1"]
    report = run(settings, store, committer)
    # Was: the hook created replicator.r1.orders_v1 stamped for orders.v1 (every later step
    # of orders_v1 refused), or, in the other order, failed every swap of orders.v1
    # (ForeignTable) and kept its inputs forever.
    assert report.errors == []
    deleted = set(report.deleted)
    assert {x.to_key() for x in inputs["orders.v1"]} <= deleted   # as without [catalog]
    results = committer.sync_all()
    assert [r.table for r in results] == ["replicator.r1.orders_v1"]
    table = committer.table("r1", "orders_v1", create=False)
    assert table is not None and table.properties["replicator.topic"] == "orders_v1"
    assert listed(table) == [k(1, 0, 19, topic="orders_v1")]
    assert committer.metrics.value(
        "replicator_archive_refused_steps_total",
        {"region": "r1", "topic": "orders_v1", "reason": "foreign-table"}) is None


def test_the_hook_never_creates_a_table(tmp_path: Path) -> None:
    """A selected topic whose table does not exist yet has nothing to keep consistent:
    compaction deletes its inputs as without ``[catalog]``, and the first step lists the
    output."""
    settings = catalog_settings(tmp_path, snapshot_retention="0s")
    store = MemoryObjectStore("b")
    inputs = [put(store, k(0, 0, 9)), put(store, k(0, 10, 19))]
    committer = ArchiveCommitter(settings, store)
    report = run(settings, store, committer)
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
    assert committer.table("r1", "t", create=False) is None   # was: created by the swap
    committer.sync("r1", "t")
    table = committer.table("r1", "t", create=False)
    assert table is not None and listed(table) == [k(1, 0, 19)]


def recreated(store: MemoryObjectStore, committer: ArchiveCommitter, *,
              step_after: bool) -> tuple[list[SegmentKey], list[SegmentKey]]:
    now = datetime.now(UTC)
    old = Incarnation("oldid", "", {}, {0: 0}, now)
    meta = dataclasses.replace(TopicMetadata.of("t", "r1", 1, {}, now), incarnations=(old,))
    store.put(topic_meta_key("data", "r1", "t"), meta.encode())
    earlier = [put(store, k(0, s, e)) for s, e in [(0, 9), (10, 19), (20, 29)]]
    committer.sync("r1", "t")
    # The topic is deleted and created again.
    new = Incarnation("newid", "newid", {0: 29}, {0: 0}, now)
    store.put(topic_meta_key("data", "r1", "t"),
              dataclasses.replace(meta, incarnations=(old, new)).encode())
    later = [put(store, dataclasses.replace(k(0, s, e), incarnation="newid"))
             for s, e in [(0, 9), (10, 19), (20, 29)]]
    if step_after:
        committer.sync("r1", "t")
    return earlier, later


def missing(store: MemoryObjectStore, paths: Any) -> list[str]:
    keys = set(store.keys())
    return [p for p in paths if p.removeprefix("s3://b/") not in keys]


@pytest.mark.parametrize("template", ["{topic}_{incarnation}", "{topic}"])
@pytest.mark.parametrize("step_after", [True, False],
                         ids=["stepped since the recreate", "not stepped since"])
def test_an_earlier_incarnation_is_compacted_in_the_table_that_lists_it(
        tmp_path: Path, template: str, step_after: bool) -> None:
    settings = catalog_settings(tmp_path, snapshot_retention="0s", table_name=template)
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(settings, store)
    earlier, later = recreated(store, committer, step_after=step_after)
    report = run(settings, store, committer)
    # Was: "3 inputs kept: the table cannot list their output" at every run, for both
    # incarnations' tables and both kinds of template.
    assert report.errors == []
    assert {x.to_key() for x in [*earlier, *later]} <= set(report.deleted)
    old_output = k(1, 0, 29)
    new_output = dataclasses.replace(old_output, incarnation="newid")
    live = committer.table("r1", "t", create=False)
    if live is None:
        # The live incarnation's own table is created by the first step, not compaction's.
        assert template == "{topic}_{incarnation}" and not step_after
        committer.sync("r1", "t")
        live = committer.table("r1", "t", create=False)
        assert live is not None
    assert listed(live) == [new_output]
    assert missing(store, live.files()) == []
    if template == "{topic}_{incarnation}":
        # The earlier incarnation's own table lists its output, never a deleted input.
        old = committer.catalog.load(("replicator", "t_oldid"))
        assert old is not None and old.name != live.name
        assert listed(old) == [old_output]
        assert all(missing(store, old.files(s.snapshot_id)) == [] for s in old.snapshots())
    else:
        # One table, following the live incarnation: it lists no segment of the earlier
        # one (a step since the recreate, or the hook's own, took them out).
        assert all(missing(store, live.files(s.snapshot_id)) == [] for s in live.snapshots())
    assert live.name == ("replicator.t_newid" if "{incarnation}" in template
                         else "replicator.t")
