"""Guards of the archive tables against the orders of events in which a table would lie:
a failed read of ``_topic.json``, an output format a table cannot list, two sources mapped
to one table, overlapping segments, unsafe catalog settings. A real pyiceberg SQL catalog
(SQLite) over a MemoryObjectStore; each test fails without its guard.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import IcebergTable
from replicator.core.errors import ReplicatorError, StorageError
from replicator.core.keys import SegmentKey, topic_meta_key
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.test_archive_committer import catalog_settings, listed, swap_of
from tests.unit.test_compaction_controller import k, seed
from tests.unit.test_compaction_helpers import make_records, write_segment


def recreated_topic(store: MemoryObjectStore) -> SegmentKey:
    """A topic deleted and created again: its live incarnation's segment (same offsets)."""
    seed(store, [(0, 9), (10, 19)])
    later = dataclasses.replace(k(0, 0, 4), incarnation="newid")
    write_segment(store, later, make_records(0, 4, 1))
    now = datetime.now(UTC)
    meta = dataclasses.replace(TopicMetadata.of("t", "r1", 1, {}, now), incarnations=(
        Incarnation("oldid", "", {}, {}, None),
        Incarnation("newid", "newid", {0: 19}, {0: 0}, now)))
    store.put(topic_meta_key("data", "r1", "t"), meta.encode())
    return later


def failing_topic_json(store: MemoryObjectStore, monkeypatch: pytest.MonkeyPatch,
                       fail: int) -> None:
    """The ``fail``-th read of ``_topic.json`` from now (1: the next) fails, once."""
    real_get = MemoryObjectStore.get
    reads = [0]

    def get(key: str) -> bytes:
        if key.endswith("_topic.json"):
            reads[0] += 1
            if reads[0] == fail:
                raise StorageError(f"get s3://b/{key}: SlowDown (503)")
        return real_get(store, key)

    monkeypatch.setattr(store, "get", get)


def current(committer: ArchiveCommitter, topic: str = "t") -> IcebergTable:
    table = committer.table("r1", topic, create=False)
    assert table is not None
    return table


# --- a failed read of _topic.json --------------------------------------------------------

@pytest.mark.parametrize("template", ["{topic}", "{topic}_{incarnation}"])
def test_a_failed_read_of_topic_json_fails_the_step_and_never_swaps_incarnations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: str) -> None:
    store = MemoryObjectStore("b")
    later = recreated_topic(store)
    committer = ArchiveCommitter(catalog_settings(tmp_path, table_name=template), store)
    committer.sync("r1", "t")
    table = current(committer)
    snaps = len(table.snapshots())
    assert listed(table) == [later]
    # One read per step names the table and the location it lists (naming.live_identity).
    failing_topic_json(store, monkeypatch, 1)
    with pytest.raises(ReplicatorError, match="SlowDown"):
        committer.sync("r1", "t")
    table.refresh()
    assert listed(table) == [later] and len(table.snapshots()) == snaps
    # sync_all logs it, counts it, and changes nothing.
    failing_topic_json(store, monkeypatch, 1)
    assert committer.sync_all() == []
    assert committer.metrics.value("replicator_archive_step_failures_total",
                                   {"region": "r1", "topic": "t"}) == 1
    assert committer.catalog.tables(("replicator",)) == [current(committer).identifier]


