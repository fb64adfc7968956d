"""``replicator sync``: bucket-to-bucket copy for stores without S3 replication."""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import click

from replicator.cli.common import EXIT_FAILURE, echo_json, fail, load_or_exit
from replicator.cli.logs import setup_command_logging
from replicator.cli.stores import store_for
from replicator.core.errors import ReplicatorError
from replicator.core.units import format_size
from replicator.ops.sync import BucketSync, SyncReport

log = logging.getLogger(__name__)


@click.command()
@click.option("--from-bucket", required=True, help="Bucket to copy from.")
@click.option("--to-bucket", required=True, help="Bucket to copy to.")
@click.option("--prefix", default="data", show_default=True,
              help="Data prefix (s3.prefix; docs/architecture.md, \"S3 layout\").")
@click.option("--endpoint-url", default=None, help="Endpoint of both buckets (S3-compatible).")
@click.option("--from-endpoint-url", default=None, help="Endpoint of the source bucket.")
@click.option("--to-endpoint-url", default=None, help="Endpoint of the destination bucket.")
@click.option("--from-region", default="us-east-1", show_default=True)
@click.option("--to-region", default="us-west-1", show_default=True)
@click.option("--config", "config", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Take credentials (and the endpoint) from this settings file.")
@click.option("--follow", is_flag=True, help="Keep syncing until SIGTERM/Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between passes.")
@click.option("--no-delete", is_flag=True, help="Never delete destination objects.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text")
def sync(from_bucket: str, to_bucket: str, prefix: str, endpoint_url: str | None,
         from_endpoint_url: str | None, to_endpoint_url: str | None, from_region: str,
         to_region: str, config: Path | None, follow: bool, interval: float,
         no_delete: bool, output: str) -> None:
    """Copy segment objects (and deletes) from one bucket to another.

    Under PREFIX, final segment keys, _topic.json and the exported consumer-group
    offsets (_groups/) are copied; temporary objects and the compaction lock never are.
    Segments the source no longer has are deleted (not with --no-delete); _topic.json
    and group offsets never are. Each pass copies before it deletes, so readers of the
    destination always find a segment covering every range. Running it again changes
    nothing.
    """
    setup_command_logging("INFO" if follow else "WARNING")
    settings = load_or_exit(config) if config is not None else None
    default_endpoint = endpoint_url or (settings.s3.endpoint_url if settings else None)
    src = store_for(from_bucket, endpoint_url=from_endpoint_url or default_endpoint,
                    region=from_region, settings=settings)
    dst = store_for(to_bucket, endpoint_url=to_endpoint_url or default_endpoint,
                    region=to_region, settings=settings)
    syncer = BucketSync(src, dst, prefix, delete=not no_delete)
    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    try:
        report = syncer.follow(interval, lambda: stop) if follow else syncer.run_once()
    except ReplicatorError as e:
        fail(f"sync failed: {e}", EXIT_FAILURE)
    _print(report, time.monotonic() - started, output)
    sys.exit(0)


def _print(report: SyncReport, seconds: float, output: str) -> None:
    if output == "json":
        echo_json({"copied": len(report.copied), "deleted": len(report.deleted),
                   "bytes_copied": report.bytes_copied, "unchanged": report.skipped,
                   "vanished": len(report.vanished), "seconds": round(seconds, 3)})
        return
    click.echo(f"copied {len(report.copied)} object(s), {format_size(report.bytes_copied)}; "
               f"deleted {len(report.deleted)}; unchanged {report.skipped}; "
               f"{seconds:.1f}s")
