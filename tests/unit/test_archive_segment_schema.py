"""Parquet segments as Iceberg data files other engines read: timestamps in microseconds
(``TIMESTAMP(MICROS, UTC)``, the Iceberg spec's ``timestamptz``) and Parquet field ids equal
to the table's, footer ``format_version`` 2; segments of version 1 (milliseconds, no ids)
stay readable and addable, and tables read them row-based in Spark until compacted.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.base import SEGMENT_SCHEMA
from formats.parquet import PARQUET_FIELD_IDS_VERSION
from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import SEGMENT_TABLE_SCHEMA
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings, listed
from tests.unit.test_compaction_controller import k, seed
from tests.unit.test_compaction_helpers import make_records, read_segment


def parquet_schema(data: bytes) -> pq.ParquetSchema:
    return pq.ParquetFile(io.BytesIO(data)).schema


def test_new_segments_store_micros_and_the_tables_field_ids() -> None:
    store = MemoryObjectStore("b")
    seed(store, [(0, 9)])
    data = store.get(k(0, 0, 9).to_key())
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert meta.metadata[b"format_version"] == str(PARQUET_FIELD_IDS_VERSION).encode()
    ts = parquet_schema(data).column(1)
    logical = json.loads(ts.logical_type.to_json())
    assert (ts.name, logical["timeUnit"], logical["isAdjustedToUTC"]) == (
        "timestamp", "microseconds", True)
    arrow = pq.read_schema(io.BytesIO(data))

    def ids(field: pa.Field, path: str) -> list[tuple[str, int]]:
        out = [(path, int(field.metadata[b"PARQUET:field_id"]))]
        t = field.type
        if pa.types.is_list(t):
            out += ids(t.value_field, f"{path}.element")
        elif pa.types.is_struct(t):
            for child in t:
                out += ids(child, f"{path}.{child.name}")
        return out

    got = [pair for f in arrow for pair in ids(f, f.name)]
    want = [(n, SEGMENT_TABLE_SCHEMA.find_field(n).field_id) for n, _ in got]
    assert got == want and len(got) == 9


def test_version_1_segments_stay_readable_and_addable_next_to_version_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import formats.parquet

    store = MemoryObjectStore("b")
    # A segment of an earlier release: milliseconds, no field ids, format_version 1.
    with monkeypatch.context() as m:
        m.setattr(formats.parquet, "PARQUET_SCHEMA", SEGMENT_SCHEMA)
        m.setattr(formats.parquet, "PARQUET_FIELD_IDS_VERSION", 1)
        seed(store, [(0, 9)])
    old = store.get(k(0, 0, 9).to_key())
    assert pq.ParquetFile(io.BytesIO(old)).metadata.metadata[b"format_version"] == b"1"
    assert "milliseconds" in parquet_schema(old).column(1).logical_type.to_json()
    seed(store, [(10, 19)])
    for start in (0, 10):   # both read back as the same records
        assert read_segment(store, k(0, start, start + 9)) == make_records(start, start + 9)
    committer = ArchiveCommitter(catalog_settings(tmp_path), store)
    assert committer.sync("r1", "t").added == 2
    t = committer.table("r1", "t", create=False)
    assert t is not None and listed(t) == [k(0, 0, 9), k(0, 10, 19)]
    assert t.properties["read.parquet.vectorization.enabled"] == "false"
    # Time bounds in the manifests are microseconds for both (a millisecond bound read as
    # microseconds would prune the old segment).
    from replicator.archive.iceberg import Bound

    first = make_records(0, 0)[0].timestamp_ms * 1000
    assert t.planned_files([Bound("timestamp", ">=", first)]) == sorted(t.files())
    assert t.planned_files([Bound("timestamp", ">", first + 9_000)]) == [
        f"s3://b/{k(0, 10, 19)}"]
