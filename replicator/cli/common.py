"""What every entry point shares: loading settings, exit codes, signal handling."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol

import click

from replicator.cli.logs import setup_logging
from replicator.core.errors import ConfigError, FatalError, ReplicatorError
from replicator.core.settings import Settings, load_settings

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class Controller(Protocol):
    """What the CLIs drive: ``start`` fails fast, ``run`` blocks, ``stop`` is signal-safe."""

    def start(self) -> None: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


def fail(message: str, code: int) -> NoReturn:
    """Print an error to stderr and exit with ``code``."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


KAFKA_OPTION_HELP = (
    "Kafka brokers of the embedded stack: tansu (pip-installed, the default) or apache "
    "(Apache Kafka from the distribution in $KAFKA_HOME, KRaft, topic auto-creation off; "
    "extra broker settings from $KAFKA_EXTRA_PROPS, one key=value a line).")


def kafka_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--kafka tansu|apache`` (the embedded stack's brokers), checked before anything runs:
    ``apache`` without a usable ``$KAFKA_HOME`` exits 2 naming it.
    """
    from replicator.devstack.processes import BROKER_KINDS, DEFAULT_BROKER, check_broker_kind

    def check(ctx: click.Context, param: click.Parameter, value: str) -> str:
        try:
            return check_broker_kind(value)
        except FatalError as e:
            raise click.BadParameter(str(e), ctx, param) from e

    return click.option("--kafka", type=click.Choice(BROKER_KINDS), default=DEFAULT_BROKER,
                        show_default=True, callback=check, help=KAFKA_OPTION_HELP)(f)


def load_or_exit(config: Path | None, section: str | None = None) -> Settings:
    """Load settings; exit 2 naming the key on any configuration problem."""
    try:
        settings = load_settings(config)
        if section is not None:
            settings.require(section)  # type: ignore[arg-type]
        return settings
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)


def run_controller(config: Path, section: str, build: Callable[[Settings], Controller]) -> None:
    """Load settings, start the controller, run until SIGTERM/SIGINT, exit 0/1/2."""
    settings = load_or_exit(config, section)
    setup_logging(settings.log.level, settings.log.format)
    log.info("starting %s with settings %s", section, json.dumps(settings.masked()))
    try:
        controller = build(settings)
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, draining", signal.Signals(signum).name)
        controller.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        controller.start()
        controller.run()
    except ConfigError as e:
        log.error("%s", e)
        controller.close()
        sys.exit(EXIT_USAGE)
    except (FatalError, ReplicatorError) as e:
        log.error("%s stopped: %s", section, e, exc_info=True)
        controller.close()
        sys.exit(EXIT_FAILURE)
    controller.close()
    log.info("%s stopped cleanly", section)
    sys.exit(EXIT_OK)


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON (``--output json``)."""
    click.echo(json.dumps(data, indent=2, default=str))


config_option = click.option(
    "--config", "config", type=click.Path(path_type=Path, dir_okay=False), required=True,
    envvar="REPLICATOR_CONFIG", help="TOML settings file (keys: docs/configuration.md).")