def test_a_recreate_during_a_step_never_lists_the_new_incarnation_in_the_earlier_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The topic recreated right after a step read ``_topic.json`` for its table: the step
    lists the incarnation that table is of (one read for both), and the next step follows
    the new one into its own table. Two reads listed the new incarnation's segments in the
    earlier one's table, its own removed as gone."""
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path, table_name="{topic}_{incarnation}"),
                                 store)
    now = datetime.now(UTC)
    old = Incarnation("oldid", "", {}, {0: 0}, now)
    meta = dataclasses.replace(TopicMetadata.of("t", "r1", 1, {}, now), incarnations=(old,))
    meta_key = topic_meta_key("data", "r1", "t")
    store.put(meta_key, meta.encode())
    first = seed(store, [(0, 9)])
    committer.sync("r1", "t")
    seed(store, [(10, 19)])
    newer = dataclasses.replace(k(0, 0, 4), incarnation="newid")
    write_segment(store, newer, make_records(0, 4))
    recreated = dataclasses.replace(meta, incarnations=(
        old, Incarnation("newid", "newid", {0: 19}, {0: 0}, now)))
    real_get = store.get
    reads: list[str] = []

    def get(key: str) -> bytes:
        data = real_get(key)
        if key == meta_key and not reads:
            reads.append(key)
            store.put(meta_key, recreated.encode())   # recreated right after this read
        return data

    monkeypatch.setattr(store, "get", get)
    committer.sync("r1", "t")
    monkeypatch.undo()
    earlier = committer.catalog.load(("replicator", "t_oldid"))
    assert earlier is not None
    assert listed(earlier) == [*first, k(0, 10, 19)]
    committer.sync("r1", "t")
    live = committer.catalog.load(("replicator", "t_newid"))
    assert live is not None and listed(live) == [newer]


# --- a segment format tables cannot list --------------------------------------------------

def test_arrow_segments_with_catalog_are_refused_at_start_naming_the_key(
        tmp_path: Path) -> None:
    from replicator.core.errors import ConfigErrors
    from replicator.core.settings import load_settings

    data: dict[str, Any] = {
        "region": "r1", "s3": {"bucket": "b", "region": "us-east-1"},
        "kafka": {"brokers": "127.0.0.1:1"}, "format": {"name": "arrow"},
        "catalog": {"enabled": True,
                    "properties": {"uri": f"sqlite:///{tmp_path}/catalog.db"}}}
    with pytest.raises(ConfigErrors, match=r"format\.name") as e:
        load_settings(data=data, environ={})
    assert [x.key for x in e.value.errors] == ["format.name"]   # the CLI exits 2
    load_settings(data=data | {"catalog": {"enabled": False}}, environ={})
    load_settings(data=data | {"format": {"name": "parquet"}}, environ={})


# --- two sources, one table ---------------------------------------------------------------

def put(store: MemoryObjectStore, start: int, end: int, *, topic: str = "t",
        region: str = "r1") -> SegmentKey:
    key = k(0, start, end, topic=topic, region=region)
    write_segment(store, key, make_records(start, end))
    return key


def test_two_regions_rendered_to_one_table_are_refused_at_start_and_at_each_step(
        tmp_path: Path) -> None:
    from replicator.archive.ownership import ForeignTable
    from replicator.core.errors import ConfigError

    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(
        catalog_settings(tmp_path, table_name="{topic}", regions=["r1", "r2"]), store)
    mine = put(store, 0, 9, region="r1")
    put(store, 0, 19, region="r2")
    with pytest.raises(ConfigError, match=r"r1/t.* and .*r2/t.*replicator\.t") as e:
        committer.check_mapping()
    assert e.value.key == "catalog.table_name"
    from replicator.cli.archive_follow import ArchiveFollower

    settings = committer.settings.model_copy(update={"metrics": committer.settings.metrics
                                                     .model_copy(update={"port": 0})})
    with pytest.raises(ConfigError, match=r"catalog\.table_name"):   # `archive follow` exits 2
        ArchiveFollower(settings, store=store, committer=committer).start()
    for _ in range(2):   # was: each region's step removed the other's files as "gone"
        results = committer.sync_all()
        assert [r.table for r in results] == ["replicator.t"]
        table = current(committer)
        assert listed(table) == [mine] and len(table.snapshots()) == 1
    assert committer.metrics.value("replicator_archive_refused_steps_total",
                                   {"region": "r2", "topic": "t", "reason": "foreign-table"}) == 2
    with pytest.raises(ForeignTable, match="r1/t"):
        committer.sync("r2", "t")


def test_topic_names_that_sanitize_alike_are_refused_at_start_naming_both(
        tmp_path: Path) -> None:
    from replicator.core.errors import ConfigError

    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(
        catalog_settings(tmp_path, topics=["orders.v1", "orders_v1"]), store)
    with pytest.raises(ConfigError, match=r"orders\.v1.* and .*orders_v1"):
        committer.check_mapping()
    first = put(store, 0, 9, topic="orders.v1")
    put(store, 0, 4, topic="orders_v1")
    committer.sync_all()
    committer.sync_all()
    table = committer.table("r1", "orders.v1", create=False)
    assert table is not None
    assert sorted(table.files()) == [f"s3://b/{first}"]


