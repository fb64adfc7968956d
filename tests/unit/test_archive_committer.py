"""The committer against a real pyiceberg SQL catalog (SQLite) over segments in a
MemoryObjectStore: what a table lists after egress, compaction (the controller's swap
before deletes), lifecycle deletes and concurrent commits. Metadata only: reading the
records through the table needs S3 (tests/integration/test_archive_s3.py).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from compaction.controller import Compaction
from replicator.archive.committer import ArchiveCommitter, SyncResult
from replicator.archive.iceberg import IcebergTable
from replicator.core.keys import SegmentKey, topic_meta_key
from replicator.core.settings import Settings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.test_compaction_controller import clock, k, seed
from tests.unit.test_compaction_helpers import compaction_settings, make_records, write_segment


def catalog_settings(tmp: Path, **catalog: Any) -> Settings:
    base = compaction_settings()
    cfg = {"enabled": True, "properties": {"uri": f"sqlite:///{tmp}/catalog.db"},
           "warehouse": f"file://{tmp}/warehouse", **catalog}
    return base.model_copy(update={"catalog": base.catalog.model_validate(cfg)})


@pytest.fixture
def setup(tmp_path: Path) -> tuple[MemoryObjectStore, ArchiveCommitter]:
    store = MemoryObjectStore("b")
    return store, ArchiveCommitter(catalog_settings(tmp_path), store)


def swap_of(committer: ArchiveCommitter, region: str, topic: str,
            deleting: list[SegmentKey]) -> SyncResult:
    """Compaction's hook ``swap`` on a topic that has a table (its result, never ``None``)."""
    r = committer.swap(region, topic, deleting)
    assert r is not None, f"{region}/{topic} has no table"
    return r


def listed(table: IcebergTable) -> list[SegmentKey]:
    return sorted(SegmentKey.parse(p.removeprefix("s3://b/")) for p in table.files())


def test_sync_adds_each_segment_once_with_its_partition_and_record_count(
        setup: tuple[MemoryObjectStore, ArchiveCommitter]) -> None:
    store, committer = setup
    seed(store, [(0, 9), (10, 19)])
    seed(store, [(0, 4)], partition=1)
    r = committer.sync("r1", "t")
    assert (r.added, r.table) == (3, "replicator.r1.t")
    assert committer.sync("r1", "t").committed is False          # idempotent
    table = committer.table("r1", "t", create=False)
    assert table is not None
    assert listed(table) == [k(0, 0, 9), k(0, 10, 19), k(0, 0, 4, partition=1)]
    assert sum(f.records for f in table.files().values()) == 25
    # The manifests prune by partition and by offset bounds.
    from replicator.archive.iceberg import Bound
    assert table.planned_files([Bound("partition", "=", 1)]) == [
        f"s3://b/{k(0, 0, 4, partition=1)}"]
    assert table.planned_files([Bound("offset", ">=", 10), Bound("partition", "=", 0)]) == [
        f"s3://b/{k(0, 10, 19)}"]


def test_a_compaction_run_swaps_its_outputs_in_before_deleting_and_expires_older_snapshots(
        tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, snapshot_retention="0s")   # deleted at once
    committer = ArchiveCommitter(settings, store)
    inputs = seed(store, [(0, 9), (10, 19), (20, 29)])
    committer.sync("r1", "t")
    seen: list[list[SegmentKey]] = []
    table = committer.table("r1", "t", create=False)
    assert table is not None
    real_delete = store.delete_many

    def delete_many(keys: Any) -> None:
        keys = list(keys)
        table.refresh()
        seen.append(listed(table))   # what the table lists when the inputs go
        real_delete(keys)

    store.delete_many = delete_many  # type: ignore[method-assign]
    report = Compaction(settings.model_copy(), store=store, clock=clock,
                        archive_factory=lambda *_: committer).run_once()
    assert report.outcome == "success", report
    out = k(1, 0, 29)
    assert seen and all(s == [out] for s in seen)
    table.refresh()
    assert listed(table) == [out]
    snaps = table.snapshots()
    assert len(snaps) == 1 and snaps[0].current   # the snapshots listing inputs are gone
    assert all(next(iter(store.list(i.to_key())), None) is None for i in inputs)


def test_segments_deleted_outside_compaction_leave_the_table(
        setup: tuple[MemoryObjectStore, ArchiveCommitter]) -> None:
    store, committer = setup
    keys = seed(store, [(0, 9), (10, 19)])
    committer.sync("r1", "t")
    store.delete(keys[0].to_key())   # a lifecycle rule
    r = committer.sync("r1", "t")
    assert (r.removed_gone, r.added) == (1, 0)
    table = committer.table("r1", "t", create=False)
    assert table is not None and listed(table) == [keys[1]]
    assert len(table.snapshots()) == 1


