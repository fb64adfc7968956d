"""``replicator-egress --config FILE``."""

from __future__ import annotations

from pathlib import Path

import click

from replicator.cli.common import EXIT_FAILURE, config_option, fail, load_or_exit


@click.command(name="replicator-egress")
@config_option
def main(config: Path) -> None:
    """Run the egress controller until SIGTERM."""
    load_or_exit(config, "egress")
    fail("egress is not implemented yet", EXIT_FAILURE)
