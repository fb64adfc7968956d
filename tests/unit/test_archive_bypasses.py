"""Guards of the archive tables that ordinary orders and spellings bypassed (a break-it
review): pyiceberg's commit retry switched back on by another engine, a topic whose name
starts with ``_``, two regions' tables under one name in ``archive sql``, and catalog
settings spelled another way. A real pyiceberg SQL catalog (SQLite) over a
MemoryObjectStore; each test fails without its guard.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import IcebergTable
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_compaction_controller import k, seed
from tests.unit.test_compaction_helpers import make_records, write_segment

RETRIES = "commit.retry.num-retries"


def scanned(table: IcebergTable) -> list[str]:
    """Every path the current snapshot lists, as engines read them (twice if listed twice)."""
    table.refresh()
    return sorted(t.file.file_path for t in table._table.scan().plan_files())


def current(committer: ArchiveCommitter, topic: str = "t") -> IcebergTable:
    table = committer.table("r1", topic, create=False)
    assert table is not None
    return table


# --- pyiceberg's commit retry -------------------------------------------------------------

def other_engine_sets_retries(table: IcebergTable) -> None:
    """``ALTER TABLE ... SET TBLPROPERTIES ('commit.retry.num-retries'='4')`` elsewhere."""
    other = IcebergTable(table._table.catalog.load_table(table.identifier))
    other._table.transaction().set_properties({RETRIES: "4"}).commit_transaction()


@pytest.mark.parametrize("when", ["before the step", "between load and commit"])
def test_a_retry_count_set_by_another_engine_never_reapplies_a_stale_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Committer A plans "add s"; committer B commits "add s" first; the catalog refuses A's
    commit. With pyiceberg's retry on, A's append is applied again on B's snapshot: ``s``
    listed twice (``files()`` is by path, so no later step sees it). The count is set
    before A's step (A loads it), or while A plans (A's first commit conflicts with B's, and
    A re-plans on refreshed metadata that carries it)."""
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path)
    a, b = ArchiveCommitter(settings, store), ArchiveCommitter(settings, store)
    seed(store, [(0, 9)])
    a.sync("r1", "t")
    if when == "before the step":
        other_engine_sets_retries(current(a))
    seed(store, [(10, 19)])
    real_commit: Callable[..., Any] = a._commit
    calls = [0]

    def commit(table: IcebergTable, *args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if when == "between load and commit" and calls[0] == 1:
            b.sync("r1", "t")
            other_engine_sets_retries(table)
            seed(store, [(20, 29)])   # A's re-plan adds it
        if calls[0] == (1 if when == "before the step" else 2):
            b.sync("r1", "t")   # B's step lands between A's plan and A's commit
        return real_commit(table, *args, **kw)

    monkeypatch.setattr(a, "_commit", commit)
    a.sync("r1", "t")
    monkeypatch.undo()
    a.sync("r1", "t")
    paths = scanned(current(a))
    want = 2 if when == "before the step" else 3
    assert len(paths) == len(set(paths)) == want, paths
    assert current(a).properties[RETRIES] == "0"


def test_a_name_mapping_removed_by_another_engine_is_set_again_by_the_next_step(
        tmp_path: Path) -> None:
    """Segments of footer version 1 carry no field ids: without the table's name mapping
    Iceberg's Java reader gives their columns ids by position (the wrong columns)."""
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    seed(store, [(0, 9)])
    committer.sync("r1", "t")
    created = current(committer).properties["schema.name-mapping.default"]
    for change in ("remove", "set"):
        tx = current(committer)._table.transaction()
        if change == "remove":
            tx.remove_properties("schema.name-mapping.default")
        else:
            tx.set_properties({"schema.name-mapping.default": "[]"})
        tx.commit_transaction()
        committer.sync("r1", "t")
        assert current(committer).properties.get("schema.name-mapping.default") == created


# --- topics whose names start with "_" ------------------------------------------------------

def test_a_topic_whose_name_starts_with_an_underscore_gets_its_table(tmp_path: Path) -> None:
    """Only ``__*``, ``_schemas`` and the replicator's own topics are internal
    (core/topic_sets.py); ``_audit`` is replicated like any other and needs its table. The
    replicator's own folders are under each topic's, not beside them."""
    from replicator.core.keys import group_export_key, heartbeat_key

    store = MemoryObjectStore("b")
    for topic in ("orders", "_audit", "__consumer_offsets"):
        write_segment(store, k(0, 0, 9, topic=topic), make_records(0, 9))
    store.put(group_export_key("data", "r1", "orders", "g"), b"{}")
    store.put(heartbeat_key("data", "r1", "_audit", "egress-0"), b"{}")
    store.put("data/r1/_archive.lock", b"{}")          # the committers' lease: an object
    store.put("data/r1/not a topic!/x", b"")           # no topic can have this name
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    assert committer.topics() == [("r1", "__consumer_offsets"), ("r1", "_audit"),
                                  ("r1", "orders")]
    committer.check_mapping()
    tables = sorted(r.table for r in committer.sync_all())
    assert tables == ["replicator.r1.__consumer_offsets", "replicator.r1._audit",
                      "replicator.r1.orders"]
    assert len(current(committer, "_audit").files()) == 1


# --- archive sql with two regions -------------------------------------------------------------

def per_region_rows(self: IcebergTable, bounds: object = (), snapshot_id: object = None
                    ) -> Any:
    """Each table's own rows, one pass (the records of a segment table need S3 to be
    read): 10 in r1's, 20 in r2's."""
    import pyarrow as pa

    n = 10 if ".r1." in self.name else 20
    rows = pa.table({"partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64())})
    return pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches(max_chunksize=4))


@pytest.fixture
def two_regions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArchiveCommitter:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path, regions=["r1", "r2"]), store)
    write_segment(store, k(0, 0, 9), make_records(0, 9))
    write_segment(store, k(0, 0, 19, region="r2"), make_records(0, 19))
    committer.check_mapping()
    assert sorted(r.table for r in committer.sync_all()) == [
        "replicator.r1.t", "replicator.r2.t"]
    monkeypatch.setattr(IcebergTable, "reader", per_region_rows)
    monkeypatch.setattr(IcebergTable, "planned_files", lambda *_: [])
    return committer


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM t",
    "SELECT count(*) FROM r1.t JOIN t USING (\"offset\")",
    "WITH x AS (SELECT * FROM t) SELECT count(*) FROM x",
])
def test_a_name_two_regions_tables_answer_to_is_refused_naming_both(
        two_regions: ArchiveCommitter, sql: str) -> None:
    from replicator.archive.duckdb_sql import QueryError
    from replicator.archive.query import run_query

    with pytest.raises(QueryError, match=r"t names 2 tables \(replicator\.r1\.t, "
                                         r"replicator\.r2\.t\): name one as r1\.t or r2\.t"):
        run_query(two_regions, sql)


