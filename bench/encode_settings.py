"""Parquet encode settings of a segment: CPU-seconds and bytes stored per GB of records.

Writes the same records (10 000-record segments, 12 B keys of 5 000 devices, values of
``peer_lib.DistinctText`` or random, 100 B and 1 KiB) with the segment writer's settings
(``formats/parquet.py``: zstd, dictionary on key only, page checksums) and variants of
one setting each, into memory. CPU is this process's CPU time (``time.process_time``)
around the writes only, the best of ``--repeat`` passes; bytes stored are deterministic.
Ratios are against the segment writer's settings in the same run.

    .venv/bin/python bench/encode_settings.py [--records 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from peer_lib import DistinctText

from formats.base import SEGMENT_SCHEMA

SEGMENT_ROWS = 10_000
BASE: dict[str, Any] = {"compression": "zstd", "compression_level": 1,
                        "use_dictionary": ["timestamp_type", "key",
                                           "headers.list.element.key"],
                        "write_statistics": ["offset", "timestamp", "timestamp_type"],
                        "write_page_checksum": True}
VARIANTS: dict[str, dict[str, Any]] = {
    "segment writer (zstd 1)": {},
    "zstd 3": {"compression_level": 3},
    "zstd -1": {"compression_level": -1},
    "lz4": {"compression": "lz4", "compression_level": None},
    "no compression": {"compression": "none", "compression_level": None},
    "dictionary on value too": {"use_dictionary": True},
    "no dictionary at all": {"use_dictionary": False},
    "page 64 KiB": {"data_page_size": 64 * 1024},
    "page 4 MiB": {"data_page_size": 4 * 1024**2},
    "no page checksum": {"write_page_checksum": False},
    "value encoding PLAIN (explicit)": {"column_encoding": {"value": "PLAIN"},
                                            "use_dictionary": ["timestamp_type", "key",
                                                               "headers.list.element.key"]},
}


def segments(kind: str, size: int, records: int) -> tuple[list[pa.Table], int]:
    import random

    text, rng = DistinctText(), random.Random(5)
    tables, raw = [], 0
    for start in range(0, records, SEGMENT_ROWS):
        n = min(SEGMENT_ROWS, records - start)
        keys = [b"device-%05d" % (i % 5000) for i in range(start, start + n)]
        if kind == "text":
            values = [text.value(i, size) for i in range(start, start + n)]
        else:
            values = [b"%012d " % i + rng.randbytes(size - 13) for i in range(start, start + n)]
        raw += sum(map(len, keys)) + sum(map(len, values))
        tables.append(pa.table({
            "offset": pa.array(range(start, start + n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000 + i for i in range(start, start + n)],
                                  pa.timestamp("ms", tz="UTC")),
            "timestamp_type": pa.array([1] * n, pa.int8()),
            "key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
            "headers": pa.array([[]] * n, SEGMENT_SCHEMA.field("headers").type)},
            schema=SEGMENT_SCHEMA))
    return tables, raw


def encode(tables: list[pa.Table], opts: dict[str, Any]) -> tuple[float, int]:
    cpu0, stored = time.process_time(), 0
    for t in tables:
        buf = io.BytesIO()
        with pq.ParquetWriter(buf, SEGMENT_SCHEMA, **opts) as w:
            w.write_table(t, row_group_size=t.num_rows)
        stored += buf.tell()
    return time.process_time() - cpu0, stored


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for kind in ("text", "random"):
        for size in (100, 1024):
            tables, raw = segments(kind, size, args.records)
            gb = raw / 1e9
            rows = []
            for name, change in VARIANTS.items():
                opts = {**BASE, **change}
                runs = [encode(tables, opts) for _ in range(args.repeat)]
                cpu, stored = min(r[0] for r in runs), runs[0][1]
                rows.append((name, cpu / gb, stored / raw))
            base_cpu = rows[0][1]
            print(f"\n{kind} values, {size} B, {args.records:,} records in "
                  f"{SEGMENT_ROWS:,}-record segments ({raw / 1e6:.0f} MB raw)")
            print(f"  {'variant':38s} {'CPU s/GB':>9s} {'x base':>7s} {'stored/raw':>10s}")
            for name, cpu, ratio in rows:
                print(f"  {name:38s} {cpu:9.2f} {cpu / base_cpu:7.2f} {ratio:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