def test_a_second_bucket_following_the_same_catalog_is_refused(tmp_path: Path) -> None:
    from replicator.archive.ownership import BUCKET, ForeignTable
    from replicator.core.errors import ConfigError

    src, dst = MemoryObjectStore("src"), MemoryObjectStore("dst")
    for store in (src, dst):   # S3 replication: the same keys in both buckets
        seed(store, [(0, 99), (100, 199)])
    a = ArchiveCommitter(catalog_settings(tmp_path), src)
    b = ArchiveCommitter(catalog_settings(tmp_path), dst)
    a.check_mapping()
    a.sync("r1", "t")
    assert current(a).properties[BUCKET] == "src"
    with pytest.raises(ConfigError, match=r"s3://src/data/r1/t.*not s3://dst/data/r1/t"):
        b.check_mapping()
    with pytest.raises(ForeignTable):   # was: the table listed every record twice
        b.sync("r1", "t")
    files = current(a).files()
    assert len(files) == 2 and all(p.startswith("s3://src/") for p in files)


def test_a_table_of_an_earlier_release_is_stamped_and_follows_the_live_incarnation(
        tmp_path: Path) -> None:
    from replicator.archive.ownership import BUCKET, INCARNATION, PREFIX

    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    seed(store, [(0, 9)])
    committer.catalog.create(("replicator", "r1", "t"),
                             {"replicator.region": "r1", "replicator.topic": "t"})
    committer.sync("r1", "t")
    props = current(committer).properties
    assert (props[BUCKET], props[PREFIX]) == ("b", "data") and INCARNATION not in props
    recreated_topic(store)
    committer.sync("r1", "t")
    assert current(committer).properties[INCARNATION] == "newid"


# --- catalogs and warehouses --------------------------------------------------------------

def settings_data(tmp: Path, **catalog: Any) -> dict[str, Any]:
    return {"region": "r1", "s3": {"bucket": "b", "region": "us-east-1"},
            "kafka": {"brokers": "127.0.0.1:1"},
            "catalog": {"enabled": True,
                        "properties": {"uri": f"sqlite:///{tmp}/catalog.db"}} | catalog}


@pytest.mark.parametrize(("catalog", "key"), [
    ({"properties": {}}, "catalog.properties.uri"),   # the default: a relative path
    ({"properties": {"uri": "sqlite:///catalog.db"}}, "catalog.properties.uri"),
    ({"properties": {"uri": "sqlite://"}}, "catalog.properties.uri"),
    ({"warehouse": "s3://b/data/iceberg"}, "catalog.warehouse"),
    ({"warehouse": "s3://b/data"}, "catalog.warehouse"),
    ({"type": "dynamodb", "properties": {}}, "catalog.type"),
])
def test_unsafe_catalog_settings_are_refused_naming_the_key(
        tmp_path: Path, catalog: dict[str, Any], key: str) -> None:
    from replicator.core.errors import ConfigErrors
    from replicator.core.settings import load_settings

    data = settings_data(tmp_path, **catalog)
    if catalog.get("properties") == {}:
        del data["catalog"]["properties"]
    with pytest.raises(ConfigErrors) as e:
        load_settings(data=data, environ={})
    assert [x.key for x in e.value.errors] == [key]   # the CLI exits 2


def test_safe_catalog_settings_load(tmp_path: Path) -> None:
    from replicator.core.settings import load_settings

    for catalog in ({}, {"warehouse": "s3://b/iceberg"}, {"warehouse": "s3://b/database"},
                    {"warehouse": "s3://other/data/iceberg"},
                    {"type": "glue", "properties": {"glue.id": "1"}}):
        load_settings(data=settings_data(tmp_path, **catalog), environ={})
    data = settings_data(tmp_path)
    data["catalog"] = {"enabled": False}   # the default URI is only refused when used
    load_settings(data=data, environ={})


