"""Trimmed copies: the rows of a segment that other segments do not hold, as a data file of
its table.

Egress may publish a range twice (a rebalance or a failed offset commit after a copy): the
bucket then holds segments that partly overlap, and listing both would list the shared
records twice. ``archive.plan.claims`` gives each position to one segment; a segment left
with part of its range is listed as a **trimmed copy**: a Parquet file, written by the
committer under the table's own location (``{location}/data/trimmed/{segment key}/``),
holding the segment's rows of the positions it keeps. The copy is a file of the table
only: it never enters the bucket's key space (ingress, compaction and restore read
segments), and it is deleted once no snapshot the table keeps lists it
(``ArchiveCommitter.clean_trims``).
"""

from __future__ import annotations

import logging
import re
import tempfile
import uuid
from datetime import datetime
from typing import BinaryIO, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replicator.archive.iceberg import IcebergTable, NewFile
from replicator.archive.plan import Piece
from replicator.archive.segment_fit import misfit
from replicator.core.errors import SegmentCorrupt
from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectStore

TRIM_DIR = "data/trimmed"
"""Where a table's trimmed copies are, below its location."""

SPOOL_BYTES = 64 * 1024**2
"""A copy is written to memory up to this size, then to a temporary file, before upload."""

log = logging.getLogger(__name__)

_NAME = re.compile(r"(\d{20})-(\d{20})-([0-9a-f]{32})\.parquet")

# As formats/parquet.py: statistics for what prunes (offsets, times), checksums per page.
_STATISTICS_COLUMNS = ["offset", "timestamp", "timestamp_type"]


def trim_root(location: str) -> str:
    """The folder of a table's trimmed copies (``location``: the table's)."""
    return f"{location.rstrip('/')}/{TRIM_DIR}/"


def trim_path(location: str, piece: Piece) -> str:
    """A new path for a trimmed copy of ``piece`` (unique: a copy written by a commit that
    failed is never overwritten by a later one that a reader may already see).
    """
    return (f"{trim_root(location)}{piece.key.to_key()}/"
            f"{piece.lo:020d}-{piece.hi:020d}-{uuid.uuid4().hex}.parquet")


def parse_trim_path(location: str, path: str) -> Piece | None:
    """The piece a trimmed copy at ``path`` holds (``None``: not a trimmed copy of the
    table at ``location``).
    """
    root = trim_root(location)
    if not path.startswith(root):
        return None
    key_part, _, name = path[len(root):].rpartition("/")
    m = _NAME.fullmatch(name)
    key = SegmentKey.try_parse(key_part)
    if m is None or key is None:
        return None
    lo, hi = int(m.group(1)), int(m.group(2))
    if not key.start <= lo <= hi <= key.end:
        return None
    return Piece(key, lo, hi)


def write_trim(store: ObjectStore, piece: Piece) -> tuple[BinaryIO, pq.FileMetaData]:
    """The Parquet file of the rows of ``piece.key`` whose offset is in ``piece.lo``..
    ``piece.hi`` (the segment's columns, field ids and types; row groups the offset
    statistics rule out are not read), rewound, and its footer. Memory: one row group.

    Raises:
        ObjectNotFound: the segment is gone.
        SegmentCorrupt: the segment is not readable Parquet with an ``offset`` column.
        CopyUnfit: the segment's rows are not its key's range (nothing is written).
    """
    spool = cast(BinaryIO, tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))  # noqa: SIM115
    try:
        with store.open_read(piece.key.to_key()) as src:
            try:
                footer = _copy_rows(pq.ParquetFile(pa.PythonFile(src, mode="r")), piece,
                                    spool)
            except (pa.ArrowException, OSError, KeyError, ValueError) as e:
                raise SegmentCorrupt(f"{piece.key}: cannot copy offsets {piece.lo}-"
                                     f"{piece.hi} out of it: {e}") from e
        spool.seek(0)
        return spool, footer
    except BaseException:
        spool.close()
        raise


