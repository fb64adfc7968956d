"""``replicator-compaction --config FILE [--once] [--topic T] [--partition P] [--min-level N]
[--max-level N] [--dry-run]``.

Without ``--once`` the process runs on ``compaction.schedule`` (UTC; 5 fields = standard
crontab, 6 fields = seconds-first like the original's ``"0 0 1 * * *"``) and serves
/metrics, /healthz and /readyz meanwhile; SIGTERM exits 0. ``--once`` runs one pass now and
prints its report and a metrics summary. ``--dry-run`` prints the plan (segments in,
segment out, bytes) and touches nothing. Exit codes: 0 ok, 1 a run failed, 2 bad
configuration or usage.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

import click

from replicator.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    config_option,
    echo_json,
    fail,
    load_or_exit,
    run_controller,
)
from replicator.cli.logs import setup_logging
from replicator.core.errors import ConfigError, ReplicatorError
from replicator.core.settings import Settings

log = logging.getLogger(__name__)


@click.command(name="replicator-compaction")
@click.version_option(package_name="kafka-s3-replicator")
@config_option
@click.option("--once", is_flag=True, help="Run one pass now and exit (instead of the "
                                           "schedule).")
@click.option("--topic", default=None, help="Only this topic (must be in "
                                            "[compaction.topics]).")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Only this partition (of every incarnation of a recreated topic).")
@click.option("--min-level", type=click.IntRange(min=0), default=None,
              help="Lowest input level (overrides the topic's min_level).")
@click.option("--max-level", type=click.IntRange(min=0), default=None,
              help="Highest input level (overrides the topic's max_level).")
@click.option("--dry-run", is_flag=True, help="Print the plan and touch nothing "
                                              "(implies --once).")
def main(config: Path, once: bool, topic: str | None, partition: int | None,
         min_level: int | None, max_level: int | None, dry_run: bool) -> None:
    """Merge small segments of this region into higher levels (docs/services.md, "Compaction")."""
    from compaction.controller import Compaction
    from compaction.report import RunScope
    from replicator.cli.archive import archive_factory

    scope = RunScope(topic, partition, min_level, max_level)
    if not (once or dry_run):
        def build(settings: Settings) -> Compaction:
            c = Compaction(settings, scope=scope, archive_factory=archive_factory)
            c.topic_settings(scope)   # bad --topic/levels: exit 2 before anything starts
            return c

        run_controller(config, "compaction", build)
        return

    settings = load_or_exit(config, "compaction")
    setup_logging(settings.log.level, settings.log.format)
    try:
        controller = Compaction(settings, scope=scope, serve_metrics=False,
                                archive_factory=archive_factory)
        controller.topic_settings(scope)
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping the run", signal.Signals(signum).name)
        controller.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        controller.start()
        report = controller.run_once(topic, partition, min_level, max_level, dry_run=dry_run)
    except ConfigError as e:
        controller.close()
        fail(str(e), EXIT_USAGE)
    except ReplicatorError as e:
        controller.close()
        fail(str(e), EXIT_FAILURE)
    controller.close()

    if dry_run:
        _print_plan(report.to_json())
    else:
        summary = controller.m.summary()
        log.info("compaction summary: %s", json.dumps(summary))
        echo_json({"report": report.to_json(), "metrics": summary})
    if report.outcome == "failed" and not controller.stopped:
        sys.exit(EXIT_FAILURE)
    sys.exit(EXIT_OK)


def _print_plan(report: dict[str, object]) -> None:
    tasks = report["tasks"]
    covered = report["covered_to_delete"]
    assert isinstance(tasks, list) and isinstance(covered, list)
    click.echo(f"dry run of region {report['region']}: {len(tasks)} merge task(s), "
               f"{len(covered)} covered leftover(s) to delete")
    for t in tasks:
        click.echo(f"{t['topic']}[{t['partition']}]: {len(t['inputs'])} segments in, "
                   f"{t['bytes']} bytes -> {t['output']}")
        for k in t["inputs"]:
            click.echo(f"    in  {k}")
        for k in t["covered"]:
            click.echo(f"    covered (deleted after) {k}")
    for k in covered:
        click.echo(f"leftover covered by a higher level (deleted): {k}")
    for h in report["holes"]:  # type: ignore[attr-defined]
        click.echo(f"hole: {h}")
    for s in report["skipped"]:  # type: ignore[attr-defined]
        click.echo(f"not merged: {s}")
