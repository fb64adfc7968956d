"""Topics ingress needs in the destination cluster: the copies, the events and checkpoints.

A destination topic is created from the source's ``_topic.json`` (written by egress, parsed
by ``replicator.core.wire.TopicMetadata``) with the same partition count and the configs
``replicator.core.topic_copy`` copies, or grown when it has fewer partitions.
When the broker refuses to grow it, the source is stopped with an error naming both counts
(nothing is silently left unreplicated).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol

from ingress.metrics import IngressMetrics
from replicator.core.errors import ReplicatorError, TopicError
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
    if admin.create_topic(checkpoint_topic, 1, {"cleanup.policy": "compact"}):
        log.info("created checkpoint topic %s (compacted)", checkpoint_topic)


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


def check_sources(states: Iterable[SourceState], store: ObjectStore, admin: TopicAdmin,
                  prefix: str, metrics: IngressMetrics) -> frozenset[str]:
    """Read each source's ``_topic.json``, create or grow its destination topic.

    Returns:
        The destination topics whose sources are known and not stopped (the topics the
        placement consumer subscribes to).
    """
    states = list(states)
    by_dest: dict[str, list[tuple[SourceState, TopicMetadata]]] = {}
    for st in states:
        src = st.source
        try:
            meta = read_topic_meta(store, prefix, src.region, src.topic)
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
        by_dest.setdefault(src.destination, []).append((st, meta))
    for dest, items in by_dest.items():
        _ensure(admin, metrics, dest, items)
    return frozenset(st.source.destination for st in states
                     if st.partitions is not None and not st.stopped)


def _ensure(admin: TopicAdmin, metrics: IngressMetrics, dest: str,
            items: list[tuple[SourceState, TopicMetadata]]) -> None:
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
        if st.partitions != meta.partitions:
            log.info("source %s/%s has %d partition(s) -> %s", src.region, src.topic,
                     meta.partitions, dest)
        st.partitions = meta.partitions
