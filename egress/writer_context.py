"""What the partition writers of one controller share (``WriterContext``), the recorder of
first positions it carries (``FirstPositions``) and the error a cancelled segment task
raises (``Cancelled``).

Separate from ``egress.partition_writer`` so that the writer's parts
(``egress.writer_positions``, ``egress.writer_rewind``, ``egress.writer_incarnation``) name
them without importing the writer.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from egress.encode_gate import EncodeGate
from egress.epoch_ids import Incarnations
from egress.segment import SegmentOutcome
from formats.base import SegmentFormat, WriterOptions
from replicator.core.clock import Clock, Monotonic
from replicator.core.errors import ReplicatorError
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.retry import RetryPolicy
from replicator.core.storage import ObjectStore


class Cancelled(ReplicatorError):
    """A segment task was cancelled (revoke or shutdown timeout, lost partition)."""


@dataclass(frozen=True)
class WriterContext:
    """What every partition writer of one controller shares."""

    store: ObjectStore
    fmt: SegmentFormat
    options: WriterOptions
    temp_prefix: str
    storage_class: str | None
    pool: Executor
    report: Callable[[SegmentOutcome], None]
    clock: Monotonic
    wall: Clock
    retry_policy: RetryPolicy
    first_positions: FirstPositions | None = None
    """Records a partition's first position in ``_topic.json`` (``None``: not recorded)."""
    incarnations: Incarnations | None = None
    """Names the topic incarnation of each segment (``None``: every segment is stored at
    the documented key shape, as before topic ids were known)."""
    gate: EncodeGate | None = None
    """Admits encodes within the memory budget (``None``: every encode runs at once)."""
    mirror: Callable[[SegmentKey], object] | None = None
    """Queues the copy of a just-published segment into the destination region's bucket
    (``egress.mirror.SegmentMirror.submit``: never blocks nor raises; ``None``: off)."""


class FirstPositions(Protocol):
    """``egress.topic_meta.TopicMetadataPublisher.record_first_position``."""

    def __call__(self, ref: PartitionRef, start: int, *, resumed: bool) -> None: ...
