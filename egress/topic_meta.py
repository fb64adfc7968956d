"""``{prefix}/{region}/{topic}/_topic.json``: what ingress needs to create its copy topic.

Written for every configured topic at start and again whenever its partition count
changes (checked every ``egress.topic_metadata_interval``). The body is
``replicator.core.wire.TopicMetadata`` (docs/architecture.md, "Topic metadata").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from datetime import timedelta
from typing import Protocol

from egress.metrics import EgressMetrics
from replicator.core.clock import Clock
from replicator.core.errors import ReplicatorError
from replicator.core.keys import topic_meta_key
from replicator.core.retry import RetryPolicy, retry
from replicator.core.storage import ObjectStore
from replicator.core.wire import TopicMetadata

log = logging.getLogger(__name__)


class TopicSource(Protocol):
    """What is read about a source topic (``replicator.core.kafka.Admin``)."""

    def partition_count(self, topic: str) -> int | None: ...
    def topic_config(self, topic: str) -> dict[str, str]: ...


class TopicMetadataPublisher:
    """Writes ``_topic.json`` of the configured topics when their partition count is new.

    Args:
        topics: the source topics.
        admin: reads partition counts and topic configs.
        store: the region's bucket.
        prefix: ``s3.prefix``.
        region: this process's region.
        metrics: the egress metrics.
        wall: the wall clock (``updated_at``).
        retry_policy: retries of the put.
        interval: ``egress.topic_metadata_interval`` (for log lines).
    """

    def __init__(self, topics: Iterable[str], admin: TopicSource, store: ObjectStore, *,
                 prefix: str, region: str, metrics: EgressMetrics, wall: Clock,
                 retry_policy: RetryPolicy, interval: timedelta) -> None:
        self.topics = sorted(topics)
        self.admin = admin
        self.store = store
        self.prefix = prefix
        self.region = region
        self.m = metrics
        self.wall = wall
        self.retry_policy = retry_policy
        self.interval = interval
        self._partition_counts: dict[str, int] = {}
        self._running = threading.Lock()

    @property
    def running(self) -> bool:
        """True while a check runs (the poll loop does not queue a second one)."""
        return self._running.locked()

    def check(self) -> None:
        """Write ``_topic.json`` for topics whose partition count is new or changed.

        Failures are logged and tried again at the next check; they never raise.
        """
        with self._running:
            for topic in self.topics:
                try:
                    n = self.admin.partition_count(topic)
                    if n is None:
                        log.warning("%s: source topic does not exist (yet)", topic)
                        continue
                    if self._partition_counts.get(topic) == n:
                        continue
                    configs = self.admin.topic_config(topic)
                    key = topic_meta_key(self.prefix, self.region, topic)
                    body = TopicMetadata.of(topic, self.region, n, configs,
                                            self.wall()).encode()
                    retry(lambda key=key, body=body: self.store.put(  # type: ignore[misc]
                              key, body, content_type="application/json"),
                          self.retry_policy, what=f"put {key}")
                except ReplicatorError as e:
                    log.warning("%s: _topic.json not updated, trying again in %s: %s", topic,
                                self.interval, e)
                    continue
                old = self._partition_counts.get(topic)
                self._partition_counts[topic] = n
                self.m.topic_meta_writes.labels(self.region, topic).inc()
                log.info("%s: wrote %s (%d partitions%s)", topic, key, n,
                         "" if old is None else f", was {old}")
