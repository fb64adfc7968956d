"""The Apache Iceberg seam, with ``archive.iceberg_catalog`` (the catalog): the only modules
that import pyiceberg (docs/archive.md; docs/architecture.md, "The archive as Iceberg
tables"). This one: a table, its schema and properties, its commits and scans.

A table's data files **are** segments: they are registered as they are (``DataFile``
entries built from each segment's Parquet footer), never rewritten. Segments carry no field
ids, so every table has a name mapping (``schema.name-mapping.default``), and no
``partition`` column: the column is an identity partition whose value is in the manifest,
which readers project (the Iceberg spec, "Column Projection").

Commits are optimistic: a commit states the snapshot it was planned on, and the catalog
refuses it if another writer committed meanwhile (``CommitConflict``). pyiceberg's own
retry (which would re-apply the same file changes on the newer snapshot) is switched off
per table (``commit.retry.num-retries = 0``): a caller re-plans from the new snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow.fs import FileSelector, FileType
from pyiceberg.exceptions import (
    CommitFailedException,
)
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
)
from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import EMPTY_DICT, Record
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from replicator.archive import iceberg_listing
from replicator.core.errors import ReplicatorError, RetriableError
from replicator.core.settings.catalog import redact_urls

log = logging.getLogger(__name__)

SEGMENT_TABLE_SCHEMA = Schema(
    NestedField(1, "partition", IntegerType(), required=False,
                doc="Source partition (identity partition: in the manifests, not the files)"),
    NestedField(2, "offset", LongType(), required=False, doc="Source offset"),
    NestedField(3, "timestamp", TimestamptzType(), required=False, doc="Record timestamp"),
    NestedField(4, "timestamp_type", IntegerType(), required=False,
                doc="0 not available, 1 create time, 2 log append time"),
    NestedField(5, "key", BinaryType(), required=False),
    NestedField(6, "value", BinaryType(), required=False),
    NestedField(7, "headers", ListType(8, StructType(
        NestedField(9, "key", StringType(), required=False),
        NestedField(10, "value", BinaryType(), required=False)), element_required=False),
        required=False),
)
"""The segment columns (``formats.base.SEGMENT_SCHEMA``) plus ``partition``. Optional
columns: Iceberg readers check required columns against each file's schema, and the files
are what egress wrote."""

SEGMENT_PARTITION_SPEC = PartitionSpec(
    PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(),
                   name="partition"))
"""One segment holds one source partition: ``partition = 3`` prunes files in the manifests."""

NO_RETRY = "commit.retry.num-retries"

TABLE_PROPERTIES = {
    # Conflicts are re-planned by the caller (module docstring); re-asserted at every step
    # and checked before every commit (IcebergTable._retry_off). The other commit.retry.*
    # properties only matter when this one is positive.
    NO_RETRY: "0",
    # Segments are deleted by compaction and lifecycle rules only: engines' snapshot expiry,
    # orphan-file removal and VACUUM must not delete what they see removed.
    "gc.enabled": "false",
    # Segments of footer format_version 1 store TIMESTAMP(MILLIS) and no field ids, which
    # Spark's vectorized Iceberg reader (<= 1.10) refuses: row-based reads until they are
    # compacted into version-2 outputs.
    "read.parquet.vectorization.enabled": "false",
    # One manifest per add-only commit would pile up: every step and every query plan
    # reads them all (pyiceberg merges only when this is set).
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "16",
    # A merge rewrites the newest bin of manifests up to this size: at the default 8 MB,
    # the whole manifest of two weeks of 30 s segments (40k files, 7 MB) every 16 commits,
    # 3 s each time. At 1 MiB (about 6,000 files) a merge costs a few tenths of a second;
    # a full manifest is left as it is.
    "commit.manifest.target-size-bytes": str(2**20),
    # Bounds for what prunes (offsets, times); none for keys and values, whose segments
    # carry no statistics (formats/parquet.py).
    "write.metadata.metrics.default": "none",
    "write.metadata.metrics.column.offset": "full",
    "write.metadata.metrics.column.timestamp": "full",
    "write.metadata.metrics.column.timestamp_type": "full",
    # Old metadata.json files are removed as new ones are written.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "10",
}


ENFORCED_PROPERTIES = {k: TABLE_PROPERTIES[k]
                       for k in (NO_RETRY, "gc.enabled",
                                 "read.parquet.vectorization.enabled",
                                 "commit.manifest-merge.enabled",
                                 "commit.manifest.min-count-to-merge",
                                 "commit.manifest.target-size-bytes")} | {
    # Footer-version-1 segments carry no field ids: without the mapping Iceberg's Java
    # reader gives them ids by column position (wrong columns) and pyiceberg cannot read
    # them. The value iceberg_catalog.py creates tables with.
    "schema.name-mapping.default":
        create_mapping_from_schema(SEGMENT_TABLE_SCHEMA).model_dump_json()}
"""Table properties every step sets again when someone changed them: those that change what
a commit lists (``commit.retry.num-retries``), what engines read or delete, or what a step
costs (the manifest merge ones: a two-week table's step, docs/architecture.md). Not enforced,
as they change neither: the other ``commit.retry.*`` (only used with retries on),
``write.metadata.*`` (which statistics and how many
old metadata.json files are kept; missing bounds only prune less), the isolation levels
(checked by pyiceberg's retry only) and ``write.data.path`` / ``write.metadata.path``
(where pyiceberg writes; segments and trimmed copies are placed by this module)."""


class CatalogError(RetriableError):
    """The catalog or the table's metadata could not be read or written."""


class CommitConflict(CatalogError):
    """Another writer committed to the table since this commit was planned."""


@dataclass(frozen=True)
class NewFile:
    """A segment to register: its URL, size, source partition and Parquet footer."""

    path: str
    size: int
    partition: int
    footer: pq.FileMetaData


@dataclass(frozen=True)
class TableFile:
    """A data file the table's current snapshot lists."""

    path: str
    records: int
    size: int


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot of a table, for listings."""

    snapshot_id: int
    parent_id: int | None
    committed_at: datetime
    operation: str
    summary: dict[str, str]
    current: bool


def wrap_error(what: str, e: Exception) -> CatalogError:
    """``e`` as a ``CatalogError`` (``CommitConflict`` for a refused commit), redacted:
    drivers may quote the connection URL (and its password) in their messages.
    """
    if isinstance(e, CommitFailedException):
        return CommitConflict(redact_urls(f"{what}: {e}"))
    return CatalogError(redact_urls(f"{what}: {type(e).__name__}: {e}"))


class IcebergTable:
    """One table; its state is the snapshot it was loaded (or last refreshed) at."""

    def __init__(self, table: Table) -> None:
        self._table = table

    @property
    def identifier(self) -> tuple[str, ...]:
        return tuple(self._table.name())

    @property
    def name(self) -> str:
        return ".".join(self.identifier)

    @property
    def properties(self) -> dict[str, str]:
        return dict(self._table.properties)

    @property
    def snapshot_id(self) -> int | None:
        """The current snapshot (``None`` before the first commit)."""
        snap = self._table.current_snapshot()
        return None if snap is None else snap.snapshot_id

    @property
    def metadata_location(self) -> str:
        return self._table.metadata_location

    @property
    def location(self) -> str:
        """The table's base location (its metadata is under ``{location}/metadata/``)."""
        return self._table.location().rstrip("/")

    def metadata_in_use(self, known: dict[str, list[str]] | None = None) -> set[str]:
        """Every metadata file the table's current state refers to: the metadata files
        it logs, and each kept snapshot's manifest list and manifests. ``known``: the
        manifests of manifest lists read before (immutable files: read once), updated.
        """
        meta = self._table.metadata
        used = {self._table.metadata_location, *(e.metadata_file for e in meta.metadata_log)}
        known = {} if known is None else known
        try:
            for snap in meta.snapshots:
                used.add(snap.manifest_list)
                if snap.manifest_list not in known:
                    known[snap.manifest_list] = [
                        m.manifest_path for m in snap.manifests(self._table.io)]
                used.update(known[snap.manifest_list])
        except Exception as e:
            raise wrap_error(f"reading the manifest lists of {self.name}", e) from e
        return used

    def set_properties(self, props: Mapping[str, str]) -> None:
        """Set table properties (one metadata commit)."""
        try:
            with self._table.transaction() as tx:
                tx.set_properties(dict(props))
        except Exception as e:
            raise wrap_error(f"setting properties {sorted(props)} of {self.name}", e) from e

    def refresh(self) -> None:
        """Load the catalog's current state of the table."""
        try:
            self._table.refresh()
        except Exception as e:
            raise wrap_error(f"refreshing table {self.name}", e) from e

    def has_snapshot(self, snapshot_id: int) -> bool:
        """True when the metadata keeps snapshot ``snapshot_id``."""
        return self._table.metadata.snapshot_by_id(snapshot_id) is not None

    def files(self, snapshot_id: int | None = None) -> dict[str, TableFile]:
        """The data files of snapshot ``snapshot_id`` (default: the current one), by path
        (an unknown snapshot: ``has_snapshot``).
        """
        if snapshot_id is None and self._table.current_snapshot() is None:
            return {}
        try:
            tasks = self._table.scan(snapshot_id=snapshot_id, options=_EVERY_FILE).plan_files()
            return {t.file.file_path: TableFile(t.file.file_path, t.file.record_count,
                                                t.file.file_size_in_bytes) for t in tasks}
        except Exception as e:
            raise wrap_error(f"reading the manifests of {self.name}", e) from e

    def unfit(self, f: NewFile) -> str | None:
        """Why ``f`` cannot be a data file of this table (``None``: it can): a column the
        table's schema does not have, or statistics the schema cannot map.
        """
        names = {field.name for field in self._table.metadata.schema().fields}
        extra = [n for n in f.footer.schema.to_arrow_schema().names if n not in names]
        if extra:
            return f"columns {extra} are not in the table's schema"
        try:
            self._data_file(f)
        except Exception as e:  # noqa: BLE001 - pyiceberg's statistics raise KeyError, ValueError...
            return f"its footer does not map to the table's schema: {type(e).__name__}: {e}"
        return None

    def _data_file(self, f: NewFile) -> DataFile:
        meta = self._table.metadata
        schema = meta.schema()
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=f.footer,
            stats_columns=compute_statistics_plan(schema, meta.properties),
            parquet_column_mapping=parquet_path_to_id_mapping(schema))
        return DataFile.from_args(
            content=DataFileContent.DATA, file_path=f.path, file_format=FileFormat.PARQUET,
            partition=Record(f.partition), file_size_in_bytes=f.size, sort_order_id=None,
            spec_id=meta.default_spec_id, equality_ids=None, key_metadata=None,
            **stats.to_serialized_dict())

    def commit(self, add: Sequence[NewFile] = (), remove: Sequence[str] = (),
               summary: Mapping[str, str] | None = None, *,
               replace: tuple[Sequence[NewFile], Sequence[str]] = ((), ())) -> int | None:
        """Snapshots, committed at once, planned on the state this object holds: an
        ``append`` of ``add``, a ``replace`` that lists ``replace[0]`` instead of the files
        at ``replace[1]`` (the same records: a compaction swap), a ``delete`` of the files at
        ``remove``. Streaming readers read appends and skip replaces (Spark's Iceberg
        source fails on an ``overwrite``). Returns the new current snapshot (``None``:
        nothing to commit).

        Raises:
            CommitConflict: the table changed since it was loaded (refresh and re-plan).
            CatalogError: the commit failed otherwise (its outcome is then unknown: re-plan
                from a refreshed state, which shows whether it landed).
        """
        swap_in, swap_out = replace
        if not add and not remove and not swap_in and not swap_out:
            return None
        self._retry_off()
        by_path = self._listed({*remove, *swap_out})
        props = dict(summary or {})
        try:
            with self._table.transaction() as tx:
                if add:
                    # Merged once 16 pile up (commit.manifest-merge.enabled).
                    with tx.update_snapshot(snapshot_properties=props).merge_append() as app:
                        for f in add:
                            app.append_data_file(self._data_file(f))
                if swap_in or swap_out:
                    self._swap(_ReplaceFiles(operation=Operation.OVERWRITE, transaction=tx,
                                             io=self._table.io, snapshot_properties=props),
                               [by_path[p] for p in swap_out], swap_in)
                if remove:
                    self._swap(_OverwriteFiles(operation=Operation.DELETE, transaction=tx,
                                               io=self._table.io, snapshot_properties=props),
                               [by_path[p] for p in remove], ())
        except ReplicatorError:
            raise
        except Exception as e:
            raise wrap_error(f"committing {len(add) + len(swap_in)} added and "
                        f"{len(remove) + len(swap_out)} removed files to {self.name}", e) from e
        return self.snapshot_id

    def _retry_off(self) -> None:
        """Switch pyiceberg's commit retry off in the metadata this commit is planned on.

        pyiceberg retries a refused commit by applying the same file changes on the newer
        snapshot (files listed twice), as often as the loaded metadata's
        ``commit.retry.num-retries`` says; another engine may have set it since this table
        was loaded or refreshed. Set it to 0 first (a metadata-only commit, which pyiceberg
        does not retry) and refuse the plan if that commit shows the table moved.

        Raises:
            CommitConflict: a snapshot was committed since this table was loaded.
        """
        have = self.properties.get(NO_RETRY)
        if have == TABLE_PROPERTIES[NO_RETRY]:
            return
        planned_on = self.snapshot_id
        log.warning("%s: %s was %r; set to %r again before committing (iceberg.py, table "
                    "properties)", self.name, NO_RETRY, have, TABLE_PROPERTIES[NO_RETRY])
        self.set_properties({NO_RETRY: TABLE_PROPERTIES[NO_RETRY]})
        if self.snapshot_id != planned_on:
            raise CommitConflict(f"{self.name}: snapshot {self.snapshot_id} was committed "
                                 f"since snapshot {planned_on}, which this plan is for")

    def _swap(self, producer: _OverwriteFiles, remove: Sequence[DataFile],
              add: Sequence[NewFile]) -> None:
        with producer as op:
            for df in remove:
                op.delete_data_file(df)
            for f in add:
                op.append_data_file(self._data_file(f))

    def _listed(self, paths: set[str]) -> dict[str, DataFile]:
        """The current snapshot's data files at ``paths``.

        Raises:
            CatalogError: one of ``paths`` is not listed.
        """
        if not paths:
            return {}
        by_path = {t.file.file_path: t.file
                   for t in self._table.scan(options=_EVERY_FILE).plan_files()
                   if t.file.file_path in paths}
        missing = paths - by_path.keys()
        if missing:
            raise CatalogError(f"{self.name}: cannot remove files it does not list: "
                               f"{sorted(missing)[:3]}")
        return by_path

    def ancestors(self, snapshot_id: int) -> list[int]:
        """The snapshots ``snapshot_id`` descends from (parent first), as the metadata keeps
        them: the lineage, not timestamps (clocks of writers differ).
        """
        meta = self._table.metadata
        out: list[int] = []
        snap = meta.snapshot_by_id(snapshot_id)
        while snap is not None and snap.parent_snapshot_id is not None:
            snap = meta.snapshot_by_id(snap.parent_snapshot_id)
            if snap is None or snap.snapshot_id in out:
                break
            out.append(snap.snapshot_id)
        return out

    def paths(self, snapshot_id: int) -> frozenset[str]:
        """The data file paths kept snapshot ``snapshot_id`` lists, from its manifests (read
        once per process: ``archive.iceberg_listing``).
        """
        try:
            return iceberg_listing.paths_of(self._table, snapshot_id)
        except Exception as e:
            raise wrap_error(f"reading the manifests of {self.name}", e) from e

    def held(self) -> set[str]:
        """The data file paths a kept snapshot lists and the current one does not."""
        current = self.snapshot_id
        if current is None:
            return set()
        try:
            return iceberg_listing.all_paths(
                self._table, [s.snapshot_id for s in self._table.metadata.snapshots]
            ) - iceberg_listing.paths_of(self._table, current)
        except Exception as e:
            raise wrap_error(f"reading the manifests of {self.name}", e) from e

    def _holding(self, wanted: set[str]) -> list[tuple[int, datetime, set[str]]]:
        """Every kept snapshot, newest first by commit time, with which of ``wanted`` it
        lists (only the manifests listing one are looked at).
        """
        snaps = self.by_time()
        try:
            found = iceberg_listing.listing_each(
                self._table, [s.snapshot_id for s in snaps], wanted)
        except Exception as e:
            raise wrap_error(f"reading the manifests of {self.name}", e) from e
        return [(s.snapshot_id, s.committed_at, f) for s, f in zip(snaps, found, strict=True)]

    def by_time(self) -> list[SnapshotInfo]:
        """Every snapshot the metadata keeps (the main lineage, snapshots a rollback left
        behind, branch and tag heads), newest first by commit time.
        """
        return sorted(self.snapshots(), key=lambda s: s.committed_at, reverse=True)

    def listing(self, paths: Iterable[str]) -> list[int]:
        """The kept snapshots (every one, not only the current lineage) that list one of
        ``paths``, newest first.
        """
        wanted = set(paths)
        if not wanted:
            return []
        return [sid for sid, _, found in self._holding(wanted) if found]

    def newest_listing(self, paths: Iterable[str]) -> int | None:
        """The newest kept snapshot that lists one of ``paths`` (the current snapshot
        first), or ``None``.
        """
        wanted = set(paths)
        current = self.snapshot_id
        if current is not None and wanted & self.paths(current):
            return current
        return next(iter(self.listing(wanted)), None)

    def removals(self, paths: Iterable[str]) -> dict[str, tuple[int, datetime | None]]:
        """For each of ``paths`` a kept snapshot lists (every one, not only the current
        lineage): the newest such snapshot, and when the file left the table (the commit
        time of the next newer kept snapshot, the one that took it out or a later one;
        ``None``: the current snapshot lists it, or no newer snapshot is kept). Paths no
        kept snapshot lists are left out.
        """
        wanted = set(paths)
        current = self.snapshot_id
        if current is None or not wanted:
            return {}
        out: dict[str, tuple[int, datetime | None]] = {}
        now = wanted & self.paths(current)
        out.update(dict.fromkeys(now, (current, None)))
        wanted -= now
        newer: datetime | None = None
        for sid, committed, found in self._holding(wanted) if wanted else ():
            for p in found & wanted:
                out[p] = (sid, None if sid == current else newer)
            wanted -= found
            if not wanted:
                break
            newer = committed
        return out

    def expire(self, ids: Sequence[int]) -> int:
        """Expire the snapshots ``ids`` (never the current one); a tag or a branch (other
        than ``main``) on one of them is removed first, with a WARNING: the files it lists
        are being deleted, so it could only fail its readers. Their count.
        """
        current = self.snapshot_id
        ids = [i for i in dict.fromkeys(ids) if i != current]
        if not ids:
            return 0
        refs = {name: ref for name, ref in self._table.metadata.refs.items()
                if ref.snapshot_id in ids and name != "main"}
        try:
            if refs:
                manage = self._table.manage_snapshots()
                for name, ref in refs.items():
                    log.warning("%s: %s %s points at snapshot %d, which lists segments being "
                                "deleted: removed (a table's history is bounded by "
                                "compaction and catalog.snapshot_retention)", self.name,
                                ref.snapshot_ref_type.value, name, ref.snapshot_id)
                    manage = manage.remove_tag(name)   # removes a branch alike
                manage.commit()
            self._table.maintenance.expire_snapshots().by_ids(ids).commit()
        except Exception as e:
            raise wrap_error(f"expiring {len(ids)} snapshots of {self.name}", e) from e
        return len(ids)

    def foreign_snapshots(self) -> list[SnapshotInfo]:
        """The snapshots of the current lineage newer than the newest one the replicator
        committed (its summaries carry ``replicator.reason``), newest first; then those
        another engine committed to a branch other than ``main`` (a write-audit-publish
        branch): each branch's snapshots back to one of ``main``'s lineage or the
        replicator's. A branch's head keeps listing what compaction deletes from ``main``.
        """
        current = self.snapshot_id
        if current is None:
            return []
        by_id = {s.snapshot_id: s for s in self.snapshots()}
        main = [current, *self.ancestors(current)]
        out = []
        for sid in main:
            snap = by_id.get(sid)
            if snap is None or "replicator.reason" in snap.summary:
                break
            out.append(snap)
        seen = set(main)
        for name, ref in self._table.metadata.refs.items():
            if name == "main" or ref.snapshot_ref_type != SnapshotRefType.BRANCH:
                continue
            for sid in (ref.snapshot_id, *self.ancestors(ref.snapshot_id)):
                snap = by_id.get(sid)
                if sid in seen or snap is None or "replicator.reason" in snap.summary:
                    break
                seen.add(sid)
                out.append(snap)
        return out

    def snapshots(self) -> list[SnapshotInfo]:
        """Every snapshot the metadata keeps, oldest first."""
        current = self.snapshot_id
        out = []
        for s in self._table.metadata.snapshots:
            summary = s.summary.additional_properties if s.summary is not None else {}
            op = s.summary.operation.value if s.summary is not None else ""
            out.append(SnapshotInfo(
                s.snapshot_id, s.parent_snapshot_id,
                datetime.fromtimestamp(s.timestamp_ms / 1000, UTC), op, dict(summary),
                s.snapshot_id == current))
        return out

    def reader(self, bounds: Sequence[Bound] = (),
               snapshot_id: int | None = None) -> pa.RecordBatchReader:
        """The records of the files ``bounds`` do not prune (rows filtered by them too), at
        ``snapshot_id`` or the current snapshot, streamed.
        """
        try:
            scan = self._table.scan(row_filter=bounds_filter(bounds), snapshot_id=snapshot_id)
            return scan.to_arrow_batch_reader()
        except Exception as e:
            raise wrap_error(f"scanning {self.name}", e) from e

    def planned_files(self, bounds: Sequence[Bound] = (),
                      snapshot_id: int | None = None) -> list[str]:
        """The paths a scan with ``bounds`` reads (after pruning)."""
        try:
            scan = self._table.scan(row_filter=bounds_filter(bounds), snapshot_id=snapshot_id)
            return sorted(t.file.file_path for t in scan.plan_files())
        except Exception as e:
            raise wrap_error(f"planning a scan of {self.name}", e) from e

    # --- files of the table's own (trimmed copies, archive/trims.py) ---------------------

    def put_file(self, path: str, source: BinaryIO) -> None:
        """Write ``source`` (read to its end) at ``path`` through the table's FileIO (the
        warehouse's credentials and endpoint).
        """
        try:
            with self._table.io.new_output(path).create(overwrite=True) as out:
                while chunk := source.read(8 * 1024**2):
                    out.write(chunk)
        except Exception as e:
            raise wrap_error(f"writing {path}", e) from e

    def read_file(self, path: str) -> bytes:
        """The bytes of the file at ``path`` through the table's FileIO (a trimmed copy).

        Raises:
            CatalogError: it could not be read (``FileNotFoundError`` as its cause: absent).
        """
        try:
            with self._table.io.new_input(path).open() as f:
                return f.read()
        except Exception as e:
            raise wrap_error(f"reading {path}", e) from e

    def list_files(self, under: str) -> dict[str, datetime]:
        """The files below ``under`` (a folder of the table's location), with their last
        modification times; ``{}`` when it does not exist.
        """
        try:
            io = self._table.io
            if not isinstance(io, PyArrowFileIO):
                raise CatalogError(f"{self.name}: its FileIO ({type(io).__name__}) cannot "
                                   "list files")
            scheme, netloc, path = PyArrowFileIO.parse_location(under)
            fs = io.fs_by_scheme(scheme, netloc)
            infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
            return {f"{scheme}://{i.path}": (i.mtime or datetime.fromtimestamp(0, UTC))
                    .astimezone(UTC) for i in infos if i.type == FileType.File}
        except CatalogError:
            raise
        except Exception as e:
            raise wrap_error(f"listing {under}", e) from e

    def delete_file(self, path: str) -> None:
        """Delete the file at ``path`` (absent: nothing to do)."""
        try:
            self._table.io.delete(path)
        except FileNotFoundError:
            pass
        except Exception as e:
            raise wrap_error(f"deleting {path}", e) from e


_EVERY_FILE = {"include_empty_files": "true"}
"""Scan options that list files without records too (pyiceberg plans none by default): a
trimmed copy of positions without records is a file of the table like any other."""


class _ReplaceFiles(_OverwriteFiles):
    """A snapshot of operation ``replace``: files swapped for files holding the same
    records (pyiceberg writes ``overwrite`` only; the summary totals are computed alike).
    """

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        summary = super()._summary(snapshot_properties)
        return Summary(operation=Operation.REPLACE, **summary.additional_properties)


@dataclass(frozen=True)
class Bound:
    """``column op value``: a comparison of an int column (or ``timestamp``, in
    microseconds since the epoch) with a constant.
    """

    column: str
    op: str
    value: int


_OPS: dict[str, type[EqualTo | LessThan | LessThanOrEqual | GreaterThan
                     | GreaterThanOrEqual]] = {
    "=": EqualTo, "<": LessThan, "<=": LessThanOrEqual, ">": GreaterThan,
    ">=": GreaterThanOrEqual}


def bounds_filter(bounds: Sequence[Bound]) -> BooleanExpression:
    """The conjunction of ``bounds`` as a pyiceberg row filter."""
    expr: BooleanExpression = AlwaysTrue()
    for b in bounds:
        term: BooleanExpression = _OPS[b.op](term=b.column, value=b.value)
        expr = term if isinstance(expr, AlwaysTrue) else And(expr, term)
    return expr


