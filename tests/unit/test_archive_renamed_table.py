"""A changed ``catalog.table_name`` or ``catalog.namespace`` between runs: the table stamped
for a source under the old identifier would never be stepped again (and list deleted
segments after a compaction), so the start refuses it, naming both identifiers and the way
out, and ``rebuild --adopt`` renames it, history kept (``archive.stale_tables``). A real
pyiceberg SQL catalog (SQLite) over a MemoryObjectStore; each test fails without the check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg_catalog import IcebergCatalog
from replicator.core.errors import ConfigError
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings, listed
from tests.unit.test_archive_guards import recreated_topic
from tests.unit.test_compaction_controller import k, seed
from tests.unit.test_compaction_helpers import make_records, write_segment


def followed(tmp_path: Path, store: MemoryObjectStore, **catalog: Any) -> ArchiveCommitter:
    committer = ArchiveCommitter(catalog_settings(tmp_path, **catalog), store)
    committer.check_mapping()
    committer.sync_all()
    return committer


@pytest.mark.parametrize(("change", "old", "new"), [
    ({"table_name": "{topic}"}, "replicator.r1.t", "replicator.t"),
    ({"namespace": "archive"}, "replicator.r1.t", "archive.r1.t"),
])
def test_a_renamed_table_name_is_refused_at_start_naming_both_and_the_way_out(
        tmp_path: Path, change: dict[str, str], old: str, new: str) -> None:
    store = MemoryObjectStore("b")
    seed(store, [(0, 9), (10, 19)])
    followed(tmp_path, store)
    second = ArchiveCommitter(catalog_settings(tmp_path, **change), store)
    with pytest.raises(ConfigError) as e:
        second.check_mapping()   # was: a second table, the first never stepped again
    assert e.value.key == "catalog.table_name"
    for text in (f"table {old} ", f"now {new}", "catalog.namespace",
                 f"--topic t --adopt {old}"):
        assert text in str(e.value), text


@pytest.mark.parametrize("created_since", [False, True])
def test_adopt_renames_the_old_table_with_its_history(tmp_path: Path,
                                                      created_since: bool) -> None:
    store = MemoryObjectStore("b")
    seed(store, [(0, 9)])
    first = followed(tmp_path, store)
    table = first.table("r1", "t", create=False)
    assert table is not None
    history = [s.snapshot_id for s in table.snapshots()]
    seed(store, [(10, 19)])
    second = ArchiveCommitter(catalog_settings(tmp_path, table_name="{topic}"), store)
    if created_since:   # a run of the new settings before this check existed
        second.sync("r1", "t")
    second.rebuild("r1", "t", adopt=("replicator", "r1", "t"))
    second.check_mapping()   # nothing stale any more
    adopted = second.table("r1", "t", create=False)
    assert adopted is not None and adopted.name.endswith("replicator.t")
    assert [s.snapshot_id for s in adopted.snapshots()][:len(history)] == history
    assert listed(adopted) == [k(0, 0, 9), k(0, 10, 19)]
    assert second.catalog.load(("replicator", "r1", "t")) is None


def test_adopt_refuses_a_table_of_another_source(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    seed(store, [(0, 9)])
    followed(tmp_path, store)
    other = ArchiveCommitter(catalog_settings(tmp_path, table_name="{topic}"), store)
    with pytest.raises(ConfigError, match="not a table of"):
        other.adopt("r1", "u", ("replicator", "r1", "t"))
    with pytest.raises(ConfigError, match="no such table"):
        other.adopt("r1", "t", ("replicator", "r1", "nope"))


def test_tables_of_other_sources_and_earlier_incarnations_are_not_stale(
        tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    seed(store, [(0, 9)])
    for topic in ("tt", "t_x"):   # names holding "t": read, and not this source's
        write_segment(store, k(0, 0, 9, topic=topic), make_records(0, 9))
    followed(tmp_path, store)
    # Another bucket following the same catalog under other names.
    other = MemoryObjectStore("b2")
    seed(other, [(0, 9)])
    followed(tmp_path, other, table_name="b2_{topic}")
    ArchiveCommitter(catalog_settings(tmp_path), store).check_mapping()
    # A topic deleted and created again, one table per incarnation: the old one stays.
    (tmp_path / "inc").mkdir()
    store = MemoryObjectStore("b")
    template = {"table_name": "{topic}_{incarnation}"}
    first = ArchiveCommitter(catalog_settings(tmp_path / "inc", **template), store)
    seed(store, [(0, 9)])
    first.sync("r1", "t")          # the first incarnation's table (no topic id recorded)
    recreated_topic(store)
    later = ArchiveCommitter(catalog_settings(tmp_path / "inc", **template), store)
    later.sync("r1", "t")
    assert len(later.catalog.every_table()[0]) == 2
    later.check_mapping()


def test_the_start_lists_the_catalog_once_and_loads_each_table_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryObjectStore("b")
    topics = [f"topic{i:02d}" for i in range(12)]
    for t in topics:
        write_segment(store, k(0, 0, 9, topic=t), make_records(0, 9))
    followed(tmp_path, store)
    ArchiveCommitter(catalog_settings(tmp_path, table_name="old_{topic}"), store).sync_all()
    loads: list[tuple[str, ...]] = []
    lists = [0]
    real_load, real_every = IcebergCatalog.load, IcebergCatalog.every_table

    def load(self: IcebergCatalog, identifier: tuple[str, ...]) -> Any:
        loads.append(identifier)
        return real_load(self, identifier)

    def every_table(self: IcebergCatalog, *also: tuple[str, ...]) -> Any:
        lists[0] += 1
        return real_every(self, *also)

    monkeypatch.setattr(IcebergCatalog, "load", load)
    monkeypatch.setattr(IcebergCatalog, "every_table", every_table)
    with pytest.raises(ConfigError, match="11 more such table"):
        ArchiveCommitter(catalog_settings(tmp_path), store).check_mapping()
    assert lists == [1]
    assert len(loads) == len(set(loads)) == 2 * len(topics)



def test_the_own_namespace_is_checked_when_the_catalogs_root_cannot_be_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryObjectStore("b")
    seed(store, [(0, 9)])
    followed(tmp_path, store)
    second = ArchiveCommitter(catalog_settings(tmp_path, table_name="{topic}"), store)
    pyiceberg_catalog = second.catalog._catalog
    real = pyiceberg_catalog.list_namespaces

    def list_namespaces(namespace: Any = ()) -> Any:
        if not namespace:
            raise PermissionError("AccessDenied: glue:GetDatabases")
        return real(namespace)

    monkeypatch.setattr(pyiceberg_catalog, "list_namespaces", list_namespaces)
    with pytest.raises(ConfigError, match=r"table replicator\.r1\.t is stamped"):
        second.check_mapping()
    assert "(root): PermissionError: AccessDenied" in caplog.text