def test_a_second_catalog_over_the_same_warehouse_is_refused_and_register_repairs(
        tmp_path: Path) -> None:
    from replicator.archive.iceberg_catalog import TableLocationInUse

    store = MemoryObjectStore("b")
    seed(store, [(0, 9), (10, 19)])
    first = ArchiveCommitter(catalog_settings(tmp_path), store)
    first.sync("r1", "t")
    history = [s.snapshot_id for s in current(first).snapshots()]
    metadata = current(first).metadata_location
    other = catalog_settings(tmp_path, properties={"uri": f"sqlite:///{tmp_path}/other.db"})
    second = ArchiveCommitter(other, store)   # its own catalog, the same warehouse
    with pytest.raises(TableLocationInUse, match="register"):
        second.sync("r1", "t")
    assert second.catalog.load(("replicator", "r1", "t")) is None
    # The catalog lost: the table comes back with its history from its metadata.json.
    seed(store, [(20, 29)])
    r = second.rebuild("r1", "t", register=metadata)
    assert r.added == 1
    assert [s.snapshot_id for s in current(second).snapshots()][:len(history)] == history
    # A damaged entry dropped and created again over its own metadata.
    assert second.rebuild("r1", "t", drop=True).added == 3


# --- secrets and the SQL sandbox ----------------------------------------------------------

def test_catalog_secrets_are_masked_in_what_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from replicator.archive.iceberg import wrap_error
    from replicator.core.settings.catalog import CatalogSettings

    rest = CatalogSettings(enabled=True, type="rest", properties={
        "uri": "https://polaris.example.com/api/catalog", "credential": "cid:CLIENT-SECRET",
        "warehouse": "prod", "s3.secret-access-key": "AWS-SECRET"})
    sql = CatalogSettings(enabled=True, type="sql", properties={
        "uri": "postgresql+psycopg2://iceberg:DB-PASSWORD@db.internal:5432/catalog"})
    shown = f"{rest.masked_properties()} {sql.masked_properties()}"
    assert "CLIENT-SECRET" not in shown and "AWS-SECRET" not in shown
    assert "DB-PASSWORD" not in shown and "iceberg:***@db.internal" in shown
    assert "https://polaris.example.com/api/catalog" in shown   # no password: as it is
    err = wrap_error("loading the sql catalog", RuntimeError(
        "could not connect to postgresql://iceberg:DB-PASSWORD@db.internal/catalog"))
    assert "DB-PASSWORD" not in str(err)
    # What `archive follow` and every service log at start.
    from replicator.cli.archive_follow import ArchiveFollower

    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    settings = settings.model_copy(update={
        "metrics": settings.metrics.model_copy(update={"port": 0}),
        "catalog": settings.catalog.model_copy(update={"properties": {
            **settings.catalog.properties, "credential": "cid:CLIENT-SECRET"}})})
    with caplog.at_level(logging.INFO):
        ArchiveFollower(settings, store=store,
                        committer=ArchiveCommitter(catalog_settings(tmp_path), store)).start()
    assert "archive committer" in caplog.text and "CLIENT-SECRET" not in caplog.text
    assert "CLIENT-SECRET" not in str(settings.masked())


@pytest.mark.parametrize("sql", [
    "SELECT content FROM read_text('{secret}')",
    "COPY (SELECT 42 AS answer) TO '{out}'",
    "ATTACH '{out}' AS other",
    "INSTALL httpfs",
    "SET enable_external_access = true",
    "SELECT * FROM read_parquet('s3://any-bucket/any.parquet')",
])
def test_archive_sql_reads_its_tables_and_nothing_else(tmp_path: Path, sql: str) -> None:
    import pyarrow as pa

    from replicator.archive.duckdb_sql import QueryError, run_sql

    secret = tmp_path / "config.toml"
    secret.write_text('credential = "cid:CLIENT-SECRET"\n')
    out = tmp_path / "out.csv"
    rows = pa.table({"a": [1, 2, 3]})

    def reader() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches())

    assert run_sql("SELECT sum(a) FROM t", {"t": reader}).rows == [(6,)]
    with pytest.raises(QueryError):
        run_sql(sql.format(secret=secret, out=out), {"t": reader})
    assert not out.exists()


