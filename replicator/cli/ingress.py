"""``replicator-ingress --config FILE``."""

from __future__ import annotations

from pathlib import Path

import click

from replicator.cli.common import EXIT_FAILURE, config_option, fail, load_or_exit


@click.command(name="replicator-ingress")
@config_option
def main(config: Path) -> None:
    """Run the ingress controller until SIGTERM."""
    load_or_exit(config, "ingress")
    fail("ingress is not implemented yet", EXIT_FAILURE)
