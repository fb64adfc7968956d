"""``replicator verify``: compare a source topic with its copy."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from replicator.cli.common import EXIT_FAILURE, echo_json, fail, load_or_exit
from replicator.cli.tables import print_table
from replicator.core.errors import ReplicatorError
from replicator.core.settings import KafkaSettings
from replicator.ops.verify import verify_topics


def _kafka(brokers: str | None, config: Path | None, side: str) -> KafkaSettings:
    if config is not None:
        return load_or_exit(config).kafka
    if brokers is None:
        fail(f"give --{side}-brokers or --{side}-config", 2)
    return KafkaSettings(brokers=brokers)


@click.command()
@click.option("--source", "source_topic", required=True, help="Source topic.")
@click.option("--destination", "destination_topic", required=True, help="Destination topic.")
@click.option("--source-brokers", default=None, help="bootstrap.servers of the source.")
@click.option("--destination-brokers", default=None,
              help="bootstrap.servers of the destination (default: the source's).")
@click.option("--source-config", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Settings file whose [kafka] reaches the source.")
@click.option("--destination-config", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Settings file whose [kafka] reaches the destination.")
@click.option("--timeout", default=30.0, show_default=True,
              help="Seconds without data before a partition read fails.")
@click.option("--fan-in", is_flag=True,
              help="The destination is fed by other sources too (several regions into one "
                   "topic): compare only its records equal to a record of the source; "
                   "they must be all of the source's, once each, in order.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table")
def verify(source_topic: str, destination_topic: str, source_brokers: str | None,
           destination_brokers: str | None, source_config: Path | None,
           destination_config: Path | None, timeout: float, fan_in: bool,
           output: str) -> None:
    """Compare two topics partition by partition: counts, lost, duplicated, reordered.

    Exit code 0 when the copy equals the source record by record, 1 otherwise.
    """
    src = _kafka(source_brokers, source_config, "source")
    if destination_brokers is None and destination_config is None:
        dst = src
    else:
        dst = _kafka(destination_brokers, destination_config, "destination")
    try:
        report = verify_topics(src, source_topic, dst, destination_topic, idle_timeout=timeout,
                               fan_in=fan_in)
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if output == "json":
        echo_json(report.as_dict())
    else:
        print_table(["partition", "source", "destination", "lost", "duplicated", "reordered",
                     "ok"],
                    [[p.partition, p.source_records, p.destination_records, p.lost,
                      p.duplicated, p.reordered, "yes" if p.ok else "NO"]
                     for p in report.partitions])
        for problem in report.problems:
            click.echo(f"problem: {problem}")
        for p in report.partitions:
            if p.first_difference is not None:
                click.echo(f"partition {p.partition}: first difference {p.first_difference}")
        click.echo("PASS" if report.ok else "FAIL")
    sys.exit(0 if report.ok else 1)
