"""Whether a Parquet object at a segment key holds what its key says (a pure check of the
footer a step has already read: no extra request).

A table lists a segment as the positions its key names (``archive.plan``: claims, covers,
trimmed copies). An object at a segment key whose rows are not that range (an operator's
copy of another segment, a restore tool writing a whole partition under one key, a bug)
would be listed as the key says: its records twice in ``count(*)``, or positions hidden
that it does not hold. Ingress and restore refuse such an object when they open it (its
footer pairs must name the key, ``SegmentMetadata.check_key``, and match its row count),
and compaction also checks its rows' offsets while merging; the committer refuses the same
objects from the footer's pairs, row count and ``offset`` column statistics, so the three
agree on what is a segment.
"""

from __future__ import annotations

import pyarrow.parquet as pq

from formats.base import SegmentMetadata
from replicator.core.errors import SegmentCorrupt
from replicator.core.keys import SegmentKey

OFFSET = "offset"


def misfit(footer: pq.FileMetaData, key: SegmentKey) -> str | None:
    """Why the Parquet object with ``footer`` at ``key`` does not hold the key's range
    (``None``: it does): footer pairs that are missing or name another segment (or more
    records than the key's positions), a row count not the footer's, an ``offset`` column that
    is missing or lacks statistics, offsets outside ``key.start``..``key.end``.
    """
    pairs = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
             for k, v in (footer.metadata or {}).items() if k != b"ARROW:schema"}
    try:
        meta = SegmentMetadata.from_footer(pairs, where=key.to_key())
        meta.check_key(key)
    except SegmentCorrupt as e:
        return str(e)
    rows = footer.num_rows
    if rows != meta.message_count:
        return (f"its footer says {meta.message_count} records, the file holds {rows} rows")
    leaf = next((i for i in range(footer.num_columns)
                 if footer.schema.column(i).path == OFFSET), None)
    if leaf is None:
        return "it has no offset column"
    lo: int | None = None
    hi: int | None = None
    for group in range(footer.num_row_groups):
        rg = footer.row_group(group)
        if rg.num_rows == 0:
            continue
        stats = rg.column(leaf).statistics
        if stats is None or not stats.has_min_max:
            return (f"row group {group} has no offset statistics: its offsets cannot be "
                    "checked against the key")
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    if lo is not None and hi is not None and (lo < key.start or hi > key.end):
        return (f"it holds offsets {lo}-{hi}, outside the key's range "
                f"{key.start}-{key.end}")
    return None
