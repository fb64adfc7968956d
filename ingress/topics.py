"""Topics ingress needs in the destination cluster: the copies, the events and checkpoints.

A destination topic is created from the source's ``_topic.json`` (written by egress, parsed
by ``replicator.core.wire.TopicMetadata``) with the same partition count and the configs
``replicator.core.topic_copy`` copies, or grown when it has fewer partitions.
When the broker refuses to grow it, the source is stopped with an error naming both counts
(nothing is silently left unreplicated).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol

from ingress.metrics import IngressMetrics
from replicator.core.compacted_topic import ensure_compacted_topic
from replicator.core.errors import ReplicatorError, RetriableError, TopicError
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import (
    copied_configs,
    existing_partitions,
    read_topic_meta,
)
from replicator.core.wire import TopicMetadata

log = logging.getLogger(__name__)

TopicStep = Literal["create", "grow", "ok"]


def destination_step(existing: int | None, wanted: int) -> TopicStep:
    """What to do with a destination topic that has ``existing`` partitions (None: absent)."""
    if existing is None:
        return "create"
    return "grow" if existing < wanted else "ok"


class TopicAdmin(Protocol):
    """The admin operations used here (``replicator.core.kafka.Admin``)."""

    def list_topics(self) -> list[str]: ...
    def partition_count(self, topic: str) -> int | None: ...
    def create_topic(self, topic: str, partitions: int, config: Mapping[str, str] | None = None,
                     *, replication_factor: int = -1) -> bool: ...
    def grow_topic(self, topic: str, partitions: int) -> None: ...
    def effective_topic_config(self, topic: str) -> dict[str, str]: ...
    def alter_topic_config(self, topic: str, configs: Mapping[str, str]) -> None: ...
    def topic_id(self, topic: str) -> str | None: ...


def ensure_destination(admin: TopicAdmin, topic: str, partitions: int,
                       configs: Mapping[str, str]) -> int:
    """Make ``topic`` exist with at least ``partitions`` partitions; returns its count.

    Raises:
        TopicError: it has fewer partitions and cannot be grown (message names both).
    """
    existing = existing_partitions(admin, topic)
    step = destination_step(existing, partitions)
    if step == "create":
        conf = copied_configs(configs)
        if admin.create_topic(topic, partitions, conf):
            log.info("created destination topic %s with %d partition(s), configs %s", topic,
                     partitions, conf)
            return partitions
        existing = existing_partitions(admin, topic)  # created concurrently by another instance
        step = destination_step(existing, partitions)
    if step == "grow":
        try:
            admin.grow_topic(topic, partitions)
        except TopicError as e:
            raise TopicError(f"destination topic {topic} has {existing} partition(s) but the "
                             f"source has {partitions}, and the broker refused to add "
                             f"partitions: {e}") from e
        log.info("grew destination topic %s from %s to %d partition(s)", topic, existing,
                 partitions)
        return partitions
    assert existing is not None
    return existing


def _limit(value: str) -> float | None:
    """A retention or size config as a number (-1: unlimited), ``None`` if unparsable."""
    try:
        n = int(value)
    except ValueError:
        return None
    return float("inf") if n < 0 else float(n)


def config_mismatches(source: Mapping[str, str], destination: Mapping[str, str]
                      ) -> dict[str, str]:
    """Destination configs that can lose what the source keeps, by config name → why.

    ``source``: the configs set on the source topic (``_topic.json``); ``destination``: the
    destination topic's effective configs (its defaults included). A config absent on
    either side is not compared (the source cluster's defaults are not known here).

    * ``cleanup.policy`` differs: compaction drops older values the source keeps, or
      deletion by retention drops keys a compacted source keeps;
    * ``retention.ms`` / ``retention.bytes`` shorter than the source's (``-1``: unlimited),
      when the destination deletes by retention;
    * ``max.message.bytes`` smaller than the source's: larger records are refused;
    * ``message.timestamp.type`` = ``LogAppendTime``: the broker overwrites the replayed
      timestamps.
    """
    out: dict[str, str] = {}
    s_policy, d_policy = source.get("cleanup.policy"), destination.get("cleanup.policy")
    if s_policy is not None and d_policy is not None and \
            {p.strip() for p in s_policy.split(",")} != {p.strip() for p in d_policy.split(",")}:
        out["cleanup.policy"] = f"source {s_policy}, destination {d_policy}"
    deletes = d_policy is None or "delete" in d_policy
    for name in ("retention.ms", "retention.bytes", "max.message.bytes"):
        if name != "max.message.bytes" and not deletes:
            continue
        s_v, d_v = source.get(name), destination.get(name)
        if s_v is None or d_v is None:
            continue
        s_n, d_n = _limit(s_v), _limit(d_v)
        if s_n is not None and d_n is not None and d_n < s_n:
            out[name] = f"source {s_v}, destination {d_v}"
    if destination.get("message.timestamp.type") == "LogAppendTime":
        out["message.timestamp.type"] = ("destination LogAppendTime: the broker overwrites "
                                         "the replayed timestamps")
    return out


def aligned_configs(source: Mapping[str, str], problems: Iterable[str]) -> dict[str, str]:
    """The destination configs that fix ``problems`` (``config_mismatches``' names): the
    source's value, and ``CreateTime`` for the timestamp type.
    """
    return {name: "CreateTime" if name == "message.timestamp.type" else source[name]
            for name in sorted(problems)}


def check_destination_configs(admin: TopicAdmin, metrics: IngressMetrics, dest: str,
                              source: SourceState, meta: TopicMetadata, *,
                              align: bool = False) -> None:
    """Compare ``dest`` with the source's configs at start and whenever ``_topic.json``
    changes (and at every check while a mismatch lasts): ERROR (once per mismatch) and
    ``…_destination_config_mismatch{topic, config}`` = 1 for each config that can lose
    data; 0 once it is fixed.
    """
    seen = tuple(sorted(meta.configs.items()))
    changed = source.configs_checked != seen
    if not changed and not source.config_problems:
        return
    problems = config_mismatches(meta.configs, admin.effective_topic_config(dest))
    if problems and align:
        fix = aligned_configs(meta.configs, problems)
        admin.alter_topic_config(dest, fix)
        log.warning("destination topic %s: configs aligned with source %s/%s "
                    "(ingress.align_destination_configs): %s", dest, source.source.region,
                    source.source.topic, fix)
        problems = config_mismatches(meta.configs, admin.effective_topic_config(dest))
    for name in sorted(set(problems) | source.config_problems):
        bad = name in problems
        metrics.destination_config_mismatch.labels(topic=dest, config=name).set(int(bad))
        if bad and (changed or name not in source.config_problems):
            log.error("destination topic %s: %s can lose data of source %s/%s (%s); set it "
                      "on the destination like the source", dest, name, source.source.region,
                      source.source.topic, problems[name])
    source.config_problems = frozenset(problems)
    source.configs_checked = seen


def ensure_internal_topics(admin: TopicAdmin, *, events_topic: str,
                           events_retention: timedelta, checkpoint_topic: str) -> None:
    """Create the segment-events (delete, retention) and checkpoint (compact) topics."""
    retention_ms = str(int(events_retention.total_seconds() * 1000))
    # One partition each: both are small; one partition keeps every event and checkpoint
    # reader to a single fetch stream (existing topics with more partitions also work).
    if admin.create_topic(events_topic, 1, {"cleanup.policy": "delete",
                                            "retention.ms": retention_ms}):
        log.info("created segment events topic %s (retention %s)", events_topic,
                 events_retention)
    ensure_compacted_topic(admin, checkpoint_topic, "checkpoint topic")


# --- sources and their destinations -----------------------------------------------------


@dataclass
class SourceState:
    """One configured source as the controller sees it.

    ``partitions`` is ``None`` until its ``_topic.json`` was read; ``stopped`` says why the
    source is not replayed (its destination cannot get enough partitions).
    """

    source: IngressSourceSettings
    partitions: int | None = None
    stopped: str | None = None
    warned_missing: float = 0.0
    configs_checked: tuple[tuple[str, str], ...] | None = None
    config_problems: frozenset[str] = frozenset()
    config_check_failed: bool = False


def check_sources(states: Iterable[SourceState], store: ObjectStore, admin: TopicAdmin,
                  prefix: str, metrics: IngressMetrics, *, align: bool = False
                  ) -> frozenset[str]:
    """Read each source's ``_topic.json``, create or grow its destination topic, compare
    an existing one's configs (and ``align`` them when it has a single source).

    Returns:
        The destination topics whose sources are known and not stopped (the topics the
        placement consumer subscribes to).
    """
    states = list(states)
    by_dest: dict[str, list[tuple[SourceState, TopicMetadata]]] = {}
    for st in states:
        src = st.source
        try:
            meta = read_topic_meta(store, prefix, src.region, src.name)
        except ReplicatorError as e:
            log.error("source %s/%s: cannot read its _topic.json: %s", src.region,
                      src.topic, e)
            continue
        if meta is None:
            if time.monotonic() - st.warned_missing > 60 or not st.warned_missing:
                log.warning("source %s/%s: no %s/%s/%s/_topic.json yet (egress writes it); "
                            "waiting before replay", src.region, src.topic, prefix,
                            src.region, src.topic)
                st.warned_missing = time.monotonic()
            continue
        # Every partition any incarnation had is replayed (a topic recreated with fewer
        # partitions: the earlier one's higher partitions still have a tail to replay).
        meta = dataclasses.replace(meta, partitions=meta.partitions_ever)
        by_dest.setdefault(src.destination, []).append((st, meta))
    for dest, items in by_dest.items():
        _ensure(admin, metrics, dest, items, align=align and len(items) == 1)
    return frozenset(st.source.destination for st in states
                     if st.partitions is not None and not st.stopped)


def _ensure(admin: TopicAdmin, metrics: IngressMetrics, dest: str,
            items: list[tuple[SourceState, TopicMetadata]], *, align: bool = False) -> None:
    """Give ``dest`` the partitions of its largest source (several sources may feed one
    topic); a source it cannot serve is stopped, the others go on.
    """
    largest = max(items, key=lambda it: it[1].partitions)[1]
    try:
        ensure_destination(admin, dest, largest.partitions, largest.configs)
        have: int | None = largest.partitions
        refused: TopicError | None = None
    except TopicError as e:
        have, refused = existing_partitions(admin, dest), e
    except ReplicatorError as e:
        log.error("cannot prepare destination topic %s, retrying: %s", dest, e)
        return
    for st, meta in items:
        src = st.source
        if refused is not None and (have is None or meta.partitions > have):
            if st.stopped is None:
                # Checked again every topic_check_interval: it resumes once an operator
                # gave the topic enough partitions.
                log.error("source %s/%s STOPPED: destination topic %s has %s partition(s) "
                          "but the source has %d: %s", src.region, src.topic, dest, have,
                          meta.partitions, refused)
                metrics.source_errors.labels(region=src.region, topic=src.topic,
                                             reason="partitions").inc()
                metrics.source_stopped.labels(region=src.region, topic=src.topic).set(1)
            st.stopped = f"{dest} has {have} partition(s), the source {meta.partitions}"
            continue
        if st.stopped is not None:
            log.info("source %s/%s resumed: %s has enough partitions now", src.region,
                     src.topic, dest)
            st.stopped = None
            metrics.source_stopped.labels(region=src.region, topic=src.topic).set(0)
        try:
            check_destination_configs(admin, metrics, dest, st, meta, align=align)
            st.config_check_failed = False
        except ReplicatorError as e:
            # A topic just created may not be known yet to the broker asked for its configs
            # (Unknown topic or partition): the first failure of a never-compared topic is
            # routine, a second one in a row is not.
            first = (isinstance(e, RetriableError) and st.configs_checked is None
                     and not st.config_check_failed)
            log.log(logging.INFO if first else logging.ERROR,
                    "cannot compare the configs of destination topic %s with source %s/%s, "
                    "retrying%s: %s", dest, src.region, src.topic,
                    " (a topic just created may not be known to every broker yet)"
                    if first else "", e)
            st.config_check_failed = True
        if st.partitions != meta.partitions:
            log.info("source %s/%s has %d partition(s) -> %s", src.region, src.topic,
                     meta.partitions, dest)
        st.partitions = meta.partitions
