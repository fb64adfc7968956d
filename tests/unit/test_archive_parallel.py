"""The committer at many topics: tables stepped in parallel by a bounded pool, one table's
failure or slowness holding none of the others, a step planned from what changed since the
committer's own last commit, and the lag of a table whose steps fail. A real pyiceberg SQL
catalog (SQLite) over a MemoryObjectStore; no timing is asserted.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicator.archive.committer import ArchiveCommitter, SyncResult
from replicator.archive.iceberg import CatalogError, IcebergTable
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_archive_guards import put

TOPICS = [f"t{i}" for i in range(6)]


def committer_of(tmp_path: Path, store: MemoryObjectStore, **catalog: Any) -> ArchiveCommitter:
    settings = catalog_settings(tmp_path, **{"topics": TOPICS, "table_name": "{topic}",
                                             **catalog})
    return ArchiveCommitter(settings, store)


def remembered(committer: ArchiveCommitter, table: IcebergTable) -> list[str]:
    mem = committer._memory.get(table.name, table.snapshot_id)
    assert mem is not None
    return list(mem.files)


def test_a_stuck_table_holds_one_worker_and_the_others_are_stepped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryObjectStore("b")
    for t in TOPICS:
        put(store, 0, 9, topic=t)
    committer = committer_of(tmp_path, store, sync_workers=2)
    others_done = threading.Event()
    done: list[str] = []
    in_flight, most = [0], [0]
    lock = threading.Lock()
    real_sync = ArchiveCommitter.sync

    def sync(self: ArchiveCommitter, region: str, topic: str, **kw: Any) -> SyncResult:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            if topic == "t0":
                # Stepped one after the other, t0 would wait for steps that never start.
                assert others_done.wait(30), "the other tables waited for the stuck one"
            r = real_sync(self, region, topic, **kw)
            with lock:
                done.append(topic)
                if set(done) >= set(TOPICS[1:]):
                    others_done.set()
            return r
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(ArchiveCommitter, "sync", sync)
    results = committer.sync_all()
    assert sorted(r.table for r in results) == [f"replicator.{t}" for t in TOPICS]
    assert done[-1] == "t0"
    assert most[0] == 2   # bounded by catalog.sync_workers, and parallel


def test_one_table_failing_in_any_way_leaves_the_others_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryObjectStore("b")
    for t in TOPICS:
        put(store, 0, 9, topic=t)
    committer = committer_of(tmp_path, store)
    real_sync = ArchiveCommitter.sync

    def sync(self: ArchiveCommitter, region: str, topic: str, **kw: Any) -> SyncResult:
        if topic == "t2":
            raise KeyError("a bug in one table's step")
        if topic == "t4":
            raise CatalogError("the catalog refused t4")
        return real_sync(self, region, topic, **kw)

    monkeypatch.setattr(ArchiveCommitter, "sync", sync)
    results = committer.sync_all()
    assert sorted(r.table for r in results if r.added == 1) == [
        f"replicator.{t}" for t in TOPICS if t not in ("t2", "t4")]
    for t in ("t2", "t4"):
        assert committer.metrics.value("replicator_archive_step_failures_total",
                                       {"region": "r1", "topic": t}) == 1


def test_a_step_reads_the_manifests_only_when_another_writer_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryObjectStore("b")
    committer = committer_of(tmp_path, store, topics=["t"])
    reads = [0]
    real_files = IcebergTable.files

    def files(self: IcebergTable, snapshot_id: int | None = None) -> Any:
        reads[0] += 1
        return real_files(self, snapshot_id)

    monkeypatch.setattr(IcebergTable, "files", files)
    for i in range(5):
        put(store, 10 * i, 10 * i + 9, topic="t")
        committer.sync("r1", "t")
    assert reads[0] == 1   # the first step only: the others knew their snapshot's files
    # Another writer (a compaction run elsewhere, another committer) moves the table on.
    other = ArchiveCommitter(committer.settings, store)
    put(store, 50, 59, topic="t")
    other.sync("r1", "t")
    reads[0] = 0
    put(store, 60, 69, topic="t")
    r = committer.sync("r1", "t")
    assert reads[0] == 1 and r.added == 1
    table = committer.table("r1", "t", create=False)
    assert table is not None
    assert sorted(remembered(committer, table)) == sorted(real_files(table))
    assert sum(f.records for f in real_files(table).values()) == 70


def test_the_files_a_step_remembers_are_those_the_table_lists(tmp_path: Path) -> None:
    # Adds, a compaction swap and files gone from the bucket, all planned from memory.
    from tests.unit.test_compaction_controller import k
    from tests.unit.test_compaction_helpers import make_records, write_segment

    store = MemoryObjectStore("b")
    committer = committer_of(tmp_path, store, topics=["t"])
    for i in range(4):
        put(store, 10 * i, 10 * i + 9, topic="t")
        committer.sync("r1", "t")
    out = k(1, 0, 19)
    write_segment(store, out, make_records(0, 19))
    committer.swap("r1", "t", [k(0, 0, 9), k(0, 10, 19)])
    store.delete_many([k(0, 0, 9).to_key(), k(0, 10, 19).to_key(), k(0, 30, 39).to_key()])
    committer.sync("r1", "t")
    table = committer.table("r1", "t", create=False)
    assert table is not None
    assert sorted(remembered(committer, table)) == sorted(table.files())
    assert sorted(table.files()) == [f"s3://b/{k(0, 20, 29)}", f"s3://b/{out}"]


def test_the_lag_of_a_table_whose_steps_fail_grows_until_one_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [datetime.now(UTC) + timedelta(minutes=10)]
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    committer = ArchiveCommitter(settings, store, clock=lambda: now[0])
    put(store, 0, 9)
    committer.sync("r1", "t")
    labels = {"region": "r1", "topic": "t"}
    put(store, 10, 19)
    landed = datetime.now(UTC)

    def refuse(*_: Any, **__: Any) -> None:
        raise CatalogError("the catalog is down")

    monkeypatch.setattr(IcebergTable, "commit", refuse)
    lags = []
    for _ in range(3):
        now[0] += timedelta(minutes=5)
        with pytest.raises(CatalogError):
            committer.sync("r1", "t")
        lag = committer.metrics.value("replicator_archive_table_lag_seconds", labels)
        assert lag is not None
        lags.append(lag)
    # The segment's age at each failed step (was: the last successful step's value).
    assert lags == sorted(lags) and lags[0] >= (now[0] - landed).total_seconds() - 600
    assert lags[-1] - lags[0] == pytest.approx(600, abs=1)
    monkeypatch.undo()
    committer.sync("r1", "t")
    assert committer.metrics.value("replicator_archive_table_lag_seconds",
                                   labels) == pytest.approx(lags[-1], abs=60)
    committer.sync("r1", "t")
    assert committer.metrics.value("replicator_archive_table_lag_seconds", labels) == 0


def test_manifest_lists_are_read_once_for_the_metadata_in_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.table.snapshots import Snapshot

    store = MemoryObjectStore("b")
    committer = committer_of(tmp_path, store, topics=["t"])
    for i in range(3):
        put(store, 10 * i, 10 * i + 9, topic="t")
        committer.sync("r1", "t")
    table = committer.table("r1", "t", create=False)
    assert table is not None
    known: dict[str, list[str]] = {}
    used = table.metadata_in_use(known)
    assert len(known) == 3

    def no_read(*_: Any) -> Any:
        raise AssertionError("a manifest list read again")

    monkeypatch.setattr(Snapshot, "manifests", no_read)
    assert table.metadata_in_use(known) == used


def test_a_query_reads_the_topic_metadata_of_the_tables_it_names_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from replicator.archive.query import query_tables

    store = MemoryObjectStore("b")
    for t in TOPICS:
        put(store, 0, 9, topic=t)
    committer = committer_of(tmp_path, store)
    committer.sync_all()
    gets: list[str] = []
    real_get = store.get

    def get(key: str, *a: Any, **kw: Any) -> Any:
        gets.append(key)
        return real_get(key, *a, **kw)

    monkeypatch.setattr(store, "get", get)
    assert list(query_tables(committer, {"t3"})) == ["t3"]
    # Was: the _topic.json of every topic in the bucket, for its name.
    assert {g for g in gets if g.endswith("_topic.json")} <= {"data/r1/t3/_topic.json"}


_OPS = st.lists(st.tuples(st.sampled_from(["next", "overlap", "compact", "lose"]),
                          st.integers(0, 1), st.integers(0, 10**6)), min_size=3, max_size=9)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_OPS)
def test_a_step_planned_from_what_changed_leaves_nothing_for_a_full_plan(
        ops: list[tuple[str, int, int]]) -> None:
    """After every step planned from the committer's memory, a committer that knows
    nothing (a full plan: every manifest, every segment) finds nothing to commit, whatever
    appeared or disappeared: segments, overlapping ones, compaction outputs, losses.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="archive-step-memory-") as name:
        replay(Path(name), ops)


