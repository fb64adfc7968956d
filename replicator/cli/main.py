"""``replicator``: the embedded stack, the demo and the operator tools."""

from __future__ import annotations

import click

from replicator.cli.archive import archive
from replicator.cli.checkpoints import checkpoints
from replicator.cli.cutover import cutover
from replicator.cli.demo import demo
from replicator.cli.doctor import doctor
from replicator.cli.failback import failback
from replicator.cli.groups import groups
from replicator.cli.local import local
from replicator.cli.logs import setup_command_logging
from replicator.cli.restore import restore
from replicator.cli.segments import segments
from replicator.cli.sync import sync
from replicator.cli.topics import topics
from replicator.cli.verify import verify


@click.group()
@click.version_option(package_name="kafka-s3-replicator")
def main() -> None:
    """kafka-s3-replicator: replicate Kafka topics between regions through S3."""
    # Warnings and errors of our own code on stderr; the Kafka client's and Spark's lines
    # never on the terminal (commands with a log file send them there).
    setup_command_logging()


main.add_command(local)
main.add_command(demo)
main.add_command(sync)
main.add_command(segments)
main.add_command(verify)
main.add_command(checkpoints)
main.add_command(cutover)
main.add_command(restore)
main.add_command(topics)
main.add_command(groups)
main.add_command(doctor)
main.add_command(failback)
main.add_command(archive)
