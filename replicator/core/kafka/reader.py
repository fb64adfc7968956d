"""Reading a whole topic, or some of its partitions, from the beginning to the end.

The end is where each partition stood when the reader reached it (the end-of-partition
event); with ``read_committed`` that is the last stable offset, so an open transaction is
waited for, not read past. Used by the checkpoint store, ``replicator verify`` and the
tests' verifications; the reader never joins a group and never commits.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from replicator.core.errors import KafkaRetriableError, TopicError
from replicator.core.kafka.consumer import Consumer
from replicator.core.kafka.types import Message
from replicator.core.settings import KafkaSettings

log = logging.getLogger(__name__)


def read_to_end(kafka: KafkaSettings, topic: str, *,
                partitions: Sequence[int] | None = None,
                isolation: Literal["read_committed", "read_uncommitted"] = "read_committed",
                ends_at_least: Mapping[int, int] | None = None,
                timeout: float | None = None, idle_timeout: float | None = None,
                on_error: Literal["raise", "log"] = "raise",
                poll_timeout: float = 0.05, what: str = "topic",
                overrides: Mapping[str, Any] | None = None) -> Iterator[Message]:
    """Every record of ``topic`` (or of ``partitions``) from the oldest to the end.

    Records come in offset order per partition; partitions interleave.

    Args:
        kafka: the cluster.
        topic: the topic.
        partitions: which partitions (default: all of them, from the topic's metadata).
        isolation: ``read_committed`` stops at the last stable offset.
        ends_at_least: a partition counts as read only once its end reaches this offset
            (records written by transactions that were open at the first look).
        timeout: seconds the whole read may take.
        idle_timeout: seconds without any event before the read fails.
        on_error: error events ``raise`` or are ``log``-ged at WARNING and skipped.
        poll_timeout: seconds one consume call waits (the end event alone does not end
            that wait: keep it short).
        what: how messages name the topic (``"checkpoint topic"``).
        overrides: more librdkafka consumer settings.

    Raises:
        TopicError: the topic does not exist.
        KafkaRetriableError: ``timeout`` or ``idle_timeout`` passed first.
    """
    conf = {"enable.partition.eof": True, "isolation.level": isolation, **(overrides or {})}
    consumer = Consumer(kafka, f"replicator.reader.{uuid.uuid4().hex}", conf)
    try:
        parts = list(partitions) if partitions is not None else \
            consumer.partitions_of(topic, timeout=timeout or 30.0)
        if not parts:
            raise TopicError(f"{what} {topic} is missing")
        consumer.assign_from_beginning(topic, parts)
        pending = set(parts)
        need = ends_at_least or {}
        started = idle_since = time.monotonic()
        while pending:
            _check_time(f"{what} {topic}: partitions {sorted(pending)}", started, timeout,
                        idle_since, idle_timeout)
            fetched = consumer.fetch(1000, poll_timeout)
            if fetched:
                idle_since = time.monotonic()
            for err in fetched.errors:
                if on_error == "raise":
                    raise err
                log.warning("reading %s %s: %s", what, topic, err)
            for run in fetched.runs.values():
                yield from run
            for (_t, p), end in fetched.ends.items():
                if end >= need.get(p, 0):
                    pending.discard(p)
    finally:
        consumer.close()


def _check_time(where: str, started: float, timeout: float | None, idle_since: float,
                idle_timeout: float | None) -> None:
    now = time.monotonic()
    if timeout is not None and now - started > timeout:
        raise KafkaRetriableError(f"{where} not read to their end within {timeout:.0f}s")
    if idle_timeout is not None and now - idle_since > idle_timeout:
        raise KafkaRetriableError(f"{where}: no data and no end of partition within "
                                  f"{idle_timeout:.0f}s")
