"""Destination topics' record-batch limits, and batches cut to fit them.

A broker refuses a produce request whose record batch (after compression) is larger than
the topic's ``max.message.bytes``. librdkafka fills each partition's batches up to the
producer's ``batch.size`` whatever the topic (one setting per producer; it never splits
a refused batch), and ingress shares one producer between every topic of the process. So a
batch for a topic whose limit is below ``batch.size`` is cut into chunks whose records fit
the limit (``chunks``), and a chunk is only enqueued once the partition's previous one is
delivered: records still queued cannot join the next chunk's batch. Topics at Kafka's
default limit (1 MiB, above the default ``batch.size``) are never cut: no cost there.

``DestinationLimits`` holds each destination topic's limit, read at start and at every
topic check (``ingress.topic_check_interval``) by the controller, and the producers' own
``message.max.bytes``. A record that either may refuse (``alone_above``) is sent alone and
waited for before anything after it is produced (``isolate``; ingress/README.md,
"Destination limits"), so a refusal stops its partition exactly there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ingress.rows import Rows
from replicator.core.batch_limits import (
    BATCH_OVERHEAD,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CLIENT_MAX,
    SETTING,
    budget,
    client_message_max,
    producer_batch_size,
    record_size,
)
from replicator.core.errors import RecordRefused
from replicator.core.kafka import DeliveryReport


def chunk_bounds(rows: Rows, room: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` index ranges of ``rows``, in order, each of at most ``room`` record bytes
    (a record larger than ``room`` alone: the broker decides about it).
    """
    out: list[tuple[int, int]] = []
    lo, used = 0, 0
    for i, (k, v, h) in enumerate(zip(rows.keys, rows.values, rows.headers, strict=True)):
        size = record_size(k, v, h)
        if i > lo and used + size > room:
            out.append((lo, i))
            lo, used = i, 0
        used += size
    if lo < len(rows):
        out.append((lo, len(rows)))
    return out


def slice_rows(rows: Rows, lo: int, hi: int) -> Rows:
    """Records ``[lo, hi)`` of ``rows``."""
    if lo == 0 and hi == len(rows):
        return rows
    return replace(rows, offsets=rows.offsets[lo:hi], timestamps=rows.timestamps[lo:hi],
                   keys=rows.keys[lo:hi], values=rows.values[lo:hi],
                   headers=rows.headers[lo:hi])


def isolate(rows: Rows, sizes: Sequence[int], above: int, refused_at: int | None
            ) -> list[tuple[Rows, bool]]:
    """``rows`` as consecutive parts, each with whether it goes alone: every record larger
    than ``above`` record bytes (``sizes``, as ``record_size`` counts them) and the record
    at source offset ``refused_at`` (refused before) is a part of its own, ``True``; the
    runs between them are parts, ``False``. One part, ``[(rows, False)]``, when no record
    is set apart (the usual case).
    """
    out: list[tuple[Rows, bool]] = []
    lo = 0
    for i, (offset, size) in enumerate(zip(rows.offsets, sizes, strict=True)):
        if size > above or offset == refused_at:
            if i > lo:
                out.append((slice_rows(rows, lo, i), False))
            out.append((slice_rows(rows, i, i + 1), True))
            lo = i + 1
    if lo < len(rows):
        out.append((slice_rows(rows, lo, len(rows)), False))
    return out


def failed_index(rows: Rows, failed: DeliveryReport | None) -> int | None:
    """The index in ``rows`` of the failed record of ``failed`` (its key and value), if
    its report names one.
    """
    if failed is None or (failed.key is None and failed.value is None):
        return None
    for i, (k, v) in enumerate(zip(rows.keys, rows.values, strict=True)):
        if k == failed.key and v == failed.value:
            return i
    return None


def refused_record(rows: Rows | None, error: RecordRefused, limit: int | None,
                   where: str, failed: DeliveryReport | None = None) -> RecordRefused:
    """``error`` naming the record of ``rows`` the destination refused: for a size refusal
    the first record too large for ``limit`` on its own (from the failed record on, when
    the delivery report ``failed`` names one); else the failed record (the first of the
    request the broker refused); else the request as a whole, from its first record.
    """
    if not rows:
        return error
    sizes = [record_size(k, v, h) for k, v, h in
             zip(rows.keys, rows.values, rows.headers, strict=True)]
    setting = f"{SETTING}={limit}" if limit is not None else f"{SETTING} unknown"
    reason = error.reason or str(error)
    first = failed_index(rows, failed)
    i: int | None = first
    if "too large" in error.reason.lower():
        over = [j for j, s in enumerate(sizes)
                if limit is not None and s + BATCH_OVERHEAD > limit
                and (first is None or j >= first)]
        i = over[0] if over else first
        if i is None:
            # No record is too large on its own: the request was (its records batched).
            return RecordRefused(
                f"{where}: the destination refused a request of {len(sizes)} record(s) "
                f"from source offset {rows.offsets[0]} ({sum(sizes)} bytes; destination "
                f"{setting}), none too large on its own: {reason}",
                offset=rows.offsets[0], size=sum(sizes), setting=setting, reason=reason)
    if i is None:
        i = 0
    return RecordRefused(
        f"{where}: the destination refused the record at source offset {rows.offsets[i]} "
        f"({sizes[i]} bytes; destination {setting}): {reason}",
        offset=rows.offsets[i], size=sizes[i], setting=setting, reason=reason)


