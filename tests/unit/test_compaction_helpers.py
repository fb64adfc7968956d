"""Shared helpers of the compaction tests (no tests here): settings, segment I/O."""

from __future__ import annotations

from typing import Any

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, batch_to_records, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, open_segment, publish_segment
from replicator.core.keys import SegmentKey
from replicator.core.settings import Settings, load_settings
from replicator.core.storage import ObjectStore


def compaction_settings(*, region: str = "r1", bucket: str = "b", prefix: str = "data",
                        topics: dict[str, Any] | None = None, s3: dict[str, Any] | None = None,
                        **compaction: Any) -> Settings:
    topic_cfg = {"min_segment_age": "1h", "min_segment_count": 2, "min_segment_size": 1,
                 "max_segment_count": 100, "max_segment_size": "1GiB", "batch_size": 7}
    data: dict[str, Any] = {
        "region": region,
        "s3": {"bucket": bucket, "prefix": prefix, **(s3 or {})},
        "kafka": {"brokers": "127.0.0.1:1"},
        "metrics": {"port": 0},
        "compaction": {"spark_master": "inline", "parallelism": 2,
                       "topics": topics if topics is not None else {"t": topic_cfg},
                       # The in-memory store reports no replication status: without a
                       # grace, no input would ever be deleted.
                       "replication_grace": "0s",
                       **compaction},
    }
    return load_settings(data=data, environ={})


def make_records(start: int, end: int, step: int = 1) -> list[Record]:
    """Records at offsets ``start, start+step, ... <= end`` plus ``end`` itself."""
    offsets = list(range(start, end + 1, step))
    if offsets[-1] != end:
        offsets.append(end)
    out = []
    for o in offsets:
        key = None if o % 5 == 0 else f"k{o % 3}".encode()
        value = None if o % 7 == 0 else (b"" if o % 11 == 0 else f"value-{o}".encode() * 3)
        headers = (("h", f"{o}".encode()), ("n", None)) if o % 2 else ()
        out.append(Record(o, 1_700_000_000_000 + o, key, value, headers))
    return out


def write_segment(store: ObjectStore, key: SegmentKey, records: list[Record],
                  fmt_name: str = "parquet") -> None:
    """Write and publish a segment the way egress does."""
    fmt = get_format(fmt_name)
    up = SegmentUpload(store, fmt, "temp", WriterOptions(row_group_size=64 * 1024))
    up.write_batch(records_to_batch(records))
    temp = up.finish(SegmentMetadata.for_key(key, len(records)))
    publish_segment(store, temp.key, key)


def read_segment(store: ObjectStore, key: SegmentKey, fmt_name: str = "parquet") -> list[Record]:
    with open_segment(store, key) as reader:
        return [r for b in reader.iter_batches(1000) for r in batch_to_records(b)]