@pytest.mark.parametrize(("sql", "want"), [
    ("SELECT count(*) FROM r1.t", 10),
    ("SELECT count(*) FROM r2.t", 20),
    ("SELECT count(*) FROM memory.r2.t", 20),
    ("SELECT (SELECT count(*) FROM r1.t) + (SELECT count(*) FROM R2.T)", 30),
    ('SELECT count(*) FROM r2.t a JOIN r2.t b USING ("offset")', 20),   # scanned twice
    ('SELECT count(*) FROM r2.t WHERE "offset" >= 5 AND partition = 0', 15),
])
def test_each_regions_table_is_named_by_its_last_two_parts(
        two_regions: ArchiveCommitter, sql: str, want: int) -> None:
    from replicator.archive.query import run_query

    answer = run_query(two_regions, sql)
    assert answer.result.rows == [(want,)]
    if "partition = 0" in sql:   # the qualified name prunes like the bare one
        assert [(s.name, [(b.column, b.op, b.value) for b in s.bounds])
                for s in answer.scans] == [
            ("r2.t", [("offset", ">=", 5), ("partition", "=", 0)])]


def test_one_table_named_bare_and_qualified_in_one_query_is_read_whole_for_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from replicator.archive.query import run_query

    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    write_segment(store, k(0, 0, 9), make_records(0, 9))
    committer.sync("r1", "t")
    monkeypatch.setattr(IcebergTable, "reader", per_region_rows)
    monkeypatch.setattr(IcebergTable, "planned_files", lambda *_: [])
    sql = ('SELECT count(*) FROM t WHERE partition = 0 AND "offset" IN '
           '(SELECT "offset" FROM r1.t WHERE "offset" < 3)')
    answer = run_query(committer, sql)
    assert answer.result.rows == [(3,)]
    assert [s.bounds for s in answer.scans] == [[]]   # bounds of one use never prune both


