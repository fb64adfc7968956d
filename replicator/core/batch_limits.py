"""How large a produce request may be for a topic: its record batches must fit the topic's
``max.message.bytes`` as the broker counts it (the batch after compression), and
librdkafka fills a partition's batches up to the producer's ``batch.size`` whatever the
topic. Shared by ingress (``ingress.limits``) and ``replicator restore``.
"""

from __future__ import annotations

from collections.abc import Mapping

SETTING = "max.message.bytes"
"""The destination topic config that bounds a record batch."""

BATCH_OVERHEAD = 61
"""Bytes of a record batch's header (magic v2)."""
RECORD_OVERHEAD = 40
"""Bytes a record adds besides its key, value and headers, at most (length, attributes,
timestamp and offset deltas, key and value lengths, header count: varints)."""
HEADER_OVERHEAD = 10
"""Bytes a header adds besides its key and value, at most (two varint lengths)."""

DEFAULT_BATCH_SIZE = 1_000_000
"""librdkafka's ``batch.size`` unless ``kafka.config`` sets it."""

DEFAULT_CLIENT_MAX = 64 * 1024**2
"""The producers' own ``message.max.bytes`` unless ``kafka.config`` sets it (the Kafka
seam's default): the client refuses a larger record when it is enqueued."""


def record_size(key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes | None]] | None) -> int:
    """Bytes of one record inside a record batch (an upper bound, uncompressed)."""
    n = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for hk, hv in headers or ():
        n += HEADER_OVERHEAD + len(hk.encode()) + len(hv or b"")
    return n


def budget(limit: int) -> int:
    """Record bytes one request may carry for a topic of ``limit`` (``max.message.bytes``):
    the batch header and a margin for a compression codec that grows incompressible data
    (a few bytes plus well under 1/64 for lz4, zstd and gzip) off the limit.
    """
    return max(1, limit - BATCH_OVERHEAD - limit // 64)


def message_limit(configs: Mapping[str, str]) -> int | None:
    """``max.message.bytes`` from a topic's effective configs (``None``: absent)."""
    try:
        return int(configs[SETTING])
    except (KeyError, ValueError):
        return None


def producer_batch_size(config: Mapping[str, object]) -> int:
    """The ``batch.size`` of producers built from ``config`` (``kafka.config``)."""
    try:
        return int(str(config.get("batch.size", DEFAULT_BATCH_SIZE)))
    except ValueError:
        return DEFAULT_BATCH_SIZE


def client_message_max(config: Mapping[str, object]) -> int:
    """The ``message.max.bytes`` of producers built from ``config`` (``kafka.config``)."""
    try:
        return int(str(config.get("message.max.bytes", DEFAULT_CLIENT_MAX)))
    except ValueError:
        return DEFAULT_CLIENT_MAX


def batch_size_for(config: Mapping[str, object], limit: int | None) -> int | None:
    """A ``batch.size`` for a producer writing one topic of ``limit``
    (``max.message.bytes``), or ``None`` when the configured one fits it already.
    """
    if limit is None:
        return None
    room = budget(limit)
    return room if room < producer_batch_size(config) else None
