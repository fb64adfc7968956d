"""``replicator restore``: replay a range of the archive into a topic (docs/restore.md)."""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime
from pathlib import Path

import click

from replicator.archive.restore_snapshot import SnapshotUnknown, snapshot_read
from replicator.cli.common import EXIT_FAILURE, EXIT_USAGE, config_option, fail
from replicator.cli.logs import setup_command_logging
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.errors import ConfigError, KeyFormatError, ReplicatorError
from replicator.core.keys import SegmentKey, check_region, check_topic
from replicator.core.storage import ObjectStore
from replicator.core.units import format_size, parse_size
from replicator.ops.incarnations import choose
from replicator.ops.pace import Progress, summary_lines
from replicator.ops.restore import Restorer, make_plan
from replicator.ops.restore_plan import Plan, RestoreRange
from replicator.ops.restore_request import RestoreRefused, RestoreRequest

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_TOPIC = "replicator.checkpoint"


def parse_partitions(text: str) -> tuple[int, ...]:
    """``"0,3-5"`` → ``(0, 3, 4, 5)``.

    Raises:
        click.BadParameter: naming the bad part.
    """
    out: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if a > b or a < 0:
                    raise ValueError
                out.update(range(a, b + 1))
            else:
                if int(part) < 0:
                    raise ValueError
                out.add(int(part))
        except ValueError:
            raise click.BadParameter(f"{part!r} is not a partition or a range like 3-5",
                                     param_hint="--partitions") from None
    return tuple(sorted(out))


