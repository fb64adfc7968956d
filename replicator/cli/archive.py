"""``replicator archive``: the archive as Apache Iceberg tables (docs/archive.md):
list and inspect the tables, query them with SQL, keep them in step.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from replicator.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    config_option,
    echo_json,
    fail,
    load_or_exit,
)
from replicator.cli.logs import setup_logging
from replicator.cli.tables import print_table
from replicator.core.errors import ConfigError, ReplicatorError
from replicator.core.settings import Settings

if TYPE_CHECKING:
    from compaction.controller import ArchiveHook
    from replicator.archive.committer import ArchiveCommitter, SyncResult
    from replicator.core.metrics import Metrics
    from replicator.core.storage import ObjectStore

output_option = click.option("--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True)


def archive_factory(settings: Settings, store: ObjectStore, metrics: Metrics) -> ArchiveHook:
    """Compaction's hook into the archive tables (``[catalog]`` enabled).

    Raises:
        ConfigError: the ``archive`` extra is not installed, or two sources map to one
            table.
    """
    try:
        from replicator.archive.committer import ArchiveCommitter
    except ImportError as e:
        raise ConfigError("catalog.enabled", f"needs the 'archive' extra (pip install "
                          f"'kafka-s3-replicator[archive]'): {e}") from e
    committer = ArchiveCommitter(settings, store, metrics=metrics)
    committer.check_mapping()
    return committer


def _committer(config: Path) -> tuple[Settings, ArchiveCommitter]:
    settings = load_or_exit(config)
    if not settings.catalog.enabled:
        fail("catalog.enabled is false: set [catalog] enabled = true (docs/configuration.md)",
             EXIT_USAGE)
    try:
        from replicator.archive.committer import ArchiveCommitter
        from replicator.core.s3 import S3ObjectStore
    except ImportError as e:
        fail(f"the archive needs the 'archive' extra (pip install "
             f"'kafka-s3-replicator[archive]'): {e}", EXIT_USAGE)
    try:
        return settings, ArchiveCommitter(settings, S3ObjectStore.from_settings(settings))
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)


def _result_row(r: SyncResult) -> list[Any]:
    return [r.table, r.added, r.removed_covered, r.removed_gone, r.snapshot_id or "",
            len(r.not_parquet)]


def _print_results(results: list[SyncResult], output: str) -> None:
    if output == "json":
        echo_json([vars(r) for r in results])
        return
    print_table(["table", "added", "removed (covered)", "removed (gone)", "snapshot",
                 "not parquet"], [_result_row(r) for r in results])


@click.group()
def archive() -> None:
    """The archive as Apache Iceberg tables: one per topic, over the segment files."""


@archive.command("tables")
@config_option
@output_option
def tables(config: Path, output: str) -> None:
    """Each topic's table: files, records, bytes, current snapshot."""
    _, committer = _committer(config)
    rows = []
    try:
        for region, topic in committer.topics():
            t = committer.table(region, topic, create=False)
            files = t.files() if t is not None else {}
            rows.append({"region": region, "topic": topic,
                         "table": t.name if t is not None else "(none: archive sync)",
                         "query_name": ".".join(t.identifier[-2:]) if t is not None else "",
                         "files": len(files),
                         "records": sum(f.records for f in files.values()),
                         "bytes": sum(f.size for f in files.values()),
                         "snapshot": t.snapshot_id if t is not None else None})
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if output == "json":
        echo_json(rows)
        return
    print_table(["region", "topic", "table", "query name", "files", "records", "bytes",
                 "snapshot"], [list(r.values()) for r in rows])


@archive.command("snapshots")
@config_option
@click.option("--topic", required=True, help="Source topic.")
@click.option("--region", default=None, help="Source region (default: this region).")
@output_option
def snapshots(config: Path, topic: str, region: str | None, output: str) -> None:
    """A table's snapshots, oldest first (what each added and removed)."""
    settings, committer = _committer(config)
    try:
        t = committer.table(region or settings.region, topic, create=False)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if t is None:
        fail(f"no table for {region or settings.region}/{topic} (replicator archive sync)",
             EXIT_FAILURE)
    snaps = t.snapshots()
    if output == "json":
        echo_json([vars(s) for s in snaps])
        return
    print_table(["snapshot", "committed at", "operation", "added files", "deleted files",
                 "total records", "reason", "current"],
                [[s.snapshot_id, s.committed_at.isoformat(), s.operation,
                  s.summary.get("added-data-files", "0"),
                  s.summary.get("deleted-data-files", "0"),
                  s.summary.get("total-records", ""), s.summary.get("replicator.reason", ""),
                  "*" if s.current else ""] for s in snaps])


