"""``replicator topics``: the topics a config replicates, and how far."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from egress.selection import select
from ingress.checkpoints import KafkaCheckpointStore
from replicator.cli.common import EXIT_FAILURE, config_option, echo_json, fail, timeout_option
from replicator.cli.stores import settings_store
from replicator.cli.tables import print_table
from replicator.core.clock import utc_now
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSettings, Settings
from replicator.ops.topics import describe_rate, egress_report, ingress_report, throttles


def own_topics(settings: Settings) -> set[str]:
    """The replicator's own topics, which (as in egress) no pattern selects."""
    fields = IngressSettings.model_fields
    own = {str(fields["checkpoint_topic"].default), str(fields["segment_events_topic"].default)}
    if settings.ingress is not None:
        own |= {settings.ingress.checkpoint_topic, settings.ingress.segment_events_topic}
    return own


@click.command()
@config_option
@timeout_option
@click.option("--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def topics(config: Path, output: str, timeout: float) -> None:
    """The topics a config replicates: [egress] and/or [ingress].

    Egress: the selected topics (tables and what [egress.select] matches now), partition
    counts, the egress group's committed positions and the lag behind the partitions'
    ends. Ingress: the sources (named, or found by topic_pattern in the bucket), their
    destination topics, partition counts (_topic.json), partitions with a checkpoint, the
    lag behind the newest segments and the age of the newest egress heartbeat ([egress.topics]
    heartbeat_interval; "-": none written). Both: the byte-rate limit of each process
    ([egress] / [ingress] max_bytes_per_second).
    """
    settings, store = settings_store(config)
    if settings.egress is None and settings.ingress is None:
        fail("egress: give a config with an [egress] or an [ingress] section", 2)
    out: dict[str, object] = {"region": settings.region}
    limits = throttles(settings)
    out["max_bytes_per_second"] = limits
    try:
        if settings.egress is not None:
            eg = settings.egress
            selected = select(Admin(settings.kafka, timeout=timeout).list_topics(),
                              eg.select.include, eg.select.exclude, eg.topics,
                              own_topics(settings))
            erows = egress_report(settings.region, settings.kafka, eg.group_id, sorted(selected),
                                  timeout=timeout)
            out["egress"] = [r.as_dict() for r in erows]
        if settings.ingress is not None:
            cps = KafkaCheckpointStore(settings.kafka, settings.ingress.checkpoint_topic,
                                       Metrics(), timeout=timeout).load_all()
            irows = ingress_report(settings.ingress, settings.s3.prefix, store, cps)
            out["ingress"] = [r.as_dict() for r in irows]
    except ReplicatorError as e:
        fail(str(e), EXIT_FAILURE)
    if output == "json":
        echo_json(out)
        return
    if settings.egress is not None:
        click.echo(f"egress, region {settings.region}, group {settings.egress.group_id}, "
                   f"reads from the source: {describe_rate(limits['egress'])}:")
        print_table(["topic", "partitions", "committed (sum)", "end (sum)", "lag", "state"],
                    [[r.topic, "-" if r.partitions is None else r.partitions,
                      sum(c or 0 for c in r.committed.values()), sum(r.ends.values()),
                      "-" if r.lag is None else r.lag, r.state] for r in erows])
    if settings.ingress is not None:
        click.echo(f"ingress, region {settings.region}, produces into the destination: "
                   f"{describe_rate(limits['ingress'])}:")
        now = utc_now()
        print_table(["source", "found by", "destination", "partitions", "checkpointed",
                     "lag", "state", "heartbeat"],
                    [[f"{r.region}/{r.topic}", r.found_by, r.destination,
                      "-" if r.partitions is None else r.partitions, r.checkpointed, r.lag,
                      r.state, heartbeat_age(r.heartbeat, now)] for r in irows])


def heartbeat_age(at: datetime | None, now: datetime) -> str:
    """``"42s ago"`` for the newest egress heartbeat, ``"-"`` when egress writes none."""
    if at is None:
        return "-"
    return f"{max(0, round((now - at).total_seconds()))}s ago"