# --- one odd file ---------------------------------------------------------------------------

def odd_segment(store: MemoryObjectStore, key: SegmentKey) -> None:
    """Parquet at a segment key with one more column than the table (a future format)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from formats.base import SEGMENT_SCHEMA

    schema = SEGMENT_SCHEMA.append(pa.field("leader_epoch", pa.int32()))
    rows = pa.Table.from_pylist([
        {"offset": o, "timestamp": 1_700_000_000_000 + o, "timestamp_type": 1, "key": None,
         "value": b"v", "headers": [], "leader_epoch": 3}
        for o in range(key.start, key.end + 1)], schema=schema)
    buf = io.BytesIO()
    pq.write_table(rows, buf)
    store.put(key.to_key(), buf.getvalue())


def test_one_odd_file_is_quarantined_and_the_others_are_committed(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    seed(store, [(0, 9)])
    committer.sync("r1", "t")
    odd_segment(store, k(0, 10, 19))
    for i in range(2):
        seed(store, [(20 + 10 * i, 29 + 10 * i)])
        r = committer.sync("r1", "t")   # was: CatalogError for the whole commit, each step
        assert r.added == 1 and r.quarantined == [k(0, 10, 19).to_key()]
    assert listed(current(committer)) == [k(0, 0, 9), k(0, 20, 29), k(0, 30, 39)]
    assert committer.metrics.value("replicator_archive_segments_not_in_table_total",
                                   {"region": "r1", "topic": "t", "reason": "schema"}) == 1


def test_a_swap_keeps_the_inputs_whose_output_is_quarantined(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    inputs = seed(store, [(0, 9), (10, 19)]) + seed(store, [(0, 9), (10, 19)], partition=1)
    committer.sync("r1", "t")
    odd_segment(store, k(1, 0, 19))                  # partition 0's output: odd
    seed(store, [(0, 19)], level=1, partition=1)     # partition 1's output: fine
    r = swap_of(committer, "r1", "t", inputs)
    assert r.kept == [x.to_key() for x in inputs[:2]]
    assert listed(current(committer)) == [*inputs[:2], k(1, 0, 19, partition=1)]
    # A compaction run deletes only what the swap did not keep.
    from tests.unit.test_archive_expiry import run

    (tmp_path / "2").mkdir()
    settings = catalog_settings(tmp_path / "2", snapshot_retention="0s")
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(settings, store)
    inputs = seed(store, [(0, 9), (10, 19)]) + seed(store, [(0, 9), (10, 19)], partition=1)
    committer.sync("r1", "t")
    real_swap = committer.swap

    def swap(region: str, topic: str, deleting: Any) -> Any:
        odd_segment(store, k(1, 0, 19))   # partition 0's output turns out odd
        return real_swap(region, topic, deleting)

    committer.swap = swap  # type: ignore[method-assign]
    report = run(settings, store, committer)
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs[2:])
    kept = set(store.keys())
    assert {x.to_key() for x in inputs[:2]} <= kept
    assert listed(current(committer)) == [*inputs[:2], k(1, 0, 19, partition=1)]


def test_the_metadata_of_a_create_that_never_committed_does_not_wedge_the_table(
        tmp_path: Path) -> None:
    """A catalog lost before its table's first commit: another catalog cannot tell that
    table from a live one (test_archive_second_catalog.py), so it is refused, and
    ``rebuild --register`` takes it over. (A create that failed halfway is created over by
    its own catalog: test_archive_second_catalog.py.)"""
    from replicator.archive.iceberg_catalog import TableLocationInUse

    store = MemoryObjectStore("b")
    seed(store, [(0, 9)])
    first = ArchiveCommitter(catalog_settings(tmp_path), store)
    table = first.table("r1", "t")   # created, never committed
    assert table is not None
    lost = catalog_settings(tmp_path, properties={"uri": f"sqlite:///{tmp_path}/new.db"})
    with pytest.raises(TableLocationInUse, match="register"):
        ArchiveCommitter(lost, store).sync("r1", "t")
    assert ArchiveCommitter(lost, store).rebuild(
        "r1", "t", register=table.metadata_location).added == 1