def client_refused(rows: Rows, error: RecordRefused, client_max: int, where: str
                   ) -> RecordRefused:
    """``error`` (the client refused a record of ``rows`` when enqueued: larger than its own
    ``message.max.bytes``) naming that record; ``enqueued`` records went before it.
    """
    i = min(error.enqueued or 0, len(rows) - 1)
    size = record_size(rows.keys[i], rows.values[i], rows.headers[i])
    setting = f"message.max.bytes={client_max} (kafka.config: the producer's own limit)"
    return RecordRefused(
        f"{where}: the client refused the record at source offset {rows.offsets[i]} "
        f"({size} bytes; {setting}): {error.reason or error}",
        offset=rows.offsets[i], size=size, setting=setting,
        reason=error.reason or str(error), enqueued=error.enqueued)


class DestinationLimits:
    """``max.message.bytes`` of each destination topic, and whether batches for it must be
    cut (``room``), shared by the controller (which reads them) and the producers.

    Args:
        batch_size: the producers' ``batch.size``: a topic whose ``budget`` reaches it
            needs no cutting (librdkafka's batches are no larger).
    """

    def __init__(self, batch_size: int = DEFAULT_BATCH_SIZE,
                 client_max: int = DEFAULT_CLIENT_MAX) -> None:
        self.batch_size = batch_size
        self.client_max = client_max
        """The producers' own ``message.max.bytes`` (``kafka.config``)."""
        self._limits: dict[str, int] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str], None]] = []

    @classmethod
    def for_config(cls, config: Mapping[str, object]) -> DestinationLimits:
        """For producers built from ``kafka.config`` (its ``batch.size`` and
        ``message.max.bytes``, if set).
        """
        return cls(producer_batch_size(config), client_message_max(config))

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic)`` when a topic's limit changes (not when first read)."""
        self._listeners.append(listener)

    def update(self, topic: str, limit: int | None) -> bool:
        """Record ``topic``'s limit (``None``: unknown); True if it changed from a known
        value (listeners were called).
        """
        with self._lock:
            old = self._limits.get(topic)
            if limit is None:
                self._limits.pop(topic, None)
            else:
                self._limits[topic] = limit
        changed = old is not None and limit != old
        if changed:
            for listener in self._listeners:
                listener(topic)
        return changed

    def limit(self, topic: str) -> int | None:
        """``max.message.bytes`` of ``topic`` (``None``: not read)."""
        with self._lock:
            return self._limits.get(topic)

    def room(self, topic: str) -> int | None:
        """Record bytes one request for ``topic`` may carry, or ``None`` when its batches
        need no cutting (limit unknown, or no smaller than ``batch.size`` allows).
        """
        limit = self.limit(topic)
        if limit is None:
            return None
        room = budget(limit)
        return None if room >= self.batch_size else room

    def alone_above(self, topic: str) -> int:
        """Record bytes (``record_size``) above which a record for ``topic`` may be refused:
        by the client (its own ``message.max.bytes``) or by the topic's known
        ``max.message.bytes`` (its batch alone, with a margin for compression); such a
        record is produced alone (``isolate``).
        """
        above = self.client_max - BATCH_OVERHEAD
        limit = self.limit(topic)
        if limit is not None:
            above = min(above, budget(limit))
        return above

    def client_refuses(self, size: int) -> bool:
        """True if the client itself refuses a record of ``size`` record bytes."""
        return size + BATCH_OVERHEAD > self.client_max

    def cut(self, topic: str, rows: Rows) -> list[Rows]:
        """``rows`` as the chunks one request each may carry for ``topic``."""
        room = self.room(topic)
        if room is None:
            return [rows]
        return [slice_rows(rows, lo, hi) for lo, hi in chunk_bounds(rows, room)]
