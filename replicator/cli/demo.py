"""``replicator demo``: the whole pipeline on the embedded stack, verified."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from replicator.cli.common import kafka_option
from replicator.cli.logs import configure_demo_logging
from replicator.devstack.demo import Demo, DemoOptions
from replicator.devstack.demo_report import render_summary
from replicator.devstack.processes import BrokerKind


class _StatusLine:
    """One rewritable status line on a terminal; a line every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = ""
        self.last_print = 0.0

    def status(self, text: str) -> None:
        import time

        if self.tty:
            pad = max(0, len(self.last) - len(text))
            sys.stderr.write("\r" + text + " " * pad + ("\n" if not text else ""))
            sys.stderr.flush()
        elif text and time.monotonic() - self.last_print >= 5.0:
            sys.stderr.write(text + "\n")
            self.last_print = time.monotonic()
        self.last = text

    def say(self, text: str) -> None:
        if self.tty and self.last:
            sys.stderr.write("\r" + " " * len(self.last) + "\r")
            self.last = ""
        click.echo(text)


@click.command()
@click.option("--records", default=300_000, show_default=True, help="Records to produce.")
@click.option("--partitions", default=6, show_default=True, help="Source partitions.")
@click.option("--value-size", default=400, show_default=True, help="Mean value size, bytes.")
@click.option("--delivery", type=click.Choice(["exactly-once", "at-least-once"]),
              default="exactly-once", show_default=True)
@click.option("--no-compaction", is_flag=True, help="Skip the compaction pass (no Spark).")
@click.option("--dir", "stack_dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path(".local-stack"), show_default=True,
              help="Reuse the stack `replicator local up` started here, if it runs.")
@click.option("--keep-stack", is_flag=True, help="Leave a stack the demo started running.")
@click.option("--timeout", default=900.0, show_default=True, help="Give up after seconds.")
@click.option("--seed", default=7, show_default=True, help="Seed of the sample data.")
@kafka_option
def demo(records: int, partitions: int, value_size: int, delivery: str, no_compaction: bool,
         stack_dir: Path, keep_stack: bool, timeout: float, seed: int, kafka: BrokerKind
         ) -> None:
    """Replicate a sample topic across two regions on the embedded stack and verify it.

    Starts (or reuses) two Kafka brokers (--kafka) and an S3+SQS endpoint, produces a realistic
    sample, runs egress, the bucket sync, ingress and one compaction pass, then compares
    the copy with the source record by record. Exit code 0 only on PASS.
    """
    if records < 1 or partitions < 1:
        raise click.UsageError("--records and --partitions must be at least 1")
    line = _StatusLine()
    options = DemoOptions(records=records, partitions=partitions, value_size=value_size,
                          delivery=delivery, compaction=not no_compaction,
                          stack_dir=stack_dir, keep_stack=keep_stack, timeout=timeout,
                          seed=seed, kafka=kafka)
    runner = Demo(options, say=line.say, status=line.status)
    configure_demo_logging(Path(stack_dir) / "demo.log")
    result = runner.run()
    line.status("")
    click.echo("")
    click.echo(render_summary(result))
    sys.exit(0 if result.passed else 1)
