"""What every entry point shares: loading settings, exit codes, signal handling."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol

import click

from replicator.cli.logs import setup_logging
from replicator.core.errors import ConfigError, FatalError, ReplicatorError
from replicator.core.kafka import Admin
from replicator.core.kafka.auth import not_admitted
from replicator.core.settings import KafkaSettings, Settings, load_settings
from replicator.ops.doctor.kafka import bootstrap_addresses, broker_causes

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


KAFKA_RETRY_SECONDS = 5.0
"""How often a service that cannot reach its cluster at start asks again, and says so (one
ERROR per attempt: 12 a minute instead of librdkafka's several a second)."""
KAFKA_REQUEST_SECONDS = 5.0
"""How long one of those metadata requests may take; a SIGTERM is seen within it. A broker
that answers late (frozen, overloaded) answers the request still waiting, so the service
starts as soon as it can."""


class MetadataSource(Protocol):
    """What ``wait_for_kafka`` asks (``replicator.core.kafka.Admin``)."""

    def list_topics(self) -> list[str]: ...
    def client_errors(self) -> list[str]: ...


def wait_for_kafka(kafka: KafkaSettings, what: str, stopping: threading.Event, *,
                   every: float = KAFKA_RETRY_SECONDS,
                   request_timeout: float = KAFKA_REQUEST_SECONDS,
                   admin: MetadataSource | None = None) -> bool:
    """Block until the cluster answers a metadata request; ``False`` when ``stopping`` is
    set first.

    Each failed attempt is one ERROR naming every bootstrap broker and the client's reason
    ("cannot reach Kafka at 127.0.0.1:9092: Connect to ... failed: Connection refused; egress
    not started, retrying every 5s"), at most one per ``every`` seconds, so a service never
    says it started before it reached its cluster.

    A client the brokers refuse to admit (authentication failed, a TLS certificate either
    side does not accept) is not retried: every broker that answered refused it, so the
    service exits 2 with one ERROR naming its principal and the cause (``not_admitted``).

    Raises:
        ConfigError: the client refuses ``kafka.config``, or the brokers refuse its identity.
    """
    if admin is None:
        admin = Admin(kafka, timeout=request_timeout, collect_errors=True)
    addresses = bootstrap_addresses(kafka.brokers)
    failures = 0
    while not stopping.is_set():
        began = time.monotonic()
        try:
            admin.list_topics()
        except ReplicatorError as e:
            if stopping.is_set():
                break
            failures += 1
            causes = broker_causes(addresses, admin.client_errors())
            refused = {a: r for a, c in causes.items()
                       if (r := not_admitted(c, kafka.config)) is not None}
            if refused and len(refused) == len(causes):
                # Every broker that answered refused this identity: retrying cannot help
                # (a wrong password, an untrusted or expired certificate). Exit 2, once.
                where = "; ".join(f"{a}: {r.cause}" for a, r in refused.items())
                raise ConfigError("kafka.config", f"{what} not started: Kafka at {where}; "
                                  f"{next(iter(refused.values())).fix}") from e
            where = "; ".join(f"{a}: {causes.get(a, 'no answer')}" for a in addresses) \
                if causes else f"{', '.join(addresses)}: {e}"
            log.error("cannot reach Kafka at %s; %s not started, retrying every %.0fs", where,
                      what, every)
            stopping.wait(max(0.0, every - (time.monotonic() - began)))
            continue
        if failures:
            log.info("reached Kafka at %s after %d failed attempt(s)", kafka.brokers, failures)
        return True
    return False


def run_controller(config: Path, section: str, build: Callable[[Settings], Controller]) -> None:
    """Load settings, wait for the Kafka cluster (egress, ingress), start the controller, run
    until SIGTERM/SIGINT, exit 0/1/2.
    """
    settings = load_or_exit(config, section)
    setup_logging(settings.log.level, settings.log.format)
    log.info("starting %s with settings %s", section, json.dumps(settings.masked()))
    try:
        controller = build(settings)
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, draining", signal.Signals(signum).name)
        stopping.set()
        controller.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        # Compaction reads and writes S3 only.
        if section != "compaction" and not wait_for_kafka(settings.kafka, section, stopping):
            log.info("%s stopped before it reached Kafka", section)
            controller.close()
            sys.exit(EXIT_OK)
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

READ_TIMEOUT = 30.0
"""Seconds a read command waits for each Kafka request by default (``--timeout``)."""

timeout_option = click.option(
    "--timeout", "timeout", type=click.FloatRange(min=0.5), default=READ_TIMEOUT,
    show_default=True, help="Seconds each request to Kafka may take; a cluster that does "
                            "not answer within it fails the command (exit 1) naming it.")