def _copy_rows(src: pq.ParquetFile, piece: Piece, out: BinaryIO) -> pq.FileMetaData:
    # The claims that made this piece trust the key's range: a segment whose rows are
    # not that range is quarantined, as a whole segment would be (committer._new_files).
    problem = misfit(src.metadata, piece.key)
    if problem is not None:
        raise CopyUnfit(problem, "range")
    schema = src.schema_arrow.remove_metadata()   # the segment's footer pairs stay behind
    leaf = next((i for i in range(src.metadata.num_columns)
                 if src.metadata.schema.column(i).path == "offset"), None)
    if leaf is None or "offset" not in schema.names:
        raise KeyError("no offset column")
    writer = pq.ParquetWriter(pa.PythonFile(out, mode="w"), schema, compression="zstd",
                              write_statistics=_STATISTICS_COLUMNS,
                              write_page_checksum=True)
    try:
        for group in range(src.metadata.num_row_groups):
            stats = src.metadata.row_group(group).column(leaf).statistics
            if stats is not None and stats.has_min_max and (
                    stats.max < piece.lo or stats.min > piece.hi):
                continue
            rows = src.read_row_group(group)
            offsets = rows.column("offset")
            rows = rows.filter(pc.and_(pc.greater_equal(offsets, piece.lo),
                                       pc.less_equal(offsets, piece.hi)))
            if rows.num_rows:
                writer.write_table(rows, row_group_size=rows.num_rows)
        writer.add_key_value_metadata({"replicator.trimmed_from": piece.key.to_key(),
                                       "replicator.offsets": f"{piece.lo}-{piece.hi}"})
    finally:
        writer.close()
    out.seek(0)
    return pq.read_metadata(pa.PythonFile(out, mode="r"))


class CopyUnfit(Exception):
    """A segment no copy of which the table can list: its columns are not the table's
    (``reason`` "schema"), or its rows are not its key's range (``reason`` "range",
    ``archive.segment_fit``).
    """

    def __init__(self, problem: str, reason: str = "schema") -> None:
        super().__init__(problem)
        self.reason = reason


def copy_piece(store: ObjectStore, table: IcebergTable, piece: Piece) -> NewFile:
    """Write the trimmed copy of ``piece`` under the table's location; the file to add.

    Raises:
        ObjectNotFound / SegmentCorrupt: as ``write_trim``.
        CopyUnfit: the table cannot list it, or the segment's rows are not its key's range
            (nothing is written).
        CatalogError: the copy could not be written.
    """
    data, footer = write_trim(store, piece)
    with data:
        path = trim_path(table.location, piece)
        data.seek(0, 2)
        size = data.tell()
        data.seek(0)
        f = NewFile(path, size, piece.key.partition, footer)
        problem = table.unfit(f)
        if problem is not None:
            raise CopyUnfit(problem)
        table.put_file(path, data)
    log.info("%s: listed as a trimmed copy of offsets %d-%d (other segments hold the rest "
             "of its range): %s", piece.key, piece.lo, piece.hi, path)
    return f


def collect_trims(table: IcebergTable, cutoff: datetime) -> int:
    """Delete the trimmed copies of ``table`` that no snapshot it keeps lists (lineage or
    not) and that were written before ``cutoff`` (younger ones may belong to a commit in
    flight); their count.
    """
    table.refresh()
    stored = table.list_files(trim_root(table.location))
    candidates = {p for p, modified in stored.items() if modified < cutoff}
    if candidates:
        candidates -= table.files().keys()
    for snap in reversed(table.snapshots()):
        if not candidates:
            break
        candidates -= table.files(snap.snapshot_id).keys()
    for path in sorted(candidates):
        table.delete_file(path)
    if candidates:
        log.info("%s: deleted %d trimmed copies no snapshot lists", table.name,
                 len(candidates))
    return len(candidates)
