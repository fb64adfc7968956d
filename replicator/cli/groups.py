"""``replicator groups show|sync``: source consumer groups translated into the destination
(docs/failover.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from ingress.checkpoints import KafkaCheckpointStore
from replicator.cli.common import (
    EXIT_FAILURE,
    READ_TIMEOUT,
    config_option,
    echo_json,
    fail,
    timeout_option,
)
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.errors import KafkaRetriableError, ReplicatorError, TopicError
from replicator.core.kafka import Admin, Producer
from replicator.core.metrics import Metrics, MetricsServer
from replicator.core.offset_map import MapPartition, OffsetMapEntry, map_key
from replicator.core.settings import IngressSettings, KafkaSettings
from replicator.core.topic_copy import read_topic_meta
from replicator.core.units import parse_duration
from replicator.core.wire import GroupExport, TopicMetadata
from replicator.ops.checkpoints import configured_sources
from replicator.ops.groups import (
    GroupMetrics,
    GroupRow,
    after_sync,
    plan,
    prunable,
    read_exports,
    read_offset_map,
    sync,
)


@click.group()
def groups() -> None:
    """Consumer-group offsets for a failover."""


@dataclass(frozen=True)
class Planned:
    """One read of the stores and the plan made from it."""

    rows: list[GroupRow]
    admin: Admin
    kafka: KafkaSettings
    map_topic: str
    exports: list[GroupExport]
    entries: dict[MapPartition, list[OffsetMapEntry]]


def _rows(config: Path, timeout: float = READ_TIMEOUT) -> list[GroupRow]:
    """The plan; fails the command (exit 1) when the stores cannot be read."""
    try:
        return _plan(config, timeout).rows
    except (ReplicatorError, ValueError) as e:
        fail(str(e), EXIT_FAILURE)


def _plan(config: Path, timeout: float = READ_TIMEOUT) -> Planned:
    """Read exports, offset map and checkpoints; plan every group (raises on failure)."""
    settings, store = settings_store(config)
    ingress: IngressSettings | None = settings.ingress
    if ingress is None:
        fail("ingress: section [ingress] is required by this command", 2)
    admin = Admin(settings.kafka, timeout=timeout)
    exports = read_exports(store, settings.s3.prefix, ingress)
    # The checkpoints before the map: ingress writes both in one transaction, so the map
    # read afterwards covers at least what these checkpoints say is replicated (read the
    # other way round, a running replication could move the checkpoints past the map's end).
    cps = KafkaCheckpointStore(settings.kafka, ingress.checkpoint_topic, Metrics(),
                               timeout=timeout).load_all()
    try:
        entries = read_offset_map(settings.kafka, ingress.offset_map_topic)
    except TopicError:
        entries = {}        # nothing replayed with a map yet: every row is "unmapped"
    sources = configured_sources(ingress, settings.s3.prefix, store)
    prefix = settings.s3.prefix

    def source_meta(region: str, topic: str) -> TopicMetadata | None:
        return read_topic_meta(store, prefix, region, topic)

    return Planned(plan(exports, sources, admin, entries, cps,
                        local_writes=ingress.mark_origin, source_meta=source_meta),
                   admin, settings.kafka, ingress.offset_map_topic, exports, entries)


def _prune(planned: Planned) -> int:
    """Tombstones for the map entries no exported group needs (``prunable``, from what the
    plan read); returns how many (raises on failure).
    """
    gone = prunable(planned.entries, planned.exports)
    if gone:
        producer = Producer(planned.kafka, name="offset-map pruning")
        for (region, topic, partition, destination), first in gone:
            producer.produce(planned.map_topic, None,
                             map_key(region, topic, partition, destination, first).encode())
        if producer.flush(30):
            raise KafkaRetriableError("offset-map tombstones not acknowledged within 30s")
        producer.check_deliveries("offset-map pruning")
    return len(gone)


def _print(rows: list[GroupRow]) -> None:
    if not rows:
        click.echo("no exported consumer groups for the configured sources yet")
        return

    def show(v: int | None) -> str | int:
        return "-" if v is None else v

    print_table(["group", "source", "partition", "destination", "source committed",
                 "translated", "replicated to", "destination committed", "state"],
                [[r.group, f"{r.region}/{r.topic}", r.partition, r.destination_topic,
                  r.source_committed, show(r.translated), show(r.replicated_to),
                  show(r.destination_committed), r.state] for r in rows])
    for r in rows:
        if r.reason:
            click.echo(f"{r.group} {r.region}/{r.topic}[{r.partition}]: {r.state}: {r.reason}")


def _report(done: Mapping[str, int | ReplicatorError], pruned: int | None) -> list[str]:
    """Print what a sync round committed and each group whose commit was refused; returns
    the refused groups.
    """
    refused = {g: r for g, r in done.items() if isinstance(r, ReplicatorError)}
    committed = {g: n for g, n in done.items() if isinstance(n, int)}
    click.echo(f"committed {sum(committed.values())} partition offset(s) of "
               f"{len(committed)} group(s)"
               + ("" if pruned is None else f"; pruned {pruned} offset-map entries"))
    for group, err in sorted(refused.items()):
        click.echo(f"group {group!r}: commit refused: {err}", err=True)
    return sorted(refused)


@groups.command("show")
@config_option
@timeout_option
@click.option("--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def show_cmd(config: Path, output: str, timeout: float) -> None:
    """Per group and source partition: the offset the group committed in the source, its
    translation into the destination, how far the partition is replicated, what the group
    has committed in the destination, and the state (synced, to sync, waiting for data,
    skipped: active, kept: destination ahead, unmapped, skipped: several sources).

    Reads the exported groups in the destination bucket, the offset map and checkpoint
    topics and the destination cluster's groups (an ingress config).
    """
    rows = _rows(config, timeout)
    if output == "json":
        echo_json([r.as_dict() for r in rows])
    else:
        _print(rows)


@groups.command("sync")
@config_option
@timeout_option
@click.option("--every", "every", default=None, metavar="DURATION",
              help="Sync again at this interval until interrupted (e.g. 30s), so groups "
                   "waiting for data follow replication.")
@click.option("--prune", is_flag=True,
              help="After syncing, delete (tombstone) the offset-map entries that end below "
                   "every exported group's offset on their partition (the newest entry of a "
                   "partition stays). A group exported later with an older offset is then "
                   "'unmapped' there.")
@click.option("--metrics-port", type=int, default=0, show_default=True,
              help="With --every: serve /metrics on this port (0: off); "
                   "replicator_groups_not_synced and replicator_groups_translation_lag "
                   "(docs/metrics.md).")
def sync_cmd(config: Path, every: str | None, prune: bool, metrics_port: int,
             timeout: float) -> None:
    """Commit the translated offsets in the destination cluster, once (or --every).

    Only for groups with no members there, only forward, only as far as the data is
    replicated (docs/failover.md). A group whose commit the broker refuses does not stop
    the others: each refused group is reported. Prints what it committed and the groups
    afterwards; exit 1 if a commit failed (with --every: reported, tried again at the next
    round).
    """
    interval = None
    if every is not None:
        try:
            interval = parse_duration(every).total_seconds()
        except ValueError as e:
            fail(f"--every: {e}", 2)
        if interval <= 0:
            fail(f"--every: must be positive, got {every!r}", 2)
    metrics = GroupMetrics(Metrics())
    if interval is not None and metrics_port:
        MetricsServer(metrics.registry, "0.0.0.0", metrics_port, healthy=lambda: True,
                      ready=lambda: True).start()
    while True:
        try:
            planned = _plan(config, timeout)
            done = sync(planned.rows, planned.admin)
            after = after_sync(planned.rows, done)
            pruned = _prune(planned) if prune else 0
        except (ReplicatorError, ValueError) as e:
            if interval is None:
                fail(str(e), EXIT_FAILURE)
            click.echo(f"sync failed, trying again in {every}: {e}", err=True)
            metrics.rounds.labels("failed").inc()
            time.sleep(interval)
            continue
        refused = _report(done, pruned if prune else None)
        metrics.rounds.labels("failed" if refused else "ok").inc()
        metrics.observe(after)
        if interval is None:
            _print(after)
            if refused:
                fail(f"{len(refused)} group(s) refused their commit: {', '.join(refused)}",
                     EXIT_FAILURE)
            return
        time.sleep(interval)
