"""``replicator restore``: replay a range of the archive into a topic, exactly once
(README, "Restoring from the archive"; docs/architecture.md, "Checkpoints" and
"Durability").

The plan comes from ``replicator.ops.restore_plan`` (pure); this module lists the archive,
reads footers for record times when the range is bounded by time, and runs the plan with
its own durability method (``Restorer._deliver``): one transaction per batch holding the
records and a checkpoint under the restore's own key, so an interrupted restore (even
``kill -9``) run again resumes after its last committed batch and produces nothing twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from formats.base import TIMESTAMP_NOT_AVAILABLE
from formats.segment_io import open_segment, raw_size_of_batch, timestamp_range
from replicator.core.compacted_topic import ensure_compacted_topic
from replicator.core.errors import (
    FatalError,
    KafkaRetriableError,
    ProducerFenced,
    TransactionAbortable,
)
from replicator.core.kafka import Admin, Producer, read_to_end
from replicator.core.keys import SegmentKey, topic_prefix
from replicator.core.settings import KafkaSettings
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import copied_configs, existing_partitions, read_topic_meta
from replicator.core.wire import Checkpoint
from replicator.ops.pace import Progress, TokenBucket
from replicator.ops.restore_plan import ArchivedSegment, Plan, RestoreRange, Step, plan, with_times

log = logging.getLogger(__name__)

TXN_TIMEOUT = 60.0
"""Seconds a transaction call may take (commit waits for every record of the batch)."""

ABORTABLE_RETRIES = 5
"""Times a batch is redone after the broker asked to abort its transaction."""


class RestoreError(FatalError):
    """A restore cannot run, or stopped: the message says why and what to do."""


@dataclass(frozen=True)
class RestoreRequest:
    """One restore: what to read, where to write it, how fast."""

    source_region: str
    topic: str
    to_topic: str
    checkpoint_topic: str
    range: RestoreRange = field(default_factory=RestoreRange)
    partitions: tuple[int, ...] | None = None
    allow_gaps: bool = False
    rate: int | None = None
    """Bytes per second of keys, values and headers produced (``None``: unlimited)."""
    batch_records: int = 2000
    """Records per transaction."""

    def checkpoint_key(self, partition: int) -> str:
        """``restore:{source_region}:{topic}:{partition}:{to_topic}``."""
        return f"restore:{self.source_region}:{self.topic}:{partition}:{self.to_topic}"

    @property
    def transactional_id(self) -> str:
        """The producer's id: a second run of the same restore fences the first."""
        return f"replicator-restore:{self.source_region}:{self.topic}:{self.to_topic}"


# --- planning ---------------------------------------------------------------------------


def list_archive(store: ObjectStore, prefix: str, region: str, topic: str
                 ) -> list[ArchivedSegment]:
    """The topic's segments (every level) as the listing describes them."""
    out = []
    for o in store.list(topic_prefix(prefix, region, topic)):
        key = SegmentKey.try_parse(o.key)
        if key is not None:
            out.append(ArchivedSegment(key, o.size, o.storage_class))
    return out


def segment_times(store: ObjectStore, key: SegmentKey) -> tuple[tuple[int, int] | None, bool]:
    """The record-time range of a segment, and whether its records had to be read for it
    (segments written before footers had ``min_timestamp``/``max_timestamp``).
    """
    with open_segment(store, key) as reader:
        meta = reader.metadata
        if meta.min_timestamp is not None and meta.max_timestamp is not None:
            return (meta.min_timestamp, meta.max_timestamp), False
        lo: int | None = None
        hi: int | None = None
        for batch in reader.iter_batches(50_000):
            if batch.num_rows:
                a, b = timestamp_range(batch)
                lo, hi = (a, b) if lo is None or hi is None else (min(lo, a), max(hi, b))
        return (None if lo is None or hi is None else (lo, hi)), True


def make_plan(store: ObjectStore, prefix: str, request: RestoreRequest, *,
              note: Callable[[str], None] = log.info) -> Plan:
    """List the archive and plan ``request``; with time bounds, read the chosen segments'
    footers for their record times (and, for segments without them, the records: ``note``
    tells the user) and plan again.
    """
    segments = list_archive(store, prefix, request.source_region, request.topic)
    p = plan(segments, request.range, request.partitions)
    if not request.range.timed:
        return p
    times: dict[SegmentKey, tuple[int, int]] = {}
    read: list[SegmentKey] = []
    for step in p.steps:
        if not step.segment.readable:
            continue  # refused anyway
        found, scanned = segment_times(store, step.segment.key)
        if found is not None:
            times[step.segment.key] = found
        if scanned:
            read.append(step.segment.key)
    if read:
        note(f"read {len(read)} segment(s) to find their record times (written before "
             f"segment footers had them): {', '.join(str(k) for k in read[:5])}"
             f"{' ...' if len(read) > 5 else ''}")
    return plan(with_times(segments, times), request.range, request.partitions)


