"""``replicator checkpoints show``: per source partition, checkpoint, latest segment, lag."""

from __future__ import annotations

from pathlib import Path

import click

from ingress.checkpoints import KafkaCheckpointStore
from replicator.cli.common import EXIT_FAILURE, config_option, echo_json, fail, timeout_option
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.errors import ReplicatorError
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSettings
from replicator.ops.checkpoints import checkpoint_report


@click.group()
def checkpoints() -> None:
    """Ingress progress."""


@checkpoints.command("show")
@config_option
@timeout_option
@click.option("--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def show(config: Path, output: str, timeout: float) -> None:
    """Every checkpoint field, newest segment end and lag of each source partition.

    Reads the checkpoint topic of the ingress config's Kafka cluster and lists the
    destination bucket. Columns: the checkpoint (last source offset replayed), the segment
    it came from, when it was written, the last range declared lost, the origin (where the
    first replay started without a checkpoint), the newest segment's end and the lag.
    """
    settings, store = settings_store(config)
    ingress: IngressSettings | None = settings.ingress
    if ingress is None:
        fail("ingress: section [ingress] is required by this command", 2)
    try:
        cps = KafkaCheckpointStore(settings.kafka, ingress.checkpoint_topic, Metrics(),
                                   timeout=timeout).load_all()
        rows = checkpoint_report(ingress, settings.s3.prefix, store, cps)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if output == "json":
        echo_json([r.as_dict() for r in rows])
        return
    if not rows:
        click.echo("no segments and no checkpoints for the configured sources yet")
        return
    print_table(["source", "partition", "destination", "checkpoint", "segments to", "lag",
                 "updated", "lost", "origin", "segment"],
                [[f"{r.region}/{r.topic}", r.partition, r.destination_topic,
                  "-" if r.checkpoint is None else r.checkpoint,
                  "-" if r.latest_segment_end is None else r.latest_segment_end,
                  "-" if r.lag is None else r.lag, r.updated_at or "-",
                  "-" if r.lost is None else f"{r.lost[0]}-{r.lost[1]}",
                  "-" if r.origin is None else r.origin, r.segment or "-"] for r in rows])