def replay(tmp: Path, ops: list[tuple[str, int, int]]) -> None:
    from tests.unit.test_compaction_controller import k
    from tests.unit.test_compaction_helpers import make_records, write_segment

    store = MemoryObjectStore("b")
    # Listed in full at every step: the listing between full listings is
    # test_archive_listing.py's.
    cfg = catalog_settings(tmp, snapshot_retention="0s", full_listing_interval="0s")
    committer = ArchiveCommitter(cfg, store)
    ends = [0, 0]
    for op, p, n in ops:
        keys = sorted((key for key in map(SegmentKey.try_parse, store.keys())
                       if key is not None and key.partition == p), key=lambda x: x.start)
        if op == "next" or not keys:
            key = k(0, ends[p], ends[p] + 9, partition=p)
        elif op == "overlap":   # a rewrite after a rebalance: starts inside the last one
            last = keys[-1]
            key = k(0, (last.start + last.end) // 2, last.end + 5, partition=p)
        elif op == "compact":   # an output over a run of segments (inputs still there)
            first = keys[n % len(keys)]
            key = k(1, first.start, max(x.end for x in keys[n % len(keys):][:3]), partition=p)
        else:   # a lifecycle rule or an operator deletes one
            store.delete(keys[n % len(keys)].to_key())
            key = None
        if key is not None:
            write_segment(store, key, make_records(key.start, key.end))
            ends[p] = max(ends[p], key.end + 1)
        committer.sync("r1", "t")
        assert not ArchiveCommitter(cfg, store).sync("r1", "t").committed
