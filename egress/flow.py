"""Pure flow-control decisions of the egress: the memory budget and partition pauses.

Every open and closing segment of the process counts against ``egress.max_buffered_bytes``.
Above it the largest open segments close early (``pick_memory_victims``) and consumption
pauses until memory falls below a resume level (``memory_pressure``); one partition that
falls behind is paused alone (``paused_partitions``), so one slow partition cannot take the
whole budget. Encodes reserve their working memory before they run
(``EncodeAdmissions``, ``encode_reservation``): segments and reservations together stay
within the budget, but for one encode larger than it, which runs alone. The poll loop
applies the decisions (``egress.poll_loop``); nothing here
touches Kafka or S3, so every rule has a unit test (``tests/unit/egress/test_flow.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

MEMORY_RESUME_RATIO = 0.8
"""A process paused for memory resumes below this share of ``max_buffered_bytes``."""
BACKLOG_SHARE = 4
"""A partition is paused while its batches waiting for the encoder exceed
``max_buffered_bytes / BACKLOG_SHARE``."""
MAX_CLOSING = 4
"""A partition with this many segments waiting to become durable is paused. Their bytes
count against ``max_buffered_bytes`` anyway; at 2, small segments closing faster than a
loaded machine encoded them paused partitions (and threw their prefetch away) in one run out
of two, a fifth of the throughput."""


PREFETCH_SHARE = 32
"""librdkafka's prefetch gets ``max_buffered_bytes / PREFETCH_SHARE`` (half for its consumer
queue, half for a fetch response); the segments get the rest. Small, because a prefetched
message costs librdkafka several hundred bytes beyond its own (with 64-byte records, a
share of 1/8 still grew RSS by 2.9 times the budget, 1/32 by 2.3 times; bench/RESULTS.md)."""
MIN_PREFETCH = 2 * 1024**2
"""The smallest prefetch: a 1 MiB queue and a 1 MiB fetch (``max.partition.fetch.bytes``)."""
QUEUED_MESSAGE_BYTES = 256
"""Memory librdkafka holds per queued message beyond its bytes (its op and message structs).
``queued.min.messages`` is sized so the count of a full queue costs no more than its bytes:
with 64-byte records the default 100 000 messages, plus a 50 MB fetch response of about
700 000 more, held 5.4 times the budget (bench/RESULTS.md, "Memory")."""


MAX_FLUSH_BYTES = 4 * 1024**2
"""A partition's column lists become one Arrow batch at this many held bytes at most: big
enough that per-batch costs vanish (``egress.partition_writer``)."""
MIN_FLUSH_BYTES = 128 * 1024
"""...and not below this: a batch's joined value buffer from this size up is a mapping of
its own (``egress.allocators.MMAP_THRESHOLD``), given back to the system when freed."""
FLUSH_SHARE = 4
"""With many partitions, a partition flushes at ``1 / FLUSH_SHARE`` of its even share of
the budget."""


def flush_bytes(budget: int, partitions: int) -> int:
    """Held bytes at which a partition's buffered rows become one Arrow batch.

    Buffered rows are Python objects (232 B each beyond their bytes, ``egress.columns``),
    allocated one by one and freed when the segment closes: held until then, those of
    many partitions interleave in the allocator's heaps, and what one closed segment frees
    stays resident between the others' (with 1 KiB records and 64 partitions, RSS grew by
    twice a 64 MiB budget). Flushed at a quarter of each partition's share, rows live
    briefly and segments hold joined buffers, which are freed whole.
    """
    share = budget // (FLUSH_SHARE * max(1, partitions))
    return max(MIN_FLUSH_BYTES, min(MAX_FLUSH_BYTES, share))


@dataclass(frozen=True)
class Prefetch:
    """How much librdkafka may prefetch: derived from ``max_buffered_bytes``, so egress memory
    is bounded by settings and not by the partition count.

    The consumer queue is shared by all assigned partitions; librdkafka stops fetching while
    it holds ``queue_messages`` messages or ``queue_bytes`` bytes, and one fetch response
    (``fetch_bytes``, or one record batch if that is larger) can arrive on top per broker
    connection. So prefetched memory is at most ``queue_bytes + brokers * fetch_bytes`` plus
    ``QUEUED_MESSAGE_BYTES`` per message.

    Attributes:
        queue_bytes: ``queued.max.messages.kbytes`` (in bytes).
        fetch_bytes: ``fetch.max.bytes``.
        queue_messages: ``queued.min.messages``.
    """

    queue_bytes: int
    fetch_bytes: int
    queue_messages: int

    @classmethod
    def for_budget(cls, budget: int) -> Prefetch:
        """The prefetch bounds of a ``max_buffered_bytes`` budget."""
        half = max(MIN_PREFETCH, budget // PREFETCH_SHARE) // 2
        return cls(half, half, max(1000, half // QUEUED_MESSAGE_BYTES))

    @property
    def nbytes(self) -> int:
        """The share of the budget this prefetch takes (one broker's fetch)."""
        return self.queue_bytes + self.fetch_bytes

    def client_config(self) -> dict[str, int]:
        """The librdkafka consumer settings."""
        return {"queued.max.messages.kbytes": max(1, self.queue_bytes // 1024),
                "fetch.max.bytes": self.fetch_bytes,
                "queued.min.messages": self.queue_messages}


def prefetch_overrides(budget: int, kafka_config: Mapping[str, object]) -> dict[str, int]:
    """The consumer settings of ``Prefetch.for_budget(budget)`` that ``kafka.config`` does
    not set itself (an operator's explicit setting wins).
    """
    return {k: v for k, v in Prefetch.for_budget(budget).client_config().items()
            if k not in kafka_config}


UNCOUNTED_SHARE = 8
"""``max_buffered_bytes / UNCOUNTED_SHARE`` (up to ``MAX_UNCOUNTED``) is kept for what the
process holds beyond anything it counts."""
MAX_UNCOUNTED = 32 * 1024**2
"""The most the budget keeps for uncounted memory. Measured at its peak with a 64 MiB budget,
256 partitions and 30-byte records (bench/RESULTS.md, "Small records: what the budget does
not see"): 25-34 MiB beyond what segments held, in a few fixed costs that do not grow with the
budget: library code first run by the encoders (7 MiB), Python objects of the partition
state (6 MiB), other threads' malloc arenas (9-14 MiB) and what the poll thread's arena
holds beyond the batches (2-13 MiB). Reserved rather than counted: nothing measures them
cheaply while the process runs."""


def uncounted_reserve(budget: int) -> int:
    """What the budget keeps for memory nothing counts (``UNCOUNTED_SHARE``)."""
    return min(MAX_UNCOUNTED, budget // UNCOUNTED_SHARE)


def segment_budget(budget: int) -> int:
    """What open and closing segments may hold of ``max_buffered_bytes``: the rest after the
    prefetch's share and the uncounted reserve (at least half of it).
    """
    return max(budget - Prefetch.for_budget(budget).nbytes - uncounted_reserve(budget),
               budget // 2)


@dataclass(frozen=True)
class FlowLimits:
    """The thresholds derived from ``egress.max_buffered_bytes``.

    Attributes:
        budget: ``max_buffered_bytes``.
        backlog: a partition whose encoder falls this far behind is paused. Not lower than
            a quarter of the budget: a partition's backlog grows by a row group's worth
            while that group is compressed, and every pause throws away what librdkafka
            had prefetched for the partition (measured: a budget/16 limit paused
            partitions several times a second and cost a quarter of the throughput).
        min_victim: the smallest open segment the budget closes while closes are in
            flight (closing tiny segments frees little and makes many small objects).
    """

    budget: int
    backlog: int
    min_victim: int

    @classmethod
    def for_budget(cls, budget: int) -> FlowLimits:
        """The limits of a ``max_buffered_bytes`` budget."""
        return cls(budget, max(4 * 1024**2, budget // BACKLOG_SHARE),
                   min(1024**2, budget // 64))


@dataclass(frozen=True)
class PartitionLoad:
    """What flow control looks at in one partition writer."""

    closing: int
    """Segments closed and not yet durable."""
    backlog_bytes: int
    """Bytes handed to the encoder and not yet encoded."""
    failing: bool
    """A segment failed and the partition waits to rewind."""


def paused_partitions(loads: Mapping[K, PartitionLoad], limits: FlowLimits, *,
                      memory_paused: bool) -> set[K]:
    """The partitions to pause now (all of them while the process is paused for memory)."""
    return {k for k, load in loads.items()
            if memory_paused or load.failing or load.closing >= MAX_CLOSING
            or load.backlog_bytes >= limits.backlog}


def pick_memory_victims(open_segments: Mapping[K, int], budget: int, *,
                        in_flight: int = 0, min_victim_bytes: int = 0,
                        unpickable: int = 0) -> list[K]:
    """Open segments to close so that what stays held fits the budget, largest first.

    Args:
        open_segments: bytes held per open segment (writer buffers, upload buffer, batches
            not yet written).
        budget: ``egress.max_buffered_bytes``.
        in_flight: bytes held by segments already closing; they are freed once their close
            completes, so they count against the budget but cannot be picked.
        min_victim_bytes: do not close a segment holding less than this while closes are
            in flight (closing tiny segments frees little and makes many small objects).
            With nothing in flight the limit is ignored: memory must be freed by someone,
            or a process paused for memory would wait forever.
        unpickable: bytes held outside any segment that the budget charges (Arrow's
            allocations: encoder pages). Counted like ``in_flight`` but never freed by a
            close completing, so it does not turn on ``min_victim_bytes``: nonzero all the
            time, it would leave a process with many small segments paused for good.
    """
    total = sum(open_segments.values()) + in_flight + unpickable
    if total <= budget:
        return []
    floor = min_victim_bytes if in_flight > 0 else 0
    victims: list[K] = []
    for key, held in sorted(open_segments.items(), key=lambda kv: kv[1], reverse=True):
        if total <= budget or held < floor or held <= 0:
            break
        victims.append(key)
        total -= held
    return victims


def memory_pressure(held: int, budget: int, paused: bool, *,
                    resume_ratio: float = MEMORY_RESUME_RATIO) -> bool:
    """Whether consumption should be paused for memory, with hysteresis.

    Pauses once ``held`` exceeds the budget and resumes only below ``resume_ratio`` of it,
    so a process at its limit does not flap between pause and resume every poll.
    """
    if paused:
        return held > budget * resume_ratio
    return held > budget


ENCODE_COPIES = 4
"""Working memory of one Parquet encode (pyarrow, zstd, as ``formats.parquet`` writes a
segment) per byte of the largest data page it builds: Arrow holds three copies of a page
(the values gathered for it, the page, its compressed form) and the page written to the
upload stream is one more, as a Python object. Measured with Arrow's pool high-water mark
and ``tracemalloc`` on groups of 8 MiB, 1 MiB and 256 KiB random values: 3.00 times the
page in Arrow, 1.00 in Python (bench/RESULTS.md, "Large records")."""
DATA_PAGE_BYTES = 1024**2
"""Arrow's data page size: a page is cut once it holds this much..."""
PAGE_ROWS = 1024
"""...checked every this many rows (Arrow's ``write_batch_size``), so a page of small
records is at most ``DATA_PAGE_BYTES`` plus this many rows."""


def encode_reservation(group_bytes: int, largest_row: int, unit: int) -> int:
    """Working memory to reserve before encoding up to ``group_bytes`` of rows whose
    largest is ``largest_row`` bytes, with row groups cut at ``unit`` bytes for rows too
    large for ``PAGE_ROWS`` of them to fit it (``formats.parquet.ENCODE_UNIT``).

    A page then holds at most ``DATA_PAGE_BYTES`` plus ``PAGE_ROWS`` rows, or one row group
    of at most ``unit`` (one row alone when it is larger), and never more than the group.
    """
    page = DATA_PAGE_BYTES + min(PAGE_ROWS * largest_row, max(unit, largest_row))
    return ENCODE_COPIES * max(0, min(group_bytes, page))


class EncodeAdmissions:
    """Which encodes may run: each reserves its working memory (``encode_reservation``)
    before it starts and gives it back when it ends.

    A request is granted, in arrival order, while what segments hold (``held``, the poll
    thread's last count) plus what granted encodes reserve stays within ``budget``, or when
    no encode holds a reservation at all: one encode larger than the budget runs alone, so
    progress never stops. A request never overtakes an earlier one, so every request is
    granted once the ones before it end. Pure state: ``egress.encode_gate`` adds the lock
    and the waiting.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.reserved = 0
        self.peak = 0
        """The most ``held + reserved`` has been (a high-water mark)."""
        self.granted: dict[object, int] = {}
        self._waiting: dict[object, int] = {}    # insertion order is arrival order

    @property
    def waiting(self) -> int:
        """Requests not granted yet."""
        return len(self._waiting)

    def request(self, key: object, size: int) -> bool:
        """Ask for ``size`` bytes; returns whether ``key`` is granted now."""
        self._waiting[key] = max(0, size)
        self._grant()
        return key in self.granted

    def release(self, key: object) -> None:
        """An encode ended (or gave up waiting): its reservation returns to the budget."""
        self._waiting.pop(key, None)
        self.reserved -= self.granted.pop(key, 0)
        self._grant()

    def set_held(self, held: int) -> None:
        """What segments hold now (their records, batches and upload buffers)."""
        self.held = held
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            key, size = next(iter(self._waiting.items()))
            if self.granted and self.held + self.reserved + size > self.budget:
                break
            del self._waiting[key]
            self.granted[key] = size
            self.reserved += size
        self.peak = max(self.peak, self.held + self.reserved)
