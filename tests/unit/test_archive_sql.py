"""``replicator archive sql`` over tables a query scans more than once (a self-join, a
subquery of the same table, a UNION, a WITH): each scan sees every record. The tables'
records come from an in-memory stream (the records of a segment table need S3 to be read:
tests/integration/test_archive_s3.py), scanned once as pyiceberg's are.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.iceberg import Bound, IcebergTable
from replicator.archive.query import run_query
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_compaction_controller import seed

ROWS = pa.table({"partition": pa.array([0] * 10 + [1] * 10, pa.int32()),
                 "offset": pa.array(list(range(10)) * 2, pa.int64())})


def stream(self: IcebergTable, bounds: object = (), snapshot_id: object = None
           ) -> pa.RecordBatchReader:
    """One pass over the rows, like pyiceberg's ``to_arrow_batch_reader``."""
    return pa.RecordBatchReader.from_batches(ROWS.schema, ROWS.to_batches(max_chunksize=4))


def planned(self: IcebergTable, bounds: list[Bound] | tuple[()] = (),
            snapshot_id: object = None) -> list[str]:
    return []


@pytest.mark.parametrize(("sql", "want"), [
    ('SELECT count(*) FROM t a JOIN t b USING (partition, "offset")', 20),
    ('SELECT count(*) FROM t WHERE "offset" = (SELECT max("offset") FROM t)', 2),
    ("SELECT count(*) FROM (SELECT * FROM t WHERE partition = 0 UNION ALL "
     "SELECT * FROM t WHERE partition = 1)", 20),
    ('WITH x AS (SELECT * FROM t) SELECT count(*) FROM x a JOIN x b USING (partition, '
     '"offset")', 20),
    ("SELECT count(*) FROM t", 20),
])
def test_a_table_scanned_more_than_once_is_read_whole_each_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sql: str, want: int) -> None:
    store = MemoryObjectStore("b")
    settings = catalog_settings(tmp_path, table_name="{topic}")
    committer = ArchiveCommitter(settings, store)
    seed(store, [(0, 9)])
    committer.sync("r1", "t")
    monkeypatch.setattr(IcebergTable, "reader", stream)
    monkeypatch.setattr(IcebergTable, "planned_files", planned)
    assert run_query(committer, sql).result.rows == [(want,)]