@archive.command("sql")
@config_option
@click.argument("query")
@click.option("--snapshot", "snapshot_id", type=int, default=None,
              help="Read this snapshot of the table (time travel while its files exist).")
@output_option
def sql(config: Path, query: str, snapshot_id: int | None, output: str) -> None:
    """Run QUERY with DuckDB over the tables (named by the last part of their identifier,
    e.g. sensor_events, or by the last two, e.g. us_east_1.sensor_events: a name two
    tables end in is refused). Filters on partition, "offset" (a keyword: quote it) and
    timestamp prune the files read.
    """
    _, committer = _committer(config)
    from replicator.archive.query import run_query

    try:
        answer = run_query(committer, query, snapshot_id=snapshot_id)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    res = answer.result
    if output == "json":
        echo_json({"columns": res.columns, "rows": [list(r) for r in res.rows],
                   "scans": [vars(s) | {"bounds": [vars(b) for b in s.bounds]}
                             for s in answer.scans]})
        return
    print_table(res.columns, [[_cell(v) for v in r] for r in res.rows])
    for s in answer.scans:
        click.echo(f"-- {s.table}: read {s.files_read} of {s.files} files"
                   + (f" (pruned by {', '.join(f'{b.column} {b.op} {b.value}' for b in s.bounds)})"
                      if s.bounds else ""), err=True)


def _cell(v: Any) -> Any:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v.hex()
    if isinstance(v, list | dict):
        return json.dumps(v, default=str)
    return v


@archive.command("sync")
@config_option
@output_option
def sync(config: Path, output: str) -> None:
    """One commit per table now: new segments in, removed ones out (what `follow` does
    every catalog.commit_interval). Idempotent.
    """
    _, committer = _committer(config)
    try:
        committer.check_mapping()
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    results = committer.sync_all()
    _print_results(results, output)
    if len(results) < len(committer.topics()):
        sys.exit(EXIT_FAILURE)


@archive.command("rebuild")
@config_option
@click.option("--topic", required=True, help="Source topic.")
@click.option("--region", default=None, help="Source region (default: this region).")
@click.option("--drop", is_flag=True,
              help="Drop the catalog entry first (never a data file) and create it again: "
                   "the repair of a damaged entry (its snapshot history is lost).")
@click.option("--register", "metadata", default=None, metavar="METADATA_JSON",
              help="Register the table from this metadata.json first (the newest one under "
                   "the table's metadata/): the repair after a catalog loss, history kept.")
@click.option("--adopt", "old", default=None, metavar="IDENTIFIER",
              help="Rename the table stamped for the topic at this identifier (the name of an "
                   "earlier catalog.table_name or catalog.namespace) to the one the settings "
                   "render, history kept; a table there created since is dropped from the "
                   "catalog first (never a data file).")
@output_option
def rebuild(config: Path, topic: str, region: str | None, drop: bool, metadata: str | None,
            old: str | None, output: str) -> None:
    """A table from the bucket's segments (idempotent)."""
    settings, committer = _committer(config)
    if sum(bool(x) for x in (drop, metadata, old)) > 1:
        fail("--drop, --register and --adopt exclude each other", EXIT_USAGE)
    try:
        result = committer.rebuild(region or settings.region, topic, drop=drop,
                                   register=metadata,
                                   adopt=tuple(old.split(".")) if old else None)
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    _print_results([result], output)


@archive.command("follow")
@config_option
def follow(config: Path) -> None:
    """Keep the region's tables in step with the bucket until SIGTERM/SIGINT: one commit
    per changed table every catalog.commit_interval, by the process holding the region's
    archive lease.
    """
    settings, committer = _committer(config)
    setup_logging(settings.log.level, settings.log.format)
    from replicator.cli.archive_follow import ArchiveFollower

    follower = ArchiveFollower(settings, store=committer.store, committer=committer)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        follower.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        follower.start()
        follower.run()
    except ConfigError as e:
        follower.close()
        fail(str(e), EXIT_USAGE)
    except ReplicatorError as e:
        follower.close()
        fail(str(e), EXIT_FAILURE)
    follower.close()
    sys.exit(EXIT_OK)
