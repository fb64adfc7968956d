"""A copy of a source topic: its ``_topic.json`` read from a bucket, and the configs a copy
takes over (docs/architecture.md, "Topic metadata").

Shared by ingress (destination topics) and ``replicator restore`` (restored topics), so
both create copies by the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from replicator.core.errors import ObjectNotFound
from replicator.core.keys import topic_meta_key
from replicator.core.storage import ObjectStore
from replicator.core.wire import TOPIC_META_CONFIGS, TopicMetadata

# Source configs copied to a copy of the topic. Not ``message.timestamp.type``: with
# LogAppendTime the copy's broker would overwrite the replayed timestamps (a
# LogAppendTime source keeps its broker time as CreateTime in the copy).
COPIED_CONFIGS = TOPIC_META_CONFIGS - {"message.timestamp.type"}


def read_topic_meta(store: ObjectStore, prefix: str, region: str, topic: str
                    ) -> TopicMetadata | None:
    """The source's ``_topic.json``, or ``None`` while egress has not written it."""
    key = topic_meta_key(prefix, region, topic)
    try:
        data = store.get(key)
    except ObjectNotFound:
        return None
    return TopicMetadata.parse(data, where=f"s3://{store.bucket}/{key}")


def copied_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """The configs of ``configs`` that a copy of the topic takes over."""
    return {k: v for k, v in sorted(configs.items()) if k in COPIED_CONFIGS}


class TopicLister(Protocol):
    """What ``existing_partitions`` asks of an admin (``replicator.core.kafka.Admin``)."""

    def list_topics(self) -> list[str]: ...
    def partition_count(self, topic: str) -> int | None: ...


def existing_partitions(admin: TopicLister, topic: str) -> int | None:
    """Partition count of ``topic``, or ``None`` if it does not exist."""
    # A metadata request naming an unknown topic makes some brokers (Tansu; Apache Kafka
    # with auto.create.topics.enable, its default) create it with their default partition
    # count, so look at the full topic list first: right on every broker.
    if topic not in admin.list_topics():
        return None
    return admin.partition_count(topic)