# --- catalog settings spelled another way ---------------------------------------------------

def settings_data(tmp: Path, prefix: str = "data", **catalog: Any) -> dict[str, Any]:
    return {"region": "r1", "s3": {"bucket": "b", "region": "us-east-1", "prefix": prefix},
            "kafka": {"brokers": "127.0.0.1:1"},
            "catalog": {"enabled": True,
                        "properties": {"uri": f"sqlite:///{tmp}/catalog.db"}} | catalog}


@pytest.mark.parametrize(("prefix", "catalog", "key"), [
    # SQLAlchemy's other spellings of a relative or in-memory SQLite database.
    ("data", {"properties": {"uri": "sqlite+pysqlite:///replicator-catalog.sqlite"}},
     "catalog.properties.uri"),
    ("data", {"properties": {"uri": "SQLite:///catalog.db"}}, "catalog.properties.uri"),
    ("data", {"properties": {"uri": "sqlite+aiosqlite:///:memory:"}},
     "catalog.properties.uri"),
    # The default warehouse (s3://b/iceberg) under the segments' prefix.
    ("iceberg", {}, "catalog.warehouse"),
    # Hadoop's spellings, and the bucket's root with the namespace named like the prefix.
    ("data", {"warehouse": "s3a://b/data/iceberg"}, "catalog.warehouse"),
    ("data", {"warehouse": "s3n://b/data"}, "catalog.warehouse"),
    ("data", {"warehouse": "s3://b", "namespace": "data"}, "catalog.warehouse"),
    ("data", {"properties": {"uri": "sqlite:////tmp/c.db", "warehouse": "s3a://b/data/x"}},
     "catalog.properties.warehouse"),
])
def test_unsafe_catalog_settings_in_other_spellings_are_refused_naming_the_key(
        tmp_path: Path, prefix: str, catalog: dict[str, Any], key: str) -> None:
    from replicator.core.errors import ConfigErrors
    from replicator.core.settings import load_settings

    with pytest.raises(ConfigErrors) as e:
        load_settings(data=settings_data(tmp_path, prefix, **catalog), environ={})
    assert [x.key for x in e.value.errors] == [key]   # the CLI exits 2


def test_safe_catalog_settings_in_other_spellings_load(tmp_path: Path) -> None:
    from replicator.core.settings import load_settings

    for catalog in ({"properties": {"uri": f"sqlite+pysqlite:///{tmp_path}/c.db"}},
                    {"warehouse": "s3a://b/iceberg"}, {"warehouse": "s3://b"},
                    {"warehouse": "s3a://other/data/iceberg"}):
        load_settings(data=settings_data(tmp_path, **catalog), environ={})
    load_settings(data=settings_data(tmp_path, prefix="segments"), environ={})


def test_a_password_as_a_query_parameter_and_a_rest_header_are_masked(
        tmp_path: Path) -> None:
    from replicator.archive.iceberg import wrap_error
    from replicator.core.settings import load_settings

    settings = load_settings(data=settings_data(tmp_path, type="rest", properties={
        "uri": "postgresql://db.internal/cat?user=app&password=Hunter2pw&sslmode=require",
        "header.Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.SeCrEtToKeN",
        "header.X-Api-Key": "API-KEY-VALUE"}), environ={})
    shown = str(settings.masked())
    assert "Hunter2pw" not in shown and "SeCrEtToKeN" not in shown
    assert "API-KEY-VALUE" not in shown
    # What is not secret stays readable.
    assert "postgresql://db.internal/cat?user=app&password=***&sslmode=require" in shown
    err = wrap_error("loading the sql catalog", RuntimeError(
        "could not connect: host=db.internal dbname=cat "
        "url=postgresql://db.internal/cat?sslpassword=PEM-PASS;user=app"))
    assert "PEM-PASS" not in str(err) and "user=app" in str(err)
