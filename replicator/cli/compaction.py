"""``replicator-compaction --config FILE``."""

from __future__ import annotations

from pathlib import Path

import click

from replicator.cli.common import EXIT_FAILURE, config_option, fail, load_or_exit


@click.command(name="replicator-compaction")
@config_option
def main(config: Path) -> None:
    """Run the compaction controller until SIGTERM."""
    load_or_exit(config, "compaction")
    fail("compaction is not implemented yet", EXIT_FAILURE)
