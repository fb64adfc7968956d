"""``replicator doctor``: check everything a region's config depends on, before a service
starts (docs/operator-commands.md; the checks live in ``replicator.ops.doctor``).
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from egress.mirror import mirror_destination
from egress.selection import select
from ingress.checkpoints import KafkaCheckpointStore
from ingress.sink import transaction_timeout_ms
from ingress.transactions import TransactionLoop
from replicator.cli.common import EXIT_USAGE, config_option, echo_json, fail, load_or_exit
from replicator.cli.tables import print_table
from replicator.cli.topics import own_topics
from replicator.core.errors import ConfigError, ReplicatorError
from replicator.core.kafka import Admin, Producer
from replicator.core.metrics import Metrics
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import Settings
from replicator.core.sqs import SqsQueue
from replicator.core.wire import Checkpoint
from replicator.ops.doctor import Check, Status, exit_code, overall
from replicator.ops.doctor.acls import acl_checks
from replicator.ops.doctor.compaction import compaction_checks
from replicator.ops.doctor.kafka import REACH, kafka_checks
from replicator.ops.doctor.s3 import BUCKET, mirror_check, s3_checks
from replicator.ops.doctor.sources import refused_checks, source_checks
from replicator.ops.doctor.sqs import sqs_checks


def used_transaction_timeout(settings: Settings) -> tuple[int, str] | None:
    """The ``transaction.timeout.ms`` exactly-once ingress gives its producers, and where it
    comes from (``None`` for a config without exactly-once ingress).

    Raises:
        ConfigError: ``kafka.config`` gives one that is not a number.
    """
    if settings.ingress is None or settings.ingress.delivery != "exactly-once":
        return None
    given = settings.kafka.config.get("transaction.timeout.ms")
    if given is not None:
        try:
            return int(str(given)), "kafka.config"
        except ValueError as e:
            raise ConfigError("kafka.config", f"transaction.timeout.ms = {given!r} is not a "
                                              "whole number of milliseconds") from e
    # The producers' flush/commit timeout (TransactionLoop's default), as ingress computes it.
    call_timeout = inspect.signature(TransactionLoop).parameters["timeout"].default
    return transaction_timeout_ms(float(call_timeout)), "ingress default"


def _passed(checks: Sequence[Check], name: str) -> bool:
    return any(c.name == name and c.status is Status.PASS for c in checks)


def permission_checks(admin: Admin, settings: Settings,
                      selected: Callable[[Sequence[str]], frozenset[str]],
                      timeout: float) -> list[Check]:
    """What the config's principal may do on the topics and groups the services use
    (``replicator.ops.doctor.acls``).
    """
    try:
        present = sorted(admin.topic_partitions())
    except ReplicatorError:
        return []                # the cluster stopped answering: reported above

    def init_transactions(transactional_id: str) -> None:
        Producer(settings.kafka, transactional_id=transactional_id,
                 name="doctor").init_transactions(timeout)

    return acl_checks(admin, settings,
                      selected(present) if settings.egress is not None else (),
                      init_transactions=init_transactions)


CONTROLLERS = ("egress", "ingress", "compaction")


def only_controller(settings: Settings, controller: str) -> Settings:
    """``settings`` with the sections of the other controllers taken out, so the checks
    (permissions included) are those of ``controller`` alone: what its own credentials
    must pass where the region's one config file holds every section.

    Raises:
        ConfigError: the config has no ``[controller]`` section.
    """
    if getattr(settings, controller) is None:
        raise ConfigError("--only", f"the config has no [{controller}] section")
    return settings.model_copy(update={c: None for c in CONTROLLERS if c != controller})


def mirror_checks(settings: Settings) -> list[Check]:
    """HeadBucket on the low-RPO mirror's destination bucket with the mirror's client
    (``[egress.mirror]``; nothing when it is off). Nothing is written there.
    """
    destination = mirror_destination(settings)
    mirror = settings.egress.mirror if settings.egress is not None else None
    if destination is None or mirror is None:
        return []
    try:
        head = destination.head_bucket()
    except ReplicatorError as e:
        return [mirror_check(mirror.bucket, mirror.region, None, e)]
    return [mirror_check(mirror.bucket, mirror.region, head, None)]


def run_checks(settings: Settings, timeout: float) -> list[Check]:
    """Every check of ``settings``: Kafka (unless the config is compaction's alone, which
    uses no Kafka), S3, ingress's sources (their ``_topic.json`` against the destination
    topics) and SQS (with ``[ingress]``), compaction (with ``[compaction]``).

    Raises:
        ConfigError: a client refuses the configuration (``kafka.config``).
    """
    uses_kafka = settings.egress is not None or settings.ingress is not None
    admin = Admin(settings.kafka, timeout=timeout, collect_errors=True) if uses_kafka else None

    def selected(topics: Sequence[str]) -> frozenset[str]:
        eg = settings.require("egress")
        return select(topics, eg.select.include, eg.select.exclude, eg.topics,
                      own_topics(settings))

    checks: list[Check] = []
    if admin is not None:
        checks = kafka_checks(admin, settings, select=selected,
                              transaction_timeout=used_transaction_timeout(settings))
        if _passed(checks, REACH):
            checks += permission_checks(admin, settings, selected, timeout)
    queue_ref: tuple[str, str] | None = None
    sqs: list[Check] = []
    if settings.ingress is not None:
        queue = SqsQueue.from_settings(settings)
        sqs, arn = sqs_checks(queue)
        queue_ref = None if arn is None else (queue.name, arn)
    store = S3ObjectStore.from_settings(settings)
    s3 = s3_checks(store, store, settings, queue=queue_ref)
    checks += s3
    checks += mirror_checks(settings)
    if admin is not None and settings.ingress is not None and _passed(checks, REACH) \
            and _passed(s3, BUCKET):
        try:
            partitions = admin.topic_partitions()
        except ReplicatorError:
            partitions = None       # the cluster stopped answering: reported above
        if partitions is not None:
            checks += source_checks(settings.ingress, settings.s3.prefix, store, partitions)
            ingress = settings.ingress

            def checkpoints() -> dict[str, Checkpoint]:
                return KafkaCheckpointStore(settings.kafka, ingress.checkpoint_topic,
                                            Metrics(), timeout=max(timeout, 10.0)).load_all()

            checks += refused_checks(ingress, settings.s3.prefix, store, checkpoints)
    checks += sqs
    if settings.compaction is not None:
        checks += compaction_checks(settings.compaction, java_home=os.environ.get("JAVA_HOME"),
                                    timeout=timeout)
    return checks


SEEN_WIDTH = 60
FIX_WIDTH = 60
"""Columns the seen and fix texts are wrapped to, so the table stays readable in a
terminal (the JSON output has them whole)."""


def table_rows(checks: Sequence[Check]) -> list[list[str]]:
    """One row per check, long seen and fix texts wrapped onto the rows below it."""
    rows: list[list[str]] = []
    for c in checks:
        seen = textwrap.wrap(c.seen, SEEN_WIDTH, break_on_hyphens=False) or [""]
        fix = textwrap.wrap(c.fix, FIX_WIDTH, break_on_hyphens=False) or [""]
        for i, (s, f) in enumerate(itertools.zip_longest(seen, fix, fillvalue="")):
            rows.append([c.name if i == 0 else "", c.status.value if i == 0 else "", s, f])
    return rows


@click.command()
@config_option
@click.option("--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="Seconds each dependency may take to answer (a broker that does not "
                   "answer within it is reported unreachable).")
@click.option("--only", type=click.Choice(CONTROLLERS), default=None,
              help="Check only what this controller depends on, permissions included, "
                   "with that controller's credentials where the config holds every "
                   "section: in its pod, e.g. `kubectl exec deploy/replicator-egress -- "
                   "replicator doctor --only egress --config /etc/replicator/config.toml`, "
                   "or before the first start the Jobs of deploy/k8s/components/doctor "
                   "(docs/operations.md).")
def doctor(config: Path, output: str, timeout: float, only: str | None) -> None:
    """Check what a region's config depends on: Kafka, S3, SQS, Spark.

    Kafka: the brokers answer (or why not, per bootstrap address), the cluster id, the
    topics [egress] names or selects and their partitions, ingress's checkpoint,
    segment-events and offset-map topics and their cleanup.policy, topic auto-creation,
    transaction.max.timeout.ms against what exactly-once ingress uses. S3: the bucket,
    versioning, a temporary object put/head/get/delete under s3.temp_prefix, the bucket's
    notification to ingress's queue, this host's clock against S3's. Permissions: what the
    config's principal may do on those topics and groups, idempotent write and (exactly-once)
    the transactional-id prefix, against docs/security.md. Ingress: each source's
    _topic.json against its destination topic, and partitions stopped at a record their
    destination refuses. SQS: the queue and its visibility timeout. Compaction: the Spark
    master and Java.

    One line per check (PASS, WARN or FAIL, what was seen, the fix). Exit code 0 when
    nothing failed, 1 when a check failed, 2 for a configuration that does not load.
    """
    settings = load_or_exit(config)
    try:
        if only is not None:
            settings = only_controller(settings, only)
        checks = run_checks(settings, timeout)
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    status = overall(checks)
    if output == "json":
        echo_json({"region": settings.region, "status": status.value,
                   "checks": [c.as_dict() for c in checks]})
    else:
        print_table(["check", "status", "seen", "fix"], table_rows(checks))
        counts = {s: sum(c.status == s for c in checks) for s in ("PASS", "WARN", "FAIL")}
        click.echo(f"{status.value}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    sys.exit(exit_code(checks))
