"""The archive tables under a stream of segments: step time (freshness), commits, and the
table's metadata bytes against its data bytes.

    .venv/bin/python bench/archive_tables.py [--partitions 4] [--steps 30] [--records 2000]
                                             [--value-size 200] [--compact-every 10]
                                             [--json out.json]
    .venv/bin/python bench/archive_tables.py --scale ...   (bench/archive_scale.py)

On the embedded moto S3 server and pyiceberg's SQL catalog (SQLite): every step, each
partition publishes one segment (as egress does), then one committer step runs
(``ArchiveCommitter.sync``: what ``replicator archive follow`` does every
``catalog.commit_interval``). Every ``--compact-every`` steps an inline compaction run merges
the level-0 segments through the archive hook (one swap snapshot per topic, then deletes).
A segment is in its table within one interval plus one step, so the step's wall time is
what freshness adds to the interval. Metadata bytes: every object under the table's
``metadata/`` at the end (after expiry and the deletion of expired snapshots' files, with
the grace skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import archive_scale
from lib import percentile, text_value

from compaction.controller import Compaction
from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.archive.committer import ORPHAN_GRACE, ArchiveCommitter
from replicator.core.keys import SegmentKey
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import Settings, load_settings
from replicator.devstack.aws import create_bucket
from replicator.devstack.processes import start_moto

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def settings_for(endpoint: str, tmp: Path) -> Settings:
    return load_settings(data={
        "region": "r1",
        "s3": {"bucket": "bench", "endpoint_url": endpoint, "region": "us-east-1",
               "access_key_id": "test", "secret_access_key": "test"},
        "kafka": {"brokers": "127.0.0.1:1"},
        "metrics": {"port": 0},
        "compaction": {"spark_master": "inline", "replication_grace": "0s", "topics": {
            "t": {"min_segment_age": "0s", "min_segment_count": 2, "min_segment_size": 1,
                  "max_level": 0}}},
        "catalog": {"enabled": True, "namespace": "bench", "table_name": "{topic}",
                    "properties": {"uri": f"sqlite:///{tmp}/catalog.db"}},
    }, environ={})


def publish(store: S3ObjectStore, key: SegmentKey, records: list[Record]) -> None:
    up = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    up.write_batch(records_to_batch(records))
    temp = up.finish(SegmentMetadata.for_key(key, len(records)))
    publish_segment(store, temp.key, key)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--value-size", type=int, default=200)
    ap.add_argument("--compact-every", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--scale", action="store_true",
                    help="many topics with weeks of history instead (bench/archive_scale.py)")
    archive_scale.add_arguments(ap)
    args = ap.parse_args()
    if args.scale:
        scaled = archive_scale.run(args, Path(tempfile.mkdtemp(prefix="archive-scale-")))
        print(json.dumps(scaled, indent=2))
        if args.json:
            args.json.write_text(json.dumps(scaled, indent=2))
        return
    rng = random.Random(7)
    tmp = Path(tempfile.mkdtemp(prefix="archive-bench-"))
    moto = start_moto(tmp)
    try:
        endpoint = f"http://{moto.address}"
        client = make_s3_client(endpoint_url=endpoint, region="us-east-1",
                                access_key_id="test", secret_access_key="test")
        create_bucket(client, "bench", "us-east-1")
        settings = settings_for(endpoint, tmp)
        store = S3ObjectStore.from_settings(settings)
        committer = ArchiveCommitter(settings, store)
        next_start = dict.fromkeys(range(args.partitions), 0)
        step_seconds: list[float] = []
        swaps: list[float] = []
        commits = 0
        for step in range(1, args.steps + 1):
            for p in range(args.partitions):
                s = next_start[p]
                records = [Record(o, 1_700_000_000_000 + o, f"k{o % 50}".encode(),
                                  text_value(rng, args.value_size))
                           for o in range(s, s + args.records)]
                publish(store, SegmentKey("data", "r1", "t", p, 0, s, s + args.records - 1),
                        records)
                next_start[p] = s + args.records
            t0 = time.monotonic()
            r = committer.sync("r1", "t")
            step_seconds.append(time.monotonic() - t0)
            commits += r.committed
            if args.compact_every and step % args.compact_every == 0:
                t0 = time.monotonic()
                report = Compaction(settings, store=store, archive_factory=lambda *_: committer,
                                    clock=lambda: datetime.now(UTC) + timedelta(hours=1),
                                    ).run_once()
                swaps.append(time.monotonic() - t0)
                commits += 1
                assert report.outcome == "success", report
        table = committer.table("r1", "t", create=False)
        assert table is not None
        later = ArchiveCommitter(settings, store,
                                 clock=lambda: datetime.now(UTC) + ORPHAN_GRACE * 2)
        later.clean_metadata(table)
        files = table.files()
        data_bytes = sum(f.size for f in files.values())
        prefix = table.location.split("/", 3)[3] + "/metadata/"
        listing = list(store.list(prefix))
        meta = [o.size for o in listing]
        json_bytes = sum(o.size for o in listing if o.key.endswith(".metadata.json"))
        ordered = sorted(step_seconds)
        out: dict[str, Any] = {
            "partitions": args.partitions, "steps": args.steps,
            "segments_published": args.partitions * args.steps,
            "table_files": len(files),
            "records": sum(f.records for f in files.values()),
            "data_bytes": data_bytes,
            "metadata_files": len(meta), "metadata_bytes": sum(meta),
            "metadata_json_bytes": json_bytes,
            "manifest_bytes": sum(meta) - json_bytes,
            "metadata_percent_of_data": round(100 * sum(meta) / max(1, data_bytes), 3),
            "snapshots_kept": len(table.snapshots()),
            "commits": commits,
            "step_seconds_p50": round(percentile(ordered, 50), 3),
            "step_seconds_p99": round(percentile(ordered, 99), 3),
            "step_seconds_max": round(ordered[-1], 3),
            "compaction_run_seconds": [round(x, 2) for x in swaps],
        }
        print(json.dumps(out, indent=2))
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
