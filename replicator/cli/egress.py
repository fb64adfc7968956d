"""``replicator-egress --config FILE``."""

from __future__ import annotations

from pathlib import Path

import click

from replicator.cli.common import config_option, run_controller
from replicator.core.settings import Settings


def _build(settings: Settings) -> object:
    from egress.allocators import choose_arrow_pool

    # Before pyarrow loads: the Parquet encoders allocate from Arrow's C++ default pool,
    # which only the environment chooses (egress/allocators.py).
    if settings.egress is not None:
        choose_arrow_pool(settings.egress.memory_pool)
    from egress.controller import Egress  # imported here: the CLI loads settings first

    return Egress(settings)


@click.command(name="replicator-egress")
@click.version_option(package_name="kafka-s3-replicator")
@config_option
def main(config: Path) -> None:
    """Run the egress controller until SIGTERM (which drains and exits 0)."""
    run_controller(config, "egress", _build)  # type: ignore[arg-type]
