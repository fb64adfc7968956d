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
from tests.unit.test_archive_committer import catalog_settings, listed
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
    for fails in (1, 2):   # the first read (incarnation) or the second (live location)
        failing_topic_json(store, monkeypatch, fails)
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
