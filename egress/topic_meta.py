"""``{prefix}/{region}/{topic}/_topic.json``: what ingress needs to create its copy topic."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

# Source topic configs that matter for a copy. Brokers report only explicitly set keys
# (Tansu) or every key (Kafka); either way only these are written.
COPY_CONFIGS = (
    "cleanup.policy",
    "compression.type",
    "delete.retention.ms",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.ms",
)


def topic_metadata(topic: str, region: str, partitions: int, configs: Mapping[str, str],
                   now: datetime) -> bytes:
    """The JSON body of ``_topic.json`` (keys: topic, region, partitions, configs,
    updated_at)."""
    body = {
        "topic": topic,
        "region": region,
        "partitions": partitions,
        "configs": {k: configs[k] for k in COPY_CONFIGS if k in configs},
        "updated_at": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    return json.dumps(body, indent=2, sort_keys=True).encode("utf-8")
