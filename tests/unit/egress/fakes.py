"""Fakes for egress unit tests: messages, a recording/failing store, a writer harness."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from egress.metrics import EgressMetrics
from egress.partition_writer import PartitionWriter, WriterContext
from egress.rotation import SegmentLimits
from egress.segment import SegmentOutcome
from formats.base import WriterOptions
from formats.records import Record
from formats.registry import get_format
from replicator.core.errors import StorageError
from replicator.core.keys import PartitionRef
from replicator.core.metrics import Metrics
from replicator.core.retry import RetryPolicy
from replicator.core.storage import MemoryObjectStore, ObjectInfo, Upload


class FakeMessage:
    """A consumed record with the accessors of ``confluent_kafka.Message``."""

    def __init__(self, r: Record, topic: str = "t", partition: int = 0) -> None:
        self._r = r
        self._topic = topic
        self._partition = partition

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._r.offset

    def key(self) -> bytes | None:
        return self._r.key

    def value(self) -> bytes | None:
        return self._r.value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return list(self._r.headers) or None

    def timestamp(self) -> tuple[int, int]:
        return (self._r.timestamp_type, self._r.timestamp_ms)

    def error(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._r.value or b"")


def records(offsets: Iterable[int], size: int = 10) -> list[Record]:
    return [Record(o, 1_700_000_000_000 + o, f"k{o}".encode(), b"v" * size) for o in offsets]


def messages(recs: Iterable[Record]) -> list[FakeMessage]:
    return [FakeMessage(r) for r in recs]


class SourceAdmin:
    """The source cluster as egress's topic metadata publisher reads it: one topic with
    ``partitions`` partitions, no configs, its id ``tid`` (set ``id`` to recreate it)."""

    def __init__(self, tid: str | None = "IdA", partitions: int = 1) -> None:
        self.id = tid
        self.partitions = partitions

    def partition_count(self, topic: str) -> int | None:
        return self.partitions

    def topic_config(self, topic: str) -> dict[str, str]:
        return {}

    def topic_id(self, topic: str) -> str | None:
        return self.id


class RecordingStore(MemoryObjectStore):
    """A memory store that logs operations and fails chosen ones ``fail[op]`` times."""

    def __init__(self) -> None:
        super().__init__(part_size=5 * 1024**2)
        self.ops: list[tuple[str, str]] = []
        self.fail: dict[str, int] = {}
        self.lock = threading.Lock()

    def _maybe_fail(self, op: str, key: str) -> None:
        with self.lock:
            self.ops.append((op, key))
            if self.fail.get(op, 0) > 0:
                self.fail[op] -= 1
                raise StorageError(f"injected {op} failure for {key}")

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        self._maybe_fail("put", key)
        return super().put(key, data, **kw)

    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        self._maybe_fail("open_upload", key)
        return super().open_upload(key, storage_class=storage_class)

    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        self._maybe_fail("copy", dst)
        return super().copy(src, dst, storage_class=storage_class)

    def delete(self, key: str) -> None:
        self._maybe_fail("delete", key)
        super().delete(key)


@dataclass
class Harness:
    """One ``PartitionWriter`` on a memory store with a recorded commit."""

    store: RecordingStore = field(default_factory=RecordingStore)
    limits: SegmentLimits = field(default_factory=lambda: SegmentLimits(1000, 10**9, 60.0))
    expected: int | None = None
    low: int | None = None
    """The source's log start offset (what the poll loop reads when a position left the
    log); the writer itself never asks."""
    now: float = 0.0
    commits: list[int] = field(default_factory=list)
    first_commits: list[int] = field(default_factory=list)
    """Commits marked as the start egress chose (``egress.commits.FIRST_POSITION``)."""
    next_segments: dict[int, int] = field(default_factory=dict)
    """Commit metadata: committed offset -> the next segment's start, where they differ."""
    outcomes: list[SegmentOutcome] = field(default_factory=list)
    commit_error: Exception | None = None
    first_positions: Any = None
    incarnations: Any = None

    def __post_init__(self) -> None:
        self.pool = ThreadPoolExecutor(2)
        self.metrics = Metrics()
        self.m = EgressMetrics(self.metrics)
        self.ctx = WriterContext(
            store=self.store, fmt=get_format("parquet"), options=WriterOptions(),
            temp_prefix="temp", storage_class="STANDARD", pool=self.pool,
            report=self.outcomes.append, clock=lambda: self.now,
            wall=lambda: datetime(2026, 1, 1, tzinfo=UTC),
            retry_policy=RetryPolicy(attempts=3, initial=timedelta(milliseconds=1),
                                     jitter=0.0),
            first_positions=self.first_positions, incarnations=self.incarnations)
        self.writer = PartitionWriter(
            PartitionRef("data", "r1", "t", 0), self.limits, self.expected, ctx=self.ctx,
            metrics=self.m.for_partition("r1", "t", 0), commit=self._commit)

    def _commit(self, offset: int, next_segment: int | None = None, *,
                first: bool = False, topic_id: str | None = None) -> None:
        with self.store.lock:
            self.store.ops.append(("commit", str(offset)))
        if first:
            self.first_commits.append(offset)
        if next_segment is not None and next_segment != offset:
            self.next_segments[offset] = next_segment
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append(offset)

    def settle(self) -> None:
        assert self.writer.queue.wait_idle(10)
        for o in list(self.outcomes):
            self.writer.outcome(o, self.now)
        self.outcomes.clear()

    def final_keys(self) -> list[str]:
        # Without egress's copy of the incarnation chain (egress.incarnation_chain).
        return [k for k in self.store.keys()  # noqa: SIM118
                if k.startswith("data/") and not k.endswith("/_incarnations.json")]

    def temp_keys(self) -> list[str]:
        return [k for k in self.store.keys() if k.startswith("temp/")]  # noqa: SIM118

    def close(self) -> None:
        self.pool.shutdown(wait=True)
