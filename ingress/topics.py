"""Topics ingress needs in the destination cluster: the copies, the events and checkpoints.

A destination topic is created from the source's ``_topic.json`` (written by egress) with
the same partition count and the copied configs, or grown when it has fewer partitions.
When the broker refuses to grow it, the source is stopped with an error naming both counts
(nothing is silently left unreplicated).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, Protocol

from replicator.core.errors import ObjectNotFound, TopicError
from replicator.core.keys import TOPIC_META_CONFIGS, topic_meta_key
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

# Source configs copied to the destination topic. Not ``message.timestamp.type``: with
# LogAppendTime the destination broker would overwrite the replayed timestamps (a
# LogAppendTime source keeps its broker time as CreateTime in the copy).
COPIED_CONFIGS = TOPIC_META_CONFIGS - {"message.timestamp.type"}


@dataclass(frozen=True)
class TopicMeta:
    """What ``_topic.json`` says about a source topic."""

    partitions: int
    configs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> TopicMeta:
        """Parse ``_topic.json``.

        Raises:
            TopicError: not JSON, or no positive ``partitions``.
        """
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise TopicError(f"{where} is not JSON: {e}") from e
        parts = doc.get("partitions") if isinstance(doc, dict) else None
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
            raise TopicError(f"{where}: 'partitions' must be a positive int, got {parts!r}")
        configs = doc.get("configs", {})
        if configs is None:
            configs = {}
        if not isinstance(configs, dict):
            raise TopicError(f"{where}: 'configs' must be an object")
        return cls(parts, {str(k): str(v) for k, v in configs.items()})


def read_topic_meta(store: ObjectStore, prefix: str, region: str, topic: str
                    ) -> TopicMeta | None:
    """The source's ``_topic.json``, or ``None`` while egress has not written it."""
    key = topic_meta_key(prefix, region, topic)
    try:
        data = store.get(key)
    except ObjectNotFound:
        return None
    return TopicMeta.parse(data, where=f"s3://{store.bucket}/{key}")


def copied_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """The configs of ``configs`` that a destination copy takes over."""
    return {k: v for k, v in sorted(configs.items()) if k in COPIED_CONFIGS}


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


def existing_partitions(admin: TopicAdmin, topic: str) -> int | None:
    """Partition count of ``topic``, or ``None`` if it does not exist."""
    # A metadata request naming an unknown topic makes some brokers (Tansu; Apache Kafka
    # with auto.create.topics.enable, its default) create it with their default partition
    # count, so look at the full topic list first: right on every broker.
    if topic not in admin.list_topics():
        return None
    return admin.partition_count(topic)


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