# --- running ----------------------------------------------------------------------------


@dataclass
class PartitionResult:
    """What happened to one partition."""

    partition: int
    resumed_after: int | None = None
    records: int = 0


class Restorer:
    """Runs a plan into ``request.to_topic`` of ``kafka``, exactly once.

    Before the first batch:

    a. the checkpoint topic (compacted) and the destination topic exist (the destination
       created with the source's partition count and copied configs from ``_topic.json``
       when missing, by the same rules as ingress: ``replicator.core.topic_copy``);
    b. the transactional producer registers ``request.transactional_id``: an earlier run
       of the same restore is fenced and its open transaction aborted;
    c. each partition's checkpoint is read, read_committed past its newest record
       (``load_checkpoints``); the partition resumes after it.

    Then every batch goes through ``_deliver``, the one durability method.
    """

    def __init__(self, kafka: KafkaSettings, store: ObjectStore, prefix: str,
                 request: RestoreRequest, *, progress: Progress | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.kafka = kafka
        self.store = store
        self.prefix = prefix
        self.request = request
        self.progress = progress
        self._on_progress = on_progress
        self._clock = clock
        self._sleep = sleep
        self._bucket = None if request.rate is None else \
            TokenBucket(request.rate, now=clock())
        self._producer: Producer | None = None

    # Steps a-c -------------------------------------------------------------------------

    def prepare_topics(self, plan_: Plan) -> None:
        """Step a: the checkpoint topic and the destination topic exist.

        Raises:
            RestoreError: the destination exists with too few partitions.
        """
        req = self.request
        admin = Admin(self.kafka)
        ensure_compacted_topic(admin, req.checkpoint_topic, "checkpoint topic")
        wanted = max((p.partition for p in plan_.partitions), default=0) + 1
        meta = read_topic_meta(self.store, self.prefix, req.source_region, req.topic)
        have = existing_partitions(admin, req.to_topic)
        if have is None:
            count = max(wanted, meta.partitions if meta is not None else 0)
            configs = copied_configs(meta.configs) if meta is not None else {}
            if admin.create_topic(req.to_topic, count, configs):
                log.info("created topic %s with %d partition(s), configs %s (from %s)",
                         req.to_topic, count, configs,
                         "_topic.json" if meta is not None else "the archive's partitions")
            deadline = self._clock() + 30  # a new topic's metadata takes a moment
            while (have := existing_partitions(admin, req.to_topic)) is None \
                    and self._clock() < deadline:
                self._sleep(0.2)
        if have is None or have < wanted:
            raise RestoreError(f"topic {req.to_topic} has {have} partition(s); the restore "
                               f"writes partition {wanted - 1} (same partition as the "
                               "source): give it more partitions or restore elsewhere")

    def start_producer(self) -> Producer:
        """Step b: register the transactional id (fences an earlier run)."""
        p = Producer(self.kafka, transactional_id=self.request.transactional_id,
                     name=f"restore into {self.request.to_topic}")
        p.init_transactions(TXN_TIMEOUT)
        self._producer = p
        return p

    def load_checkpoints(self, partitions: list[int]) -> dict[int, Checkpoint]:
        """Step c: the newest committed checkpoint of each partition of this restore.

        The checkpoint topic may be shared (ingress's): while another writer's transaction
        is open, read_committed stops at it. So, as ingress does: 1. read_uncommitted to the
        end for the offset after our newest record; 2. read_committed until the stable end
        has passed it.
        """
        keys = {self.request.checkpoint_key(p).encode(): p for p in partitions}
        need: dict[int, int] = {}
        for m in read_to_end(self.kafka, self.request.checkpoint_topic,
                             isolation="read_uncommitted", timeout=120, what="checkpoint topic"):
            if m.key() in keys and (part := m.partition()) is not None and \
                    (off := m.offset()) is not None:
                need[part] = max(need.get(part, 0), off + 1)
        out: dict[int, Checkpoint] = {}
        for m in read_to_end(self.kafka, self.request.checkpoint_topic,
                             isolation="read_committed", ends_at_least=need, timeout=120,
                             what="checkpoint topic"):
            key = m.key()
            if key not in keys:
                continue
            value = m.value()
            if value is None:
                out.pop(keys[key], None)  # a tombstone: the restore was reset
                continue
            try:
                out[keys[key]] = Checkpoint.decode(value)
            except ValueError as e:
                log.error("invalid restore checkpoint %s ignored: %s", key.decode(), e)
        return out

    # The durability method --------------------------------------------------------------

    def _deliver(self, partition: int, batch: pa.RecordBatch | None, cp: Checkpoint) -> None:
        """Restore one batch exactly once.

        1. Begin a transaction.
        2. Produce the batch's records to ``partition`` of the destination: key, value
           (null stays null), headers in order, the source timestamp as CreateTime.
        3. Flush: the records are in the log before their checkpoint is sent.
        4. Produce the checkpoint (``cp``: the last source offset this batch covers) under
           the restore's key in the checkpoint topic, and commit: records and checkpoint
           become visible together or not at all.

        A batch whose transaction the broker asks to abort is redone (up to
        ``ABORTABLE_RETRIES`` times). Any other failure aborts and raises: the next run
        resumes after the last committed checkpoint.

        Raises:
            RestoreError: fenced by a newer run of the same restore.
            KafkaRetriableError / KafkaFatalError: the batch was not restored.
        """
        p = self._producer
        assert p is not None, "start_producer first"
        to = self.request.to_topic
        for attempt in range(ABORTABLE_RETRIES + 1):
            try:
                p.begin_transaction()                                          # Step 1
                if batch is not None:
                    for rec in _records(batch):                                # Step 2
                        p.produce(to, rec[2], rec[1], partition=partition, timestamp=rec[0],
                                  headers=rec[3])
                    p.flush(TXN_TIMEOUT)                                       # Step 3
                    p.check_deliveries(f"restore into {to}[{partition}]")
                p.produce(self.request.checkpoint_topic, cp.encode(),          # Step 4
                          self.request.checkpoint_key(partition).encode())
                p.commit_transaction(TXN_TIMEOUT)
                return
            except ProducerFenced as e:
                raise RestoreError(f"another run of this restore into {to} took over "
                                   f"(transactional id {self.request.transactional_id}); "
                                   "this one stops") from e
            except TransactionAbortable:
                p.abort_transaction(TXN_TIMEOUT)
                if attempt == ABORTABLE_RETRIES:
                    raise
                log.warning("restore into %s[%d]: transaction aborted by the broker, redoing "
                            "the batch (attempt %d)", to, partition, attempt + 2)
            except BaseException:
                try:
                    p.abort_transaction(TXN_TIMEOUT)
                except (KafkaRetriableError, FatalError) as abort_error:
                    log.warning("restore into %s[%d]: abort failed: %s", to, partition,
                                abort_error)
                raise

    # Driving ---------------------------------------------------------------------------

    def run(self, plan_: Plan) -> list[PartitionResult]:
        """Run ``plan_`` (already checked: ``Plan.refusals``). Gaps of the plan are skipped
        with an ERROR line each (the caller allowed them).
        """
        self.prepare_topics(plan_)                       # a
        self.start_producer()                            # b
        parts = [p.partition for p in plan_.partitions if p.first is not None]
        checkpoints = self.load_checkpoints(parts)       # c
        results = []
        for pp in plan_.partitions:
            for a, b in pp.gaps:
                log.error("restore %s/%s[%d] into %s: positions %d-%d (%d) are missing from "
                          "the archive and skipped", self.request.source_region,
                          self.request.topic, pp.partition, self.request.to_topic, a, b,
                          b - a + 1)
                if self.progress is not None:
                    self.progress.gaps.append((pp.partition, a, b))
            if pp.first is None or pp.last is None:
                continue  # no segment at all (refused unless gaps are allowed)
            results.append(self._run_partition(pp.partition, pp.first, pp.last,
                                               list(pp.steps), checkpoints.get(pp.partition)))
        return results

    def _run_partition(self, partition: int, first: int, last: int, steps: list[Step],
                       cp: Checkpoint | None) -> PartitionResult:
        req = self.request
        where = f"{req.source_region}/{req.topic}[{partition}] into {req.to_topic}"
        result = PartitionResult(partition)
        done = first - 1
        if cp is not None:
            if cp.origin != first:
                raise RestoreError(
                    f"{where}: a restore of another range (from offset {cp.origin}) already "
                    f"wrote into {req.to_topic} up to offset {cp.offset} (checkpoint "
                    f"{req.checkpoint_key(partition)}); restore into another topic, or delete "
                    "that checkpoint first")
            done = cp.offset
            result.resumed_after = done
            if self.progress is not None:
                self.progress.resumed[partition] = done
            log.info("%s: resuming after offset %d (checkpoint)", where, done)
        if done >= last:
            log.info("%s: already restored up to %d", where, last)
            return result
        for step in steps:
            if step.last <= done:
                self._count_skipped_step(step)
                continue
            done = self._run_step(partition, step, done, first, result)
        if done < last:
            # The rest of the range is a gap (or filtered by time): record the end reached.
            self._deliver(partition, None, self._checkpoint(last, "", first))
        log.info("%s: restored %d record(s) (offsets %d-%d)", where, result.records, first, last)
        return result

    def _count_skipped_step(self, step: Step) -> None:
        if self.progress is not None:
            self.progress.bytes_read += step.segment.size

    def _checkpoint(self, offset: int, segment: str, origin: int) -> Checkpoint:
        return Checkpoint(offset, segment, datetime.now(UTC), origin=origin)

    def _run_step(self, partition: int, step: Step, done: int, origin: int,
                  result: PartitionResult) -> int:
        """Restore ``step`` after ``done``; returns the last offset it covers. Checkpoints
        carry ``origin`` (the first offset of the partition's range).
        """
        rng = self.request.range
        key = step.segment.key
        with open_segment(self.store, key) as reader:
            pending: list[pa.RecordBatch] = []
            n = 0
            for batch in reader.iter_batches(self.request.batch_records):
                cut = _cut(batch, max(done + 1, step.first), step.last, rng)
                if cut is None:
                    continue
                kept, filtered = cut
                self._skipped(filtered)
                if kept.num_rows:
                    pending.append(kept)
                    n += kept.num_rows
                if n >= self.request.batch_records:
                    last = int(pending[-1].column("offset")[-1].as_py())
                    self._send(partition, pending, self._checkpoint(last, key.to_key(), origin),
                               result)
                    done, pending, n = last, [], 0
            # The step's end: its last position is restored (or was filtered out).
            self._send(partition, pending, self._checkpoint(step.last, key.to_key(), origin),
                       result)
        if self.progress is not None:
            self.progress.bytes_read += step.segment.size
            self._report()
        return step.last

    def _skipped(self, n: int) -> None:
        if self.progress is not None:
            self.progress.skipped += n

    def _send(self, partition: int, batches: list[pa.RecordBatch], cp: Checkpoint,
              result: PartitionResult) -> None:
        batch = pa.Table.from_batches(batches).combine_chunks().to_batches()[0] \
            if len(batches) > 1 else (batches[0] if batches else None)
        if batch is not None and batch.num_rows == 0:
            batch = None
        raw = 0 if batch is None else raw_size_of_batch(batch)
        if self._bucket is not None and raw:
            wait = self._bucket.take(raw, self._clock())
            if wait > 0:
                self._sleep(wait)
        self._deliver(partition, batch, cp)
        n = 0 if batch is None else batch.num_rows
        result.records += n
        if self.progress is not None:
            self.progress.records += n
            self.progress.raw_bytes += raw
            self._report()

    def _report(self) -> None:
        if self._on_progress is not None and self.progress is not None:
            self._on_progress(self.progress)

    def close(self) -> None:
        """Release the producer (idempotent)."""
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None


def _cut(batch: pa.RecordBatch, first: int, last: int, rng: RestoreRange
         ) -> tuple[pa.RecordBatch, int] | None:
    """The records of ``batch`` at offsets ``first..last`` and inside the time bounds, and
    how many in the offset window the time bounds dropped; ``None`` when the batch lies
    outside the window.
    """
    if batch.num_rows == 0:
        return None
    offsets = batch.column("offset")
    if offsets[batch.num_rows - 1].as_py() < first or offsets[0].as_py() > last:
        return None
    mask = pc.and_(pc.greater_equal(offsets, pa.scalar(first, pa.int64())),
                   pc.less_equal(offsets, pa.scalar(last, pa.int64())))
    window = batch.filter(mask)
    if not rng.timed:
        return window, 0
    ts = window.column("timestamp").cast(pa.int64())
    keep = pa.array([True] * window.num_rows)
    if rng.from_time is not None:
        keep = pc.and_(keep, pc.greater_equal(ts, pa.scalar(rng.from_time, pa.int64())))
    if rng.to_time is not None:
        keep = pc.and_(keep, pc.less_equal(ts, pa.scalar(rng.to_time, pa.int64())))
    kept = window.filter(keep)
    return kept, window.num_rows - kept.num_rows


def _records(batch: pa.RecordBatch
             ) -> Iterator[tuple[int, bytes | None, bytes | None,
                                 list[tuple[str, bytes | None]] | None]]:
    """``(timestamp, key, value, headers)`` per record, ready to produce. A source record
    without a timestamp gets ``0`` (the producer stamps its own time).
    """
    ts = batch.column("timestamp").cast(pa.int64()).to_pylist()
    types = batch.column("timestamp_type").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = batch.column("headers").to_pylist()
    for t, ty, k, v, h in zip(ts, types, keys, values, headers, strict=True):
        yield (0 if ty == TIMESTAMP_NOT_AVAILABLE else t, k, v,
               [(x["key"], x["value"]) for x in h] if h else None)
