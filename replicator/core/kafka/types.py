"""The values that cross the Kafka seam: partitions, consumed messages, delivery reports.

Consumed messages stay the client's own objects (wrapping each one would cost the egress hot
path a Python object per record); ``Message`` is the protocol of what services read of them.
Everything else is ours: ``TopicPartition`` is a frozen value, not the client's mutable one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import confluent_kafka as ck

if TYPE_CHECKING:
    from replicator.core.errors import ReplicatorError

OFFSET_BEGINNING: int = ck.OFFSET_BEGINNING
"""Logical offset: the oldest record of a partition."""
OFFSET_END: int = ck.OFFSET_END
"""Logical offset: the end of a partition (the next record produced)."""
OFFSET_INVALID: int = ck.OFFSET_INVALID
"""No offset (a partition without a committed offset reports this)."""
OFFSET_STORED: int = ck.OFFSET_STORED
"""Logical offset: the group's committed offset."""

TIMESTAMP_NOT_AVAILABLE: int = ck.TIMESTAMP_NOT_AVAILABLE
TIMESTAMP_CREATE_TIME: int = ck.TIMESTAMP_CREATE_TIME
TIMESTAMP_LOG_APPEND_TIME: int = ck.TIMESTAMP_LOG_APPEND_TIME

Headers = list[tuple[str, bytes | None]]
"""Record headers as the client reads and writes them (names may repeat, values be null)."""


class Message(Protocol):
    """What services read of a consumed record (the client's ``Message``)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Headers | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of a topic, optionally with an offset (the next one to read/commit)."""

    topic: str
    partition: int
    offset: int = OFFSET_INVALID
    metadata: str = ""
    """The metadata committed with ``offset`` (commits and committed offsets only)."""

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"

    @property
    def key(self) -> tuple[str, int]:
        """``(topic, partition)``, for dictionaries keyed by partition."""
        return (self.topic, self.partition)


def to_client(tp: TopicPartition) -> ck.TopicPartition:
    """The client's ``TopicPartition`` for ``tp`` (seam-internal)."""
    if tp.metadata:
        return ck.TopicPartition(tp.topic, tp.partition, tp.offset, tp.metadata)
    return ck.TopicPartition(tp.topic, tp.partition, tp.offset)


def from_client(tp: ck.TopicPartition) -> TopicPartition:
    """Our value for a client ``TopicPartition`` (seam-internal)."""
    return TopicPartition(tp.topic, tp.partition, tp.offset, tp.metadata or "")


@dataclass(slots=True)
class Fetched:
    """What one consume call returned, sorted in one pass over the client's events.

    Attributes:
        runs: the records of each ``(topic, partition)``, in offset order.
        errors: error events, translated (``KafkaRetriableError`` for a passing problem,
            ``ConfigError`` for a group setting the broker refuses, ``KafkaFatalError``).
        ends: partition end events (``enable.partition.eof``): ``(topic, partition)`` to
            the offset after the last record at that moment.
        out_of_range: with ``auto.offset.reset=error``, partitions whose fetch position
            is no longer in the log (records deleted under it, or the log truncated):
            ``(topic, partition)`` to that position. The partition is not fetched again
            until it is seeked.
    """

    runs: dict[tuple[str, int], list[Message]] = field(default_factory=dict)
    errors: list[ReplicatorError] = field(default_factory=list)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    out_of_range: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Number of records (not error or end events)."""
        return sum(len(r) for r in self.runs.values())

    def __bool__(self) -> bool:
        return bool(self.runs or self.errors or self.ends or self.out_of_range)


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """The outcome of one produced record.

    ``offset`` is where the record landed (``-1`` when it failed); ``error`` is the
    translated failure, ``reason`` the client's text for it; a failed record's ``key`` and
    ``value`` name it among the records of its call (``ingress.limits.refused_record``).
    """

    topic: str
    partition: int
    offset: int
    error: ReplicatorError | None = None
    reason: str = ""
    key: bytes | None = None
    value: bytes | None = None