def parse_time(text: str, option: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time with a zone (``2026-11-23T10:00:00Z``).

    Raises:
        click.BadParameter: naming the option.
    """
    if text.strip().isdigit():
        return int(text)
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        t = None
    if t is None or t.tzinfo is None:
        raise click.BadParameter(f"{text!r} is not milliseconds since the epoch nor an ISO 8601 "
                                 "time with a zone (2026-11-23T10:00:00Z)", param_hint=option)
    return int(t.timestamp() * 1000)


def parse_rate(text: str) -> int:
    """``"50MB/s"`` → bytes per second.

    Raises:
        click.BadParameter: naming ``--rate``.
    """
    try:
        rate = parse_size(text.strip().removesuffix("/s"))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--rate") from None
    if rate <= 0:
        raise click.BadParameter("must be positive", param_hint="--rate")
    return rate


def print_plan(p: Plan) -> None:
    """The dry run's view of a plan."""
    rows: list[list[object]] = [
        [s.segment.key.partition, s.segment.key.level, f"{s.first}-{s.last}",
         s.segment.storage_class or "STANDARD", format_size(s.segment.size), str(s.segment.key)]
        for s in p.steps]
    if rows:
        print_table(["partition", "level", "offsets", "storage class", "bytes", "segment"],
                    rows)
    levels = sorted({s.segment.key.level for s in p.steps})
    if p.snapshot is not None:
        click.echo(f"snapshot {p.snapshot}: {len(p.steps)} of its segment(s) in the range, "
                   f"{len(p.missing)} no longer in the bucket")
    for k in p.missing:
        click.echo(f"MISSING  {k} (listed by snapshot {p.snapshot}, deleted since)")
    click.echo(f"{len(p.steps)} segment(s) (levels {', '.join(map(str, levels)) or '-'}), "
               f"{format_size(p.bytes_to_read)} to read; about {p.est_records:,} records "
               f"at most ({format_size(p.est_bytes)} stored)")
    for part, a, b in p.gaps:
        click.echo(f"GAP      partition {part} positions {a}-{b} ({b - a + 1}) are missing")


class _Bar:
    """The progress line on stderr (rewritten in place, at most every 0.5 s)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._last = 0.0

    def __call__(self, progress: Progress, *, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self._last < 0.5):
            return
        self._last = now
        click.echo("\r" + progress.line(now).ljust(79), nl=final, err=True)


@click.command()
@config_option
@click.option("--source-region", required=True, help="Region whose segments are read.")
@click.option("--topic", required=True, help="Source topic in the archive.")
@click.option("--to-topic", required=True,
              help="Topic written, in the cluster of the config's [kafka]; created if missing "
                   "with the source's partition count and copied configs (_topic.json) but "
                   "no retention, no compaction and CreateTime, so restored records stay.")
@click.option("--partitions", default=None, help="Only these partitions: 0,3-5 (default: all).")
@click.option("--from-offset", type=click.IntRange(min=0), default=None,
              help="First offset (inclusive; default: the archive's first).")
@click.option("--to-offset", type=click.IntRange(min=0), default=None,
              help="Last offset (inclusive; default: the archive's last).")
@click.option("--from-time", default=None,
              help="Only records from this time (inclusive): ms since the epoch or ISO 8601.")
@click.option("--to-time", default=None,
              help="Only records up to this time (inclusive): ms since the epoch or ISO 8601.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (segments, levels, storage classes, bytes, estimates) and "
                   "what would be refused; produce nothing.")
@click.option("--rate", default=None, help="Limit the bytes of keys, values and headers "
                                           "produced per second: 50MB/s.")
@click.option("--allow-gaps", is_flag=True,
              help="Skip positions missing from the archive (logged and counted) instead of "
                   "refusing to start.")
@click.option("--force", is_flag=True,
              help="Restore even when another range already restored into --to-topic may "
                   "hold some of these records (they are then in the topic twice).")
@click.option("--accept-target-config", is_flag=True,
              help="Restore into an existing --to-topic whose configs would replace the "
                   "records' timestamps (message.timestamp.type=LogAppendTime) or delete "
                   "restored records (retention.ms shorter than their age, retention.bytes "
                   "below what a partition restores); refused "
                   "otherwise, exit 2.")
@click.option("--checkpoint-topic", default=None,
              help="Topic of the restore's checkpoints (created compacted if missing; "
                   f"default: ingress.checkpoint_topic, else {DEFAULT_CHECKPOINT_TOPIC}).")
@click.option("--batch-size", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Records per transaction.")
@click.option("--progress/--no-progress", default=None,
              help="Progress line on stderr (default: when stderr is a terminal).")
@click.option("--log-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the restore's log (INFO and up, the Kafka client's too) here.")
@click.option("--bucket", default=None, help="Bucket (default: s3.bucket).")
@click.option("--snapshot", "snapshot_id", type=int, default=None,
              help="Restore what this snapshot of the topic's archive table lists (a restore "
                   "point; needs [catalog]): exactly its segments, within the other bounds. "
                   "Refused (exit 2) when a segment it lists is no longer in the bucket, "
                   "unless --allow-gaps (docs/restore.md).")
@click.option("--incarnation", default=None,
              help="Topic id of the incarnation to read when the source topic was deleted "
                   "and created again (default: the live one; docs/architecture.md, "
                   "\"Topic incarnations\").")
def restore(config: Path, source_region: str, topic: str, to_topic: str,  # noqa: C901
            partitions: str | None, from_offset: int | None, to_offset: int | None,
            from_time: str | None, to_time: str | None, dry_run: bool, rate: str | None,
            allow_gaps: bool, force: bool, accept_target_config: bool,
            checkpoint_topic: str | None, batch_size: int,
            progress: bool | None, log_file: Path | None, bucket: str | None,
            snapshot_id: int | None, incarnation: str | None) -> None:
    """Replay a range of archived segments into a topic, exactly once.

    Same partition, same order, same keys, values (null stays null), headers and
    timestamps. The planner reads the fewest segments of any level that cover the range,
    never a record twice. Each batch is one transaction with a checkpoint keyed by the whole
    request, restore:{region}:{topic}:{partition}:{to-topic}:{offsets}:{times}[#snapshot]:
    run the same command again after an interruption and it resumes where it stopped; another
    range is
    another restore, refused (exit 2) where it may repeat records another range already
    restored into --to-topic, unless --force. Restores of disjoint --partitions of one
    topic run side by side. Exit 0 only when the whole range was restored; a gap in the
    archive (with time bounds: any hole of the offset range), or a segment in
    GLACIER/DEEP_ARCHIVE, refuses to start (naming them). With --snapshot, the segments
    read are exactly those the table snapshot lists (its id is part of the checkpoint key).
    """
    try:
        check_region(source_region)
        check_topic(topic)
        check_topic(to_topic)
        rng = RestoreRange(from_offset, to_offset,
                           None if from_time is None else parse_time(from_time, "--from-time"),
                           None if to_time is None else parse_time(to_time, "--to-time"))
        parts = None if partitions is None else parse_partitions(partitions)
        rate_bytes = None if rate is None else parse_rate(rate)
    except (KeyFormatError, ValueError) as e:
        fail(str(e), EXIT_USAGE)
    settings, bucket_store = settings_store(config, bucket)
    store: ObjectStore = bucket_store
    if log_file is not None:
        # INFO and up of the restore into the file; stderr keeps warnings and errors only.
        setup_command_logging("WARNING", log_file)
        for h in logging.getLogger().handlers:
            h.setLevel(logging.WARNING)
        fh = logging.FileHandler(log_file)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        logging.getLogger().addHandler(fh)
        logging.getLogger("replicator").setLevel(logging.INFO)
    cp_topic = checkpoint_topic or (settings.ingress.checkpoint_topic if settings.ingress
                                    else DEFAULT_CHECKPOINT_TOPIC)
    try:
        chosen = choose(store, settings.s3.prefix, source_region, topic, incarnation)
    except ValueError as e:
        fail(str(e), EXIT_USAGE)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if chosen.describe():
        click.echo(f"reading {source_region}/{topic} {chosen.describe()}", err=True)
    request = RestoreRequest(source_region, topic, to_topic, cp_topic, rng, parts, allow_gaps,
                             rate_bytes, batch_size, force=force,
                             accept_target_config=accept_target_config,
                             incarnation=chosen.label, incarnation_named=chosen.named,
                             topic_ids=chosen.topic_ids, snapshot=snapshot_id)
    listed: list[SegmentKey] | None = None
    if snapshot_id is not None:
        try:
            # Trimmed copies whose segment is gone are read from the warehouse as segments
            # of their own offsets (kept in memory, never written to the bucket).
            in_snapshot = snapshot_read(settings, store, source_region, topic, snapshot_id,
                                        topic_id=chosen.topic_id, live=incarnation is None)
        except (ConfigError, SnapshotUnknown) as e:
            fail(str(e), EXIT_USAGE)
        except ReplicatorError as e:
            fail(str(e), EXIT_FAILURE)
        listed = [k for k in in_snapshot.keys if k.incarnation == chosen.label]
        store = in_snapshot.store
        if in_snapshot.from_copies:
            click.echo(f"note: snapshot {snapshot_id} lists {len(in_snapshot.from_copies)} "
                       "trimmed copies whose segment is no longer in the bucket: read from "
                       "the table's warehouse as " + ", ".join(
                           k.to_key() for k in in_snapshot.from_copies[:5]), err=True)
    try:
        plan = make_plan(store, settings.s3.prefix, request,
                         note=lambda m: click.echo(f"note: {m}", err=True), listed=listed)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    refusals = plan.refusals(allow_gaps=allow_gaps)
    gone = plan.snapshot_refusals(allow_gaps=allow_gaps)
    if dry_run:
        print_plan(plan)
        for r in refusals + gone:
            click.echo(f"error: {r}", err=True)
        sys.exit(EXIT_USAGE if gone else EXIT_FAILURE if refusals else 0)
    if plan.missing and not gone:
        log.error("restore %s/%s snapshot %d: %d segment(s) it lists are no longer in the "
                  "bucket, their positions skipped (--allow-gaps): %s", source_region, topic,
                  snapshot_id, len(plan.missing), ", ".join(str(k) for k in plan.missing))
    if gone:
        for r in refusals:
            click.echo(f"error: {r}", err=True)
        fail(gone[-1] + " (nothing was produced)", EXIT_USAGE)
    if refusals:
        for r in refusals[:-1]:
            click.echo(f"error: {r}", err=True)
        fail(refusals[-1] + " (nothing was produced)", EXIT_FAILURE)
    if not plan.steps:
        fail("nothing to restore: no segment of the archive holds the range", EXIT_FAILURE)
    started = time.monotonic()
    prog = Progress(plan.est_records, plan.bytes_to_read, started)
    bar = _Bar(sys.stderr.isatty() if progress is None else progress)
    restorer = Restorer(settings.kafka, store, settings.s3.prefix, request, progress=prog,
                        on_progress=bar, note=lambda m: click.echo(f"note: {m}"))
    try:
        restorer.run(plan)
    except RestoreRefused as e:
        bar(prog, final=True)
        for r in e.reasons[:-1]:
            click.echo(f"error: {r}", err=True)
        fail(e.reasons[-1], EXIT_USAGE)
    except ReplicatorError as e:
        bar(prog, final=True)
        fail(f"{e} (run the same command again to resume)", EXIT_FAILURE)
    finally:
        restorer.close()
    bar(prog, final=True)
    for line in summary_lines(prog, time.monotonic()):
        click.echo(line)
    click.echo(f"restored {source_region}/{topic} into {to_topic}"
               + (" with gaps skipped" if prog.gaps else ""))
