"""``{prefix}/{region}/{topic}/_topic.json``: what ingress needs to create its copy topic."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

from replicator.core.keys import TOPIC_META_CONFIGS


def topic_metadata(topic: str, region: str, partitions: int, configs: Mapping[str, str],
                   now: datetime) -> bytes:
    """The JSON body of ``_topic.json`` (keys: topic, region, partitions, configs,
    updated_at)."""
    body = {
        "topic": topic,
        "region": region,
        "partitions": partitions,
        "configs": {k: configs[k] for k in sorted(TOPIC_META_CONFIGS) if k in configs},
        "updated_at": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    return json.dumps(body, indent=2, sort_keys=True).encode("utf-8")
