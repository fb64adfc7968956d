"""``replicator failback record-start``: the first offset written in the DR region."""

from __future__ import annotations

from pathlib import Path

import click

from replicator.cli.common import EXIT_FAILURE, EXIT_USAGE, config_option, echo_json, fail
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.errors import ReplicatorError
from replicator.core.settings import IngressSettings
from replicator.ops.failback import destination_starts, reset_offsets_csv


@click.group()
def failback() -> None:
    """What a failback needs, recorded at the failover."""


@failback.command("record-start")
@config_option
@click.option("--save", "save", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the offsets to this file as topic,partition,offset lines "
                   "(the format of kafka-consumer-groups.sh --reset-offsets --from-file).")
@click.option("--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def record_start(config: Path, save: Path | None, output: str) -> None:
    """Per partition of each destination topic, the first offset written in this (DR)
    region after the failover: the partition's end once ingress has stopped.

    Run it with the ingress config right after ingress is stopped at a failover, before the
    producers in this region start, and keep the file: the failback egress starts there
    (docs/runbooks.md, "Failback"). Exit 1 while ingress still has members or a
    transaction is open (the end can still move).
    """
    settings, store = settings_store(config)
    ingress: IngressSettings | None = settings.ingress
    if ingress is None:
        fail("ingress: section [ingress] is required by this command", EXIT_USAGE)
    try:
        rows = destination_starts(settings.kafka, ingress, settings.s3.prefix, store)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if save is not None:
        save.write_text(reset_offsets_csv(rows))
    if output == "json":
        echo_json([r.as_dict() for r in rows])
    else:
        print_table(["destination", "partition", "first DR offset", "sources"],
                    [[r.topic, r.partition, r.start, ", ".join(r.sources)] for r in rows])
    if save is not None:
        click.echo(f"saved to {save}: kafka-consumer-groups.sh --reset-offsets --from-file "
                   f"{save} --group <failback egress group> --execute", err=True)