def test_a_concurrent_commit_makes_the_other_writer_plan_again(
        setup: tuple[MemoryObjectStore, ArchiveCommitter], tmp_path: Path) -> None:
    store, committer = setup
    seed(store, [(0, 9), (10, 19)])
    committer.sync("r1", "t")
    other = ArchiveCommitter(committer.settings, store)
    stale = committer.table("r1", "t", create=False)
    assert stale is not None
    # Compaction published an output; the other writer swaps it in first.
    seed(store, [(0, 19)], level=1)
    other.swap("r1", "t", [k(0, 0, 9), k(0, 10, 19)])
    store.delete_many([k(0, 0, 9).to_key(), k(0, 10, 19).to_key()])
    seed(store, [(20, 29)])
    # This writer planned on the older snapshot: the catalog refuses, it plans again.
    real_table = committer.table
    committer.table = lambda *a, **kw: stale  # type: ignore[method-assign]
    r = committer.sync("r1", "t")
    committer.table = real_table  # type: ignore[method-assign]
    assert r.conflicts == 1 and r.added == 1
    fresh = committer.table("r1", "t", create=False)
    assert fresh is not None and listed(fresh) == [k(0, 20, 29), k(1, 0, 19)]


def test_segments_that_are_not_parquet_stay_out_and_hide_nothing(
        setup: tuple[MemoryObjectStore, ArchiveCommitter]) -> None:
    store, committer = setup
    from tests.unit.test_compaction_helpers import make_records, write_segment

    seed(store, [(0, 9)])
    write_segment(store, k(0, 10, 19), make_records(10, 19), "arrow")
    r = committer.sync("r1", "t")
    assert r.added == 1 and r.not_parquet == [k(0, 10, 19).to_key()]


def test_one_follower_per_region_commits_and_a_new_segment_is_in_the_next_step(
        setup: tuple[MemoryObjectStore, ArchiveCommitter]) -> None:
    from replicator.cli.archive_follow import ArchiveFollower

    store, committer = setup
    settings = committer.settings.model_copy(update={"metrics": committer.settings.metrics
                                                     .model_copy(update={"port": 0})})
    first = ArchiveFollower(settings, store=store, committer=committer)
    second = ArchiveFollower(settings, store=store,
                             committer=ArchiveCommitter(settings, store))
    seed(store, [(0, 9)])
    assert [r.added for r in first.step()] == [1]
    assert second.step() == []           # the lease is held: it waits
    seed(store, [(10, 19)])
    assert [r.added for r in first.step()] == [1]
    first.close()                        # the lease is released: the other takes over
    seed(store, [(20, 29)])
    assert [r.added for r in second.step()] == [1]
    second.close()
    assert committer.metrics.value("replicator_archive_files_added_total",
                                   {"region": "r1", "topic": "t"}) == 2


def test_a_recreated_topics_table_lists_only_its_live_incarnation(
        setup: tuple[MemoryObjectStore, ArchiveCommitter]) -> None:
    # The same offsets in two incarnations (the topic deleted and created again): a table
    # holding both would list every position twice, with different records.
    store, committer = setup
    seed(store, [(0, 9), (10, 19)])
    assert committer.sync("r1", "t").added == 2
    later = dataclasses.replace(k(0, 0, 4), incarnation="newid")
    write_segment(store, later, make_records(0, 4, 1))
    now = datetime.now(UTC)
    meta = TopicMetadata.of("t", "r1", 1, {}, now)
    meta = dataclasses.replace(meta, incarnations=(
        Incarnation("oldid", "", {}, {}, None), Incarnation("newid", "newid", {0: 19}, {0: 0},
                                                            now)))
    store.put(topic_meta_key("data", "r1", "t"), meta.encode())
    committer.sync("r1", "t", partition=0)  # one partition: of the live incarnation too
    table = committer.table("r1", "t", create=False)
    assert table is not None
    assert listed(table) == [later]
    committer.sync("r1", "t")
    assert listed(table) == [later]


def test_a_table_that_stops_being_brought_up_to_date_fires_the_stale_alert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ReplicatorArchiveTableStale`` as written in deploy/prometheus, evaluated on the
    committer's scraped metrics: quiet but healthy steps keep it silent (a step with nothing
    to commit still marks the table up to date); failing steps let it fire."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the alert rules")
    from replicator.archive.iceberg import CatalogError
    from replicator.core.metrics import Metrics
    from tests.promql import fires, scrape

    alerts = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / \
        "replicator-alerts.yaml"
    expr = next(str(r["expr"]) for g in yaml.safe_load(alerts.read_text())["groups"]
                for r in g["rules"] if r.get("alert") == "ReplicatorArchiveTableStale")
    now = [datetime(2026, 11, 26, 12, 0, tzinfo=UTC)]
    metrics = Metrics()
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store, metrics=metrics,
                                 clock=lambda: now[0])
    seed(store, [(0, 9)])

    def stale_after(minutes: int) -> bool:
        now[0] += timedelta(minutes=minutes)
        committer.sync_all()
        return fires(expr, scrape(metrics.render().decode()), now[0].timestamp())

    assert [r.added for r in committer.sync_all()] == [1]
    assert not stale_after(20)          # nothing new for 20 minutes: still up to date

    def refused(*_: Any) -> None:
        raise CatalogError("the catalog refuses the connection")

    monkeypatch.setattr(committer.catalog, "load", refused)
    assert not stale_after(10)
    assert stale_after(6)               # 16 minutes since the last step that succeeded
    failures = scrape(metrics.render().decode())["replicator_archive_step_failures_total"]
    assert sum(failures.values()) == 2
