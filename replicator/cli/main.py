"""``replicator``: the embedded stack, the demo and the operator tools."""

from __future__ import annotations

import click

from replicator.cli.local import local


@click.group()
@click.version_option(package_name="kafka-s3-replicator")
def main() -> None:
    """kafka-s3-replicator: replicate Kafka topics between regions through S3."""


main.add_command(local)
