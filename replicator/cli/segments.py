"""``replicator segments ls|inspect|cat``: what is in a bucket, per partition and level, and
the records of a segment.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from formats.records import Record
from replicator.cli.common import EXIT_FAILURE, config_option, echo_json, fail
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.errors import KeyFormatError, ReplicatorError
from replicator.core.keys import SegmentKey, check_prefix
from replicator.core.units import format_size
from replicator.ops.incarnations import choose
from replicator.ops.restore import list_archive
from replicator.ops.restore_plan import RestoreRange, plan
from replicator.ops.segments import cat_segment, inspect_segment, record_json, summarize

output_option = click.option("--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True)


@click.group()
def segments() -> None:
    """List, inspect and print segments."""


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
            rows.append([p.region, p.name, p.partition, lv.level, lv.count, lv.first, lv.last,
                         format_size(lv.bytes)])
    if not rows:
        click.echo(f"no segments under s3://{store.bucket}/{prefix}")
        return
    print_table(["region", "topic", "partition", "level", "segments", "first", "last",
                 "bytes"], rows)
    for p in parts:
        for start, end in p.gaps:
            click.echo(f"GAP      {p.region}/{p.name}[{p.partition}] positions {start}-{end} "
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


@segments.command("cat")
@config_option
@click.argument("key", required=False)
@click.option("--bucket", default=None, help="Bucket (default: s3.bucket).")
@click.option("--region", default=None, help="Source region (with --topic, without KEY).")
@click.option("--topic", default=None, help="Topic: print a partition's records from the "
                                            "archive instead of one segment's.")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Partition (with --topic).")
@click.option("--from-offset", type=click.IntRange(min=0), default=None,
              help="First offset printed (inclusive).")
@click.option("--to-offset", type=click.IntRange(min=0), default=None,
              help="Last offset printed (inclusive).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many.")
@click.option("--output", type=click.Choice(["jsonl"]), default="jsonl", show_default=True)
@click.option("--incarnation", default=None,
              help="With --topic: the topic id of the incarnation to read when the topic "
                   "was deleted and created again (default: the live one).")
def cat(config: Path, key: str | None, bucket: str | None,
        region: str | None, topic: str | None, partition: int | None,
        from_offset: int | None, to_offset: int | None, limit: int | None,
        output: str, incarnation: str | None) -> None:
    """Print records as JSON lines: offset, timestamp (ms), timestamp_type, key, value,
    headers ([name, value] pairs, in order).

    Keys, values and header values are printed as UTF-8 text when they decode, else as
    {"base64": "..."}; null stays null (a tombstone's value). Give a segment KEY, or
    --region/--topic/--partition (and offsets) to read a partition's records from the
    fewest segments of any level, each record once.
    """
    settings, store = settings_store(config, bucket)
    try:
        check_prefix(settings.s3.prefix)
        if key is not None:
            seg = SegmentKey.parse(key)
            steps = [(seg, max(from_offset or 0, seg.start),
                      seg.end if to_offset is None else min(seg.end, to_offset))]
        else:
            if region is None or topic is None or partition is None:
                fail("give a segment KEY, or --region, --topic and --partition", 2)
            rng = RestoreRange(from_offset, to_offset)
            chosen = choose(store, settings.s3.prefix, region, topic, incarnation)
            if chosen.describe():
                click.echo(f"reading {region}/{topic} {chosen.describe()}", err=True)
            p = plan(list_archive(store, settings.s3.prefix, region, topic, chosen.label),
                     rng, [partition])
            for r in p.refusals():
                click.echo(f"warning: {r}", err=True)
            steps = [(s.segment.key, s.first, s.last) for s in p.steps if s.segment.readable]
        n = 0
        for seg, first, last in steps:
            for rec in cat_segment(store, seg, first=first, last=last):
                click.echo(json.dumps(record_json(rec), ensure_ascii=False))
                n += 1
                if limit is not None and n >= limit:
                    return
    except (KeyFormatError, ValueError) as e:
        fail(str(e), 2)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
