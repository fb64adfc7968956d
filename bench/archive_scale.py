"""The archive tables at scale: many topics, each table holding weeks of 30 s commits.

    .venv/bin/python bench/archive_tables.py --scale [--topics 200] [--history 2000]
        [--big-history 40320] [--rounds 4] [--big-steps 120] [--workers 8] [--json out.json]

Simulated, not waited for: running two weeks of 30 s commits (40,320 per table) for 200
topics would take two weeks, so each table's history is synthesized in a few commits of
many data files at once (``--history`` files per table; ``--big-history`` for one table at
the full two weeks), each file a segment of 1 GiB/day / 2,880 commits = 364 KiB registered
from a real Parquet footer. Then real steps run: every round, every topic gets one new real
segment and ``ArchiveCommitter.sync_all`` (the pool of ``catalog.sync_workers``) brings all
tables up to date, as ``replicator archive follow`` does every interval.

The bucket is in memory with S3's request latency added (``--list-ms`` per 1,000 keys
listed, ``--get-ms`` per GET, ``--put-ms`` per PUT; threads overlap it as with S3); the
catalog is SQLite and the table metadata on local disk (no latency added: each step reads
a metadata.json and writes a manifest, a manifest list and a metadata.json, about 4 more
requests on S3).

Figures: the committer's step time per table (p50/p99) with all topics busy and for the
full-size table alone; freshness p99, a segment landed → in its table: a segment lands at a
uniformly random time of a cycle (``max(interval, round)``) and is in its table when its
table's step of the next round ends; metadata bytes the full-size table refers to as a
percentage of its data; the metadata files one ``archive sql`` query of one table opens
with every other topic in the bucket.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from lib import percentile

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.archive.committer import ArchiveCommitter, SyncResult
from replicator.archive.iceberg import NewFile
from replicator.core.keys import SegmentKey
from replicator.core.settings import Settings, load_settings
from replicator.core.storage import MemoryObjectStore, ObjectInfo

SEGMENT_BYTES = 2**30 // 2880
"""One 30 s commit's segment at 1 GiB/day/topic."""


class LatentStore(MemoryObjectStore):
    """An in-memory bucket with S3's request latency (slept, so threads overlap it)."""

    def __init__(self, bucket: str, list_s: float, get_s: float, put_s: float) -> None:
        super().__init__(bucket)
        self.list_s, self.get_s, self.put_s = list_s, get_s, put_s
        self.requests = 0

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        self.requests += 1
        time.sleep(self.put_s)
        return super().put(key, data, **kw)

    def get(self, key: str) -> bytes:
        self.requests += 1
        time.sleep(self.get_s)
        return super().get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.requests += 1
        time.sleep(self.get_s)
        return super().get_range(key, start, length)

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        for i, info in enumerate(super().list(prefix, start_after=start_after)):
            if i % 1000 == 0:
                self.requests += 1
                time.sleep(self.list_s)
            yield info


