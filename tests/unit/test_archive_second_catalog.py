"""One catalog per warehouse: a second catalog never creates a table where the first one's
is, even before that table has a snapshot (a new topic's, an idle one's), while a create of
this catalog's own that failed between writing its metadata and the catalog's commit does
not block the table. A real pyiceberg SQL catalog (SQLite) over a MemoryObjectStore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import MetastoreCatalog

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import CatalogError
from replicator.archive.iceberg_catalog import TableLocationInUse
from replicator.core.keys import topic_meta_key
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_archive_guards import current, put

IDENT = ("replicator", "r1", "t")


def new_topic(store: MemoryObjectStore) -> None:
    """A topic egress has started (``_topic.json``) and written no segment of yet."""
    store.put(topic_meta_key("data", "r1", "t"), b'{"partitions": 1, "topic": "t"}')


def metadata_files(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "warehouse" / Path(*IDENT) / "metadata").iterdir())


def test_a_second_catalog_is_refused_over_a_table_with_no_snapshot_yet(
        tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    new_topic(store)
    first = ArchiveCommitter(catalog_settings(tmp_path), store)
    first.sync("r1", "t")   # created, nothing to commit: no snapshot
    assert current(first).snapshot_id is None
    before = metadata_files(tmp_path)
    other = catalog_settings(tmp_path, properties={"uri": f"sqlite:///{tmp_path}/other.db"})
    second = ArchiveCommitter(other, store)   # its own catalog, the same warehouse
    with pytest.raises(TableLocationInUse) as e:
        second.sync("r1", "t")
    location = f"file://{tmp_path}/warehouse/replicator/r1/t"
    assert f"{location}/metadata/" in str(e.value) and "catalog.warehouse" in str(e.value)
    assert "another catalog" in str(e.value)
    assert second.catalog.load(IDENT) is None
    assert metadata_files(tmp_path) == before   # nothing written over the first's table
    put(store, 0, 9)
    assert first.sync("r1", "t").added == 1
    with pytest.raises(TableLocationInUse):   # with a snapshot: refused too
        second.sync("r1", "t")


def test_a_create_that_never_committed_is_created_over_by_its_own_catalog_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryObjectStore("b")
    new_topic(store)
    first = ArchiveCommitter(catalog_settings(tmp_path), store)
    real_write = MetastoreCatalog._write_metadata

    def crash_after_writing(*args: Any) -> None:
        real_write(*args)
        raise OSError("killed between the metadata and the catalog's commit")

    monkeypatch.setattr(MetastoreCatalog, "_write_metadata", staticmethod(crash_after_writing))
    with pytest.raises(CatalogError):
        first.sync("r1", "t")
    monkeypatch.undo()
    assert first.catalog.load(IDENT) is None and len(metadata_files(tmp_path)) == 1
    # Another catalog does not take it: it cannot tell it from the first's live table.
    other = catalog_settings(tmp_path, properties={"uri": f"sqlite:///{tmp_path}/other.db"})
    with pytest.raises(TableLocationInUse):
        ArchiveCommitter(other, store).sync("r1", "t")
    # The catalog that left it (here: restarted) creates the table over it.
    restarted = ArchiveCommitter(catalog_settings(tmp_path), store)
    put(store, 0, 9)
    assert restarted.sync("r1", "t").added == 1
    assert current(restarted).snapshot_id is not None


def test_a_namespace_of_an_earlier_release_gets_the_id_and_without_one_creates_stay_safe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    from replicator.archive.iceberg_catalog import CATALOG_ID

    store = MemoryObjectStore("b")
    new_topic(store)
    first = ArchiveCommitter(catalog_settings(tmp_path), store)
    first.catalog._catalog.create_namespace(IDENT[:-1])   # as an earlier release did
    first.sync("r1", "t")
    own = first.catalog._catalog.load_namespace_properties(IDENT[:-1])[CATALOG_ID]
    assert current(first).properties[CATALOG_ID] == own
    # A catalog that cannot keep namespace properties: tables are still created, and a
    # create left halfway there is refused (an operator registers or removes it).
    (tmp_path / "b").mkdir()
    other = catalog_settings(tmp_path / "b")

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("not allowed to update the namespace")

    monkeypatch.setattr(SqlCatalog, "update_namespace_properties", refused)
    plain = ArchiveCommitter(other, MemoryObjectStore("b"))
    plain.catalog._catalog.create_namespace(IDENT[:-1])
    plain.store.put(topic_meta_key("data", "r1", "t"), b'{"partitions": 1, "topic": "t"}')
    plain.sync("r1", "t")
    assert CATALOG_ID not in current(plain).properties
    assert "cannot keep this catalog's id" in caplog.text
    plain.catalog.drop(IDENT)   # its metadata.json stays: as a create that never committed
    with pytest.raises(TableLocationInUse, match="not set"):
        plain.sync("r1", "t")
