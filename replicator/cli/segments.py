"""``replicator segments ls|inspect``: what is in a bucket, per partition and level."""

from __future__ import annotations

from pathlib import Path

import click

from formats.records import Record
from replicator.cli.common import EXIT_FAILURE, config_option, echo_json, fail
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.errors import KeyFormatError, ReplicatorError
from replicator.core.keys import SegmentKey, check_prefix
from replicator.core.units import format_size
from replicator.ops.segments import inspect_segment, summarize

output_option = click.option("--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True)


@click.group()
def segments() -> None:
    """List and inspect segments."""


@segments.command("ls")
@config_option
@click.option("--bucket", default=None, help="Bucket to list (default: s3.bucket).")
@click.option("--region", default=None, help="Only this source region.")
@click.option("--topic", default=None, help="Only this topic.")
@output_option
def ls(  # noqa: C901 - filters and two output forms of one listing
        config: Path, bucket: str | None, region: str | None, topic: str | None,
        output: str) -> None:
    """Per topic/partition/level: ranges, counts, bytes; gaps and overlaps."""
    settings, store = settings_store(config, bucket)
    prefix = settings.s3.prefix + "/"
    if region:
        prefix += region + "/"
        if topic:
            prefix += topic + "/"
    try:
        parts = [p for p in summarize(store.list(prefix)) if topic in (None, p.topic)]
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if output == "json":
        echo_json([p.as_dict() for p in parts])
        return
    rows: list[list[object]] = []
    for p in parts:
        for lv in sorted(p.levels.values(), key=lambda v: v.level):
            rows.append([p.region, p.topic, p.partition, lv.level, lv.count, lv.first, lv.last,
                         format_size(lv.bytes)])
    if not rows:
        click.echo(f"no segments under s3://{store.bucket}/{prefix}")
        return
    print_table(["region", "topic", "partition", "level", "segments", "first", "last",
                 "bytes"], rows)
    for p in parts:
        for start, end in p.gaps:
            click.echo(f"GAP      {p.region}/{p.topic}[{p.partition}] positions {start}-{end} "
                       f"({end - start + 1}) have no segment")
        for first_key, second_key in p.overlaps:
            click.echo(f"OVERLAP  {first_key} and {second_key}")


@segments.command("inspect")
@config_option
@click.argument("key")
@click.option("--bucket", default=None, help="Bucket (default: s3.bucket).")
@output_option
def inspect(config: Path, key: str, bucket: str | None, output: str) -> None:
    """Format, footer metadata, record count, first and last record of one segment.

    The format is read from the segment's own bytes, whatever format.name says.
    """
    settings, store = settings_store(config, bucket)
    try:
        check_prefix(settings.s3.prefix)
        seg = SegmentKey.parse(key)
        result = inspect_segment(store, seg)
    except KeyFormatError as e:
        fail(str(e), 2)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    data = {"key": result.key, "size": result.size, "format": result.format,
            "footer": result.footer,
            "records": result.records, "first": _record(result.first),
            "last": _record(result.last)}
    if output == "json":
        echo_json(data)
        return
    click.echo(f"{result.key}  ({result.format}, {format_size(result.size)}, "
               f"{result.records} records)")
    for k, v in sorted(result.footer.items()):
        click.echo(f"  {k:15} {v}")
    for name in ("first", "last"):
        click.echo(f"  {name:15} {data[name]}")


def _record(r: Record | None) -> dict[str, object] | None:
    if r is None:
        return None
    return {"offset": r.offset, "timestamp_ms": r.timestamp_ms,
            "timestamp_type": r.timestamp_type,
            "key": None if r.key is None else r.key[:64].decode(errors="replace"),
            "value_bytes": None if r.value is None else len(r.value),
            "headers": [h[0] for h in r.headers]}
