"""``replicator-ingress --config FILE``."""

from __future__ import annotations

from pathlib import Path

import click

from replicator.cli.common import Controller, config_option, run_controller
from replicator.core.settings import Settings


def _build(settings: Settings) -> Controller:
    from ingress.controller import Ingress

    return Ingress(settings)


@click.command(name="replicator-ingress")
@click.version_option(package_name="kafka-s3-replicator")
@config_option
def main(config: Path) -> None:
    """Run the ingress controller until SIGTERM (drains and exits 0)."""
    run_controller(config, "ingress", _build)
