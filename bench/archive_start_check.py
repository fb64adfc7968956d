"""The archive committer's start check with many tables (pyiceberg's SQL catalog on SQLite,
an in-memory bucket): ``ArchiveCommitter.check_mapping`` with and without its search for
tables stamped for a source under another identifier (``archive.stale_tables``), and the
catalog listing alone. ``--stale`` also leaves one table per topic under an earlier
``catalog.table_name`` (the check then reads their properties too, and refuses).

    PYTHONPATH=. python bench/archive_start_check.py --tables 200 [--stale]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replicator.archive import committer as committer_module
from replicator.archive.committer import ArchiveCommitter
from replicator.core.errors import ConfigError
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_compaction_controller import k
from tests.unit.test_compaction_helpers import make_records, write_segment


def best_of(runs: int, check: Callable[[], None]) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        try:
            check()
        except ConfigError:
            pass   # --stale: refused, as it should be
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--stale", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="archive-start-"))
    store = MemoryObjectStore("b")
    for i in range(args.tables):
        write_segment(store, k(0, 0, 9, topic=f"topic{i:04d}"), make_records(0, 9))
    ArchiveCommitter(catalog_settings(tmp), store).sync_all()
    if args.stale:
        ArchiveCommitter(catalog_settings(tmp, table_name="old_{topic}"), store).sync_all()
    settings = catalog_settings(tmp)

    def check() -> None:
        ArchiveCommitter(settings, store).check_mapping()

    real = getattr(committer_module, "refuse_stale")   # noqa: B009 - not re-exported
    setattr(committer_module, "refuse_stale", lambda *a, **kw: None)   # noqa: B010
    without = best_of(args.runs, check)
    setattr(committer_module, "refuse_stale", real)   # noqa: B010
    with_check = best_of(args.runs, check)
    catalog = ArchiveCommitter(settings, store).catalog

    def listing_only() -> None:
        catalog.every_table()

    listing = best_of(args.runs, listing_only)
    print(f"{args.tables} topics{' + as many stale tables' if args.stale else ''}, best of "
          f"{args.runs}: check_mapping {without:.2f} s without the stale-table check, "
          f"{with_check:.2f} s with it (ratio {with_check / without:.2f}); the catalog "
          f"listing alone {listing:.3f} s")


if __name__ == "__main__":
    main()