class TimedCommitter(ArchiveCommitter):
    """Records when each table's step ended and how long it took."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.timings: dict[str, tuple[float, float]] = {}
        self._tlock = threading.Lock()

    def sync(self, region: str, topic: str, **kw: Any) -> SyncResult:
        t0 = time.monotonic()
        try:
            return super().sync(region, topic, **kw)
        finally:
            t1 = time.monotonic()
            with self._tlock:
                self.timings[topic] = (t1 - t0, t1)


def settings_for(tmp: Path, workers: int) -> Settings:
    return load_settings(data={
        "region": "r1",
        "s3": {"bucket": "bench", "region": "us-east-1"},
        "kafka": {"brokers": "127.0.0.1:1"},
        "metrics": {"port": 0},
        "catalog": {"enabled": True, "namespace": "bench", "table_name": "{topic}",
                    "sync_workers": workers, "warehouse": f"file://{tmp}/warehouse",
                    "properties": {"uri": f"sqlite:///{tmp}/catalog.db"}},
    }, environ={})


def segment(store: MemoryObjectStore, key: SegmentKey, records: int) -> None:
    """A real Parquet segment published as egress does."""
    up = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    base = 1_700_000_000_000
    up.write_batch(records_to_batch([Record(o, base + o, b"k", b"v" * 100)
                                     for o in range(key.start, key.start + records)]))
    temp = up.finish(SegmentMetadata.for_key(key, records))
    publish_segment(store, temp.key, key)


def synthesize(committer: ArchiveCommitter, store: MemoryObjectStore, topic: str, files: int,
               commits: int, footer: pq.FileMetaData) -> int:
    """``files`` segments of ``topic`` registered in ``commits`` commits (the table's
    history), their objects placed in the bucket (empty: only new segments' footers are
    read). The next free offset.
    """
    table = committer.table("r1", topic)
    assert table is not None
    per = max(1, files // commits)
    start = 0
    for c in range(commits):
        batch = []
        for _ in range(per if c < commits - 1 else files - per * (commits - 1)):
            key = SegmentKey("data", "r1", topic, 0, 0, start, start + 99)
            MemoryObjectStore.put(store, key.to_key(), b"")
            batch.append(NewFile(committer.url(key), SEGMENT_BYTES, 0, footer))
            start += 100
        table.commit(batch, summary={"replicator.reason": "sync"})
    return start


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rng = random.Random(7)
    store = LatentStore("bench", args.list_ms / 1000, args.get_ms / 1000,
                        args.put_ms / 1000)
    settings = settings_for(tmp, args.workers)
    committer = TimedCommitter(settings, store)
    probe = SegmentKey("data", "r1", "_probe", 0, 0, 0, 99)
    segment(store, probe, 100)
    footer = pq.ParquetFile(pa.BufferReader(store.get(probe.to_key()))).metadata
    store.delete(probe.to_key())
    topics = [f"t{i:03d}" for i in range(args.topics)]
    big = "big"
    t0 = time.monotonic()
    nxt = {t: synthesize(committer, store, t, args.history, args.history_commits, footer)
           for t in topics}
    nxt[big] = synthesize(committer, store, big, args.big_history, args.big_history_commits,
                          footer)
    synth_s = time.monotonic() - t0

    # All topics busy: one new segment each per round, one sync_all per round.
    committer.settings = settings.model_copy(update={"catalog": settings.catalog.model_copy(
        update={"topics": topics})})
    committer.cfg = committer.settings.catalog
    steps: list[float] = []
    fresh: list[float] = []
    rounds: list[float] = []
    for _ in range(args.rounds):
        for t in topics:
            segment(store, SegmentKey("data", "r1", t, 0, 0, nxt[t], nxt[t] + 99), 100)
            nxt[t] += 100
        committer.timings.clear()
        start = time.monotonic()
        results = committer.sync_all()
        took = time.monotonic() - start
        assert len(results) == len(topics) and all(r.added == 1 for r in results)
        rounds.append(took)
        cycle = max(args.interval, took)
        for step_s, end in committer.timings.values():
            steps.append(step_s)
            fresh.append(rng.uniform(0, cycle) + (end - start))

    # The full-size table alone.
    big_steps: list[float] = []
    for _ in range(args.big_steps):
        segment(store, SegmentKey("data", "r1", big, 0, 0, nxt[big], nxt[big] + 99), 100)
        nxt[big] += 100
        s0 = time.monotonic()
        r = committer.sync("r1", big)
        big_steps.append(time.monotonic() - s0)
        assert r.added == 1
    table = committer.table("r1", big, create=False)
    assert table is not None
    files = table.files()
    data_bytes = sum(f.size for f in files.values())
    used = table.metadata_in_use()
    meta_bytes = sum(Path(p.removeprefix("file://")).stat().st_size for p in used)
    committer.cfg = committer.cfg.model_copy(update={"topics": [*topics, big]})
    opened = query_metadata_reads(committer, big, nxt[big] - 100)
    first_big = big_steps[0] if big_steps else float("nan")   # every manifest read
    steps.sort()
    fresh.sort()
    big_steps.sort()
    return {
        "topics": args.topics, "history_files_per_table": args.history,
        "big_table_files": len(files), "workers": args.workers,
        "interval_seconds": args.interval, "synthesis_seconds": round(synth_s, 1),
        "rounds": args.rounds, "round_seconds": [round(x, 2) for x in rounds],
        "step_seconds_p50": round(percentile(steps, 50), 3),
        "step_seconds_p99": round(percentile(steps, 99), 3),
        "freshness_seconds_p50": round(percentile(fresh, 50), 1),
        "freshness_seconds_p99": round(percentile(fresh, 99), 1),
        "big_table_step_seconds_p50": round(percentile(big_steps, 50), 3),
        "big_table_step_seconds_p99": round(percentile(big_steps, 99), 3),
        "big_table_first_step_seconds": round(first_big, 3),
        "big_table_slowest_steps_seconds": [round(x, 2) for x in big_steps[-5:]],
        "big_table_snapshots_kept": len(table.snapshots()),
        "big_table_data_bytes": data_bytes,
        "big_table_metadata_files_in_use": len(used),
        "big_table_metadata_bytes_in_use": meta_bytes,
        "metadata_percent_of_data": round(100 * meta_bytes / max(1, data_bytes), 3),
        "query_metadata_files_opened": opened,
    }


def query_metadata_reads(committer: ArchiveCommitter, name: str, first: int) -> dict[str, int]:
    """Files one ``archive sql`` query of table ``name`` opens to plan its scan (what
    ``run_query`` does before DuckDB reads the planned data files), with every other topic
    in the bucket; the query names the newest segment's offsets only.
    """
    from pyiceberg.io import pyarrow as pio

    from replicator.archive.duckdb_sql import parse_sql
    from replicator.archive.query import pruning_bounds, query_tables, table_refs

    seen = {"metadata": 0, "other": 0, "data_files_planned": 0}
    real = pio.PyArrowFileIO.new_input

    def counting(self: Any, location: str) -> Any:
        seen["metadata" if "/metadata/" in location else "other"] += 1
        return real(self, location)

    tree = parse_sql(f'SELECT count(*) FROM {name} WHERE "offset" >= {first}')
    pio.PyArrowFileIO.new_input = counting  # type: ignore[method-assign]
    try:
        tables = query_tables(committer, set(table_refs(tree)))
        planned = tables[name].planned_files(pruning_bounds(tree, name))
    finally:
        pio.PyArrowFileIO.new_input = real  # type: ignore[method-assign]
    seen["data_files_planned"] = len(planned)
    return seen


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--topics", type=int, default=200)
    ap.add_argument("--history", type=int, default=2000,
                    help="segments per table before the measured rounds")
    ap.add_argument("--history-commits", type=int, default=10)
    ap.add_argument("--big-history", type=int, default=40320,
                    help="segments of the full-size table: two weeks of 30 s commits")
    ap.add_argument("--big-history-commits", type=int, default=110)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--big-steps", type=int, default=120)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--list-ms", type=float, default=30.0)
    ap.add_argument("--get-ms", type=float, default=15.0)
    ap.add_argument("--put-ms", type=float, default=30.0)
