"""Overlapping segments (a range egress published twice) in the archive table, read with
pyiceberg's scan on the moto server: every offset once before compaction (trimmed copies in
the warehouse), during and after a real compaction run, and after random layouts, arrival
orders and compaction swaps (the property of tests/unit/test_archive_overlaps.py with the
scan as the reader).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction.controller import Compaction
from replicator.archive.committer import ArchiveCommitter
from replicator.archive.query import run_query
from replicator.archive.trims import trim_root
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import load_settings
from replicator.devstack.aws import create_bucket
from tests.conftest import unique_name
from tests.integration.test_archive_s3 import settings_for
from tests.unit.test_archive_overlaps import (
    LATER,
    Row,
    expected,
    layouts,
    put,
    run_scenario,
    segments,
)
from tests.unit.test_compaction_controller import clock


def scanned(committer: ArchiveCommitter) -> list[Row]:
    """The table's rows as pyiceberg's scan reads them."""
    table = committer.table("r1", "t", create=False)
    if table is None or table.snapshot_id is None:
        return []
    data = table.reader().read_all()
    return sorted(zip(data.column("partition").to_pylist(), data.column("offset").to_pylist(),
                      data.column("value").to_pylist(), strict=True))


def test_a_rewritten_range_is_one_record_per_offset_through_compaction(
        moto_endpoint: str, bucket: str, s3_client: Any, tmp_path: Path) -> None:
    settings = load_settings(data=settings_for(moto_endpoint, bucket, tmp_path), environ={})
    store = S3ObjectStore(s3_client, bucket)
    committer = ArchiveCommitter(settings, store)
    put(store, 0, 0, 0, 99)       # published; the offset commit failed
    put(store, 0, 0, 50, 149)     # the new owner re-read from offset 50
    put(store, 0, 0, 150, 199)
    committer.sync("r1", "t")
    assert scanned(committer) == expected(segments(store))
    answer = run_query(committer, 'SELECT count(*), count(DISTINCT "offset") FROM t')
    assert answer.result.rows == [(200, 200)]
    table = committer.table("r1", "t", create=False)
    assert table is not None
    copies = [o.key for o in store.list(trim_root(table.location).split(f"{bucket}/", 1)[1])]
    assert len(copies) == 1

    during: list[list[Row]] = []
    real_delete = store.delete_many

    def delete_many(keys: Any) -> None:
        during.append(scanned(committer))
        real_delete(keys)

    store.delete_many = delete_many  # type: ignore[method-assign]
    report = Compaction(settings, store=store, clock=clock,
                        archive_factory=lambda *_: committer).run_once()
    store.delete_many = real_delete  # type: ignore[method-assign]
    assert report.outcome == "success" and report.deleted, report
    want = expected(segments(store))
    assert during and all(d == want for d in during)
    assert scanned(committer) == want and len(want) == 200
    # The copy left the table with its segment, and the warehouse once no snapshot lists it.
    committer.sync("r1", "t")
    table.refresh()
    pieces = [committer.piece_of(table, p) for p in table.files()]
    assert pieces and all(p is not None and p.whole for p in pieces)
    assert list(store.list(copies[0]))   # younger than ORPHAN_GRACE: kept
    assert ArchiveCommitter(settings, store, clock=LATER).clean_trims(table) == 1
    assert not list(store.list(copies[0]))
    assert scanned(committer) == want


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(layouts, st.data())
def test_the_scan_holds_every_offset_once_at_every_step(
        moto_endpoint: str, s3_client: Any, layout: list[tuple[int, int, int]],
        data: st.DataObject) -> None:
    bucket = unique_name("b")
    create_bucket(s3_client, bucket, "us-east-1")
    store = S3ObjectStore(s3_client, bucket)
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(data=settings_for(moto_endpoint, bucket, Path(tmp)),
                                 environ={})
        committer = ArchiveCommitter(settings, store, clock=LATER)
        run_scenario(store, committer, layout, data, lambda: scanned(committer))
