"""``replicator cutover from-mm2``: start ingress where MirrorMaker 2 stopped."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import click

from ingress.checkpoints import KafkaCheckpointStore
from replicator.cli.common import EXIT_FAILURE, EXIT_USAGE, config_option, echo_json, fail
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.errors import ReplicatorError, TopicError
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSettings
from replicator.core.units import parse_duration
from replicator.ops.mm2_cutover import plan_cutover, refused, write_cutover


@click.group()
def cutover() -> None:
    """Take over replication from another tool."""


@cutover.command("from-mm2")
@config_option
@click.option("--lookback", default="10m", show_default=True,
              help="Read the destination from this long before the oldest archived record "
                   "(by record timestamp); \"all\": from the beginning. Destination records "
                   "older than the segments are neither checked nor mapped.")
@click.option("--dry-run", is_flag=True, help="Print what would be written, write nothing.")
@click.option("--force", is_flag=True,
              help="Write even for partitions that already have a checkpoint.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def from_mm2(config: Path, lookback: str, dry_run: bool, force: bool, output: str) -> None:
    """Checkpoints so ingress continues where MirrorMaker 2 stopped, in the same topics.

    Run with the ingress config (destination_topic = the topics MM2 writes, e.g.
    "primary.{topic}"), MM2 stopped, ingress not started, and egress's segments past the
    source's end when MM2 stopped. Per partition it matches the destination's records to the
    archived source records by key, value, headers and timestamp, and writes a checkpoint
    at the source offset of the destination's last record (ingress resumes right after it:
    no gap, no duplicate) and offset-map entries for the matched records (so `replicator
    groups sync` translates groups committed in MM2's part). Refuses, exit 1, when a
    record cannot be placed without a guess. docs/migrating-from-mirrormaker.md.
    """
    settings, store = settings_store(config)
    ingress: IngressSettings | None = settings.ingress
    if ingress is None:
        fail("ingress: section [ingress] is required by this command", EXIT_USAGE)
    try:
        back = None if lookback == "all" else parse_duration(lookback)
    except ValueError as e:
        fail(f"--lookback: {e}", EXIT_USAGE)
    if back is not None and back < timedelta(0):
        fail("--lookback: must not be negative", EXIT_USAGE)
    try:
        plan = plan_cutover(settings.kafka, ingress, settings.s3.prefix, store, lookback=back)
        try:
            existing = KafkaCheckpointStore(settings.kafka, ingress.checkpoint_topic,
                                            Metrics(), timeout=30).load_all()
        except TopicError:
            existing = {}        # no checkpoint topic yet: ingress never ran here
        taken = refused(plan, existing)
        if taken and not force:
            fail("ingress already has checkpoints (it replays these partitions; --force "
                 "overwrites them): " + "; ".join(taken), EXIT_FAILURE)
        written = 0 if dry_run else write_cutover(settings.kafka, ingress, plan)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if output == "json":
        echo_json({"written": written, "dry_run": dry_run,
                   "partitions": [c.as_dict() for c in plan]})
        return
    print_table(["source", "partition", "destination", "destination end", "resume at",
                 "aligned", "older", "mm2 rewinds", "mm2 skipped", "map entries"],
                [[f"{c.region}/{c.topic}", c.partition, c.destination, c.destination_end,
                  "start option" if c.resume_at is None else c.resume_at, c.aligned, c.head,
                  c.rewinds, sum(b - a + 1 for a, b in c.skipped), len(c.entries)]
                 for c in plan])
    click.echo("dry run: nothing written" if dry_run else
               f"wrote {written} checkpoint and offset-map records: start ingress now")
