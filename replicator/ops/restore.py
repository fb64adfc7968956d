"""``replicator restore``: replay a range of the archive into a topic, exactly once
(docs/restore.md; docs/architecture.md, "Checkpoints" and
"Durability").

The plan comes from ``replicator.ops.restore_plan`` (pure); this module lists the archive,
reads footers for record times when the range is bounded by time, and runs the plan with
its own durability method (``Restorer._deliver``): one transaction per batch holding the
records and a checkpoint under a key naming the whole request, so an interrupted restore
(even ``kill -9``) run again resumes after its last committed batch and produces nothing
twice, and another range into the same topic is another restore (``overlap_refusals``
says when it may repeat records). What the target topic must be is
``replicator.ops.restore_target``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.base import TIMESTAMP_NOT_AVAILABLE
from formats.segment_io import open_segment, raw_size_of_batch, timestamp_range
from replicator.core.batch_limits import batch_size_for, message_limit
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
from replicator.core.topic_copy import existing_partitions, read_topic_meta
from replicator.ops import restore_request
from replicator.ops.pace import Progress, TokenBucket
from replicator.ops.restore_plan import ArchivedSegment, Plan, RestoreRange, Step, plan, with_times
from replicator.ops.restore_request import (
    RestoreError,
    RestoreMark,
    RestoreRefused,
    RestoreRequest,
    incarnation_refusals,
    overlap_refusals,
)
from replicator.ops.restore_target import (
    CREATED_TOPIC_CONFIGS,
    HEADER_OVERHEAD,
    RECORD_OVERHEAD,
    RecordFacts,
    finite_retention,
    needs_largest,
    needs_null_keys,
    source_shape,
    target_issues,
)

log = logging.getLogger(__name__)

TXN_TIMEOUT = 60.0
"""Seconds a transaction call may take (commit waits for every record of the batch)."""

ABORTABLE_RETRIES = 5
"""Times a batch is redone after the broker asked to abort its transaction."""


# --- planning ---------------------------------------------------------------------------


def list_archive(store: ObjectStore, prefix: str, region: str, topic: str,
                 incarnation: str = "") -> list[ArchivedSegment]:
    """The segments (every level) of one incarnation of the topic (its label: ``""`` for
    the first one, ``replicator.ops.incarnations``) as the listing describes them; another
    incarnation's are never mixed in.
    """
    out = []
    for o in store.list(topic_prefix(prefix, region, topic)):
        key = SegmentKey.try_parse(o.key)
        if key is not None and key.incarnation == incarnation:
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
              note: Callable[[str], None] = log.info,
              listed: Collection[SegmentKey] | None = None) -> Plan:
    """List the archive and plan ``request``; with time bounds, read the chosen segments'
    footers for their record times (and, for segments without them, the records: ``note``
    tells the user) and plan again. ``listed``: only these segments (the data files of
    the table snapshot ``request.snapshot``), those no longer in the bucket named as the
    plan's ``missing``.
    """
    segments = list_archive(store, prefix, request.source_region, request.topic,
                            request.incarnation)
    p = plan(segments, request.range, request.partitions, listed=listed,
             snapshot=request.snapshot)
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
    return plan(with_times(segments, times), request.range, request.partitions, listed=listed,
                snapshot=request.snapshot)


def record_facts(store: ObjectStore, plan_: Plan, *, oldest: bool, scan: bool) -> RecordFacts:
    """What the records ``plan_`` restores need of the target (``restore_target``); the
    bytes per partition come from the plan.

    ``oldest`` reads the steps' footers (a segment without footer times: its records) for
    the smallest timestamp (a bound: a segment's oldest record may lie outside the step,
    and the time bounds raise it); ``scan`` reads the records of every step for the
    largest record and those without a key.
    """
    rng = plan_.range
    per_part: dict[int, int] = {}
    for step in plan_.steps:
        per_part[step.segment.key.partition] = \
            per_part.get(step.segment.key.partition, 0) + step.est_bytes
    most = max(per_part.items(), key=lambda kv: kv[1], default=None)
    low: int | None = None
    if oldest:
        for step in plan_.steps:
            found, _ = segment_times(store, step.segment.key)
            if found is not None:
                t = found[0] if rng.from_time is None else max(found[0], rng.from_time)
                low = t if low is None else min(low, t)
    if not scan:
        return RecordFacts(oldest=low, partition_bytes=most)
    largest, nulls = 0, 0
    first_null: tuple[int, int] | None = None
    for step in plan_.steps:
        with open_segment(store, step.segment.key) as reader:
            for batch in reader.iter_batches(50_000):
                cut = _cut(batch, step.first, step.last, rng)
                if cut is None or not cut[0].num_rows:
                    continue
                kept = cut[0]
                sizes = _record_sizes(kept)
                largest = max(largest, int(sizes.max()))
                missing = kept.column("key").is_null()
                n = int(pc.sum(missing, min_count=0).as_py())
                if n and first_null is None:
                    at = int(pc.index(missing, pa.scalar(True)).as_py())
                    first_null = (step.segment.key.partition,
                                  int(kept.column("offset")[at].as_py()))
                nulls += n
    return RecordFacts(oldest=low, largest=largest, null_keys=nulls,
                       first_null_key=first_null, partition_bytes=most)


def _record_sizes(batch: pa.RecordBatch) -> np.ndarray:
    """Per record, the bytes of a batch holding only it: key, value, headers, overheads."""
    def lengths(arr: pa.Array) -> np.ndarray:
        return np.asarray(pc.fill_null(pc.binary_length(arr), 0), dtype=np.int64)

    headers = batch.column("headers")
    flat = headers.flatten()
    owner = np.asarray(pc.list_parent_indices(headers), dtype=np.int64)
    per_header = lengths(flat.field("key")) + lengths(flat.field("value")) + HEADER_OVERHEAD
    header_bytes = np.bincount(owner, weights=per_header, minlength=batch.num_rows)
    sizes: np.ndarray = (lengths(batch.column("key")) + lengths(batch.column("value"))
                         + header_bytes.astype(np.int64) + RECORD_OVERHEAD)
    return sizes


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
    b. the restore checkpoints of every planned partition are read: a range overlapping
       one that another restore already wrote into the target is refused
       (``overlap_refusals``) before anything is produced.

    Then partition by partition:

    c. a transactional producer registers the partition's ``transactional_id``: an earlier
       writer of that target partition is fenced and its open transaction aborted;
    d. the partition's checkpoints are read again (after the fence, so nothing the fenced
       writer committed is missed), overlaps checked again, and the partition resumes
       after its own checkpoint (the key of this very request).

    Every batch goes through ``_deliver``, the one durability method.
    """

    def __init__(self, kafka: KafkaSettings, store: ObjectStore, prefix: str,
                 request: RestoreRequest, *, progress: Progress | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time,
                 note: Callable[[str], None] = log.info) -> None:
        self.kafka = kafka
        self.store = store
        self.prefix = prefix
        self.request = request
        self.progress = progress
        self._on_progress = on_progress
        self._clock = clock
        self._sleep = sleep
        self._wall = wall
        self._note = note
        self._bucket = None if request.rate is None else \
            TokenBucket(request.rate, now=clock())
        self._producer: Producer | None = None
        self._target_limit: int | None = None
        """The target topic's max.message.bytes (read by ``check_target``)."""
        self._times: dict[int, tuple[int, int] | None] = {}
        """Per partition: the time span of the records restored so far (its checkpoint's)."""

    # Steps a-d -------------------------------------------------------------------------

    def prepare_topics(self, plan_: Plan) -> None:
        """Step a: the checkpoint topic and the destination topic exist, and the
        destination keeps the restored records as they are.

        A missing destination is created with the source's partition count and copied
        configs, then ``CREATED_TOPIC_CONFIGS`` (no retention, no compaction, CreateTime),
        and ``note`` says so. Then the destination's effective configs are checked
        (``restore_target.target_issues``), whether created or not.

        Raises:
            RestoreError: the destination exists with too few partitions.
            RestoreRefused: a config of the destination would reject, change or delete
                restored records (the acceptable ones pass with
                ``request.accept_target_config``).
        """
        req = self.request
        admin = Admin(self.kafka)
        ensure_compacted_topic(admin, req.checkpoint_topic, "checkpoint topic")
        wanted = max((p.partition for p in plan_.partitions), default=0) + 1
        meta = read_topic_meta(self.store, self.prefix, req.source_region, req.topic)
        shape = source_shape(meta, req.incarnation)
        have = existing_partitions(admin, req.to_topic)
        if have is None:
            count = max(wanted, shape.partitions)
            copied = shape.configs
            configs = {**copied, **CREATED_TOPIC_CONFIGS}
            if admin.create_topic(req.to_topic, count, configs):
                changed = ", ".join(f"{k}={v}" + (f" (the source has {copied[k]})"
                                                  if k in copied and copied[k] != v else "")
                                    for k, v in CREATED_TOPIC_CONFIGS.items())
                self._note(f"created topic {req.to_topic} with {count} partition(s) and the "
                           f"source's configs but {changed}, so the broker deletes no "
                           "restored record and keeps their timestamps: change them once "
                           "done with the records" + (
                               "" if shape.configs_known else
                               " (the configs of the earlier incarnation read are not "
                               "recorded, so none of the live topic's were copied: the "
                               "broker's defaults apply)"))
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
        # The live topic's limit even for an earlier incarnation (whose configs are not
        # recorded): only what the check reads records for, never applied to the target.
        source_limit = None if meta is None or "max.message.bytes" not in meta.configs \
            else int(meta.configs["max.message.bytes"])
        self.check_target(plan_, admin.effective_topic_config(req.to_topic), source_limit)

    def check_target(self, plan_: Plan, config: Mapping[str, str],
                     source_limit: int | None) -> None:
        """Refuse a destination whose ``config`` would reject, change or delete restored
        records (``restore_target``), reading only what its configs make necessary.

        Raises:
            RestoreRefused: naming each setting.
        """
        req = self.request
        self._target_limit = message_limit(config)
        facts = record_facts(
            self.store, plan_, oldest=finite_retention(config) is not None,
            scan=needs_null_keys(config) or needs_largest(config, source_limit))
        issues = target_issues(req.to_topic, config, facts, int(self._wall() * 1000))
        refused = [i.message for i in issues if not (i.acceptable and req.accept_target_config)]
        for i in issues:
            if i.acceptable and req.accept_target_config:
                log.warning("restore into %s: %s (accepted: --accept-target-config)",
                            req.to_topic, i.message)
                self._note(f"accepted ({i.setting}): {i.message}")
        if refused:
            raise RestoreRefused([*refused, f"nothing was produced into {req.to_topic}"])

    def start_producer(self, partition: int) -> Producer:
        """Step c: register the target partition's transactional id (fences an earlier
        writer of that partition).
        """
        self.close()
        # Its batches fit the target topic's max.message.bytes (the broker refuses a larger
        # record batch, and librdkafka fills batches up to batch.size whatever the topic).
        size = batch_size_for(self.kafka.config, self._target_limit)
        p = Producer(self.kafka, transactional_id=self.request.transactional_id(partition),
                     name=f"restore into {self.request.to_topic}[{partition}]",
                     overrides=None if size is None else {"batch.size": size})
        p.init_transactions(TXN_TIMEOUT)
        self._producer = p
        return p

    def load_marks(self, partitions: list[int]) -> dict[int, dict[str, RestoreMark]]:
        """Steps b and d: the newest committed restore checkpoint of every restore of the
        source's ``partitions`` into the target (partition → key → mark).

        The checkpoint topic may be shared (ingress's): while another writer's transaction
        is open, read_committed stops at it. So, as ingress does: 1. read_uncommitted to the
        end for the offset after our newest record; 2. read_committed until the stable end
        has passed it.
        """
        prefixes = {self.request.checkpoint_prefix(p).encode(): p for p in partitions}

        def partition_of(key: bytes | None) -> int | None:
            return restore_request.partition_of(prefixes, key)

        need: dict[int, int] = {}
        for m in read_to_end(self.kafka, self.request.checkpoint_topic,
                             isolation="read_uncommitted", timeout=120, what="checkpoint topic"):
            if partition_of(m.key()) is not None and (part := m.partition()) is not None and \
                    (off := m.offset()) is not None:
                need[part] = max(need.get(part, 0), off + 1)
        out: dict[int, dict[str, RestoreMark]] = {p: {} for p in partitions}
        for m in read_to_end(self.kafka, self.request.checkpoint_topic,
                             isolation="read_committed", ends_at_least=need, timeout=120,
                             what="checkpoint topic"):
            key = m.key()
            part = partition_of(key)
            if part is None or key is None:
                continue
            name = key.decode()
            value = m.value()
            if value is None:
                out[part].pop(name, None)  # a tombstone: the restore was reset
                continue
            try:
                out[part][name] = RestoreMark.decode(value)
            except ValueError as e:
                log.error("invalid restore checkpoint %s ignored: %s", name, e)
        return out

    # The durability method --------------------------------------------------------------

    def _deliver(self, partition: int, batch: pa.RecordBatch | None, mark: RestoreMark) -> None:
        """Restore one batch exactly once.

        1. Begin a transaction.
        2. Produce the batch's records to ``partition`` of the destination: key, value
           (null stays null), headers in order, the source timestamp as CreateTime.
        3. Flush: the records are in the log before their checkpoint is sent.
        4. Produce the checkpoint (``mark``: the last source offset this batch covers, the
           time span restored so far) under the request's key in the checkpoint topic,
           and commit: records and checkpoint become visible together or not at all.

        A batch whose transaction the broker asks to abort is redone (up to
        ``ABORTABLE_RETRIES`` times). Any other failure aborts and raises: the next run
        resumes after the last committed checkpoint.

        Raises:
            RestoreError: fenced by a newer writer of the same target partition.
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
                p.produce(self.request.checkpoint_topic, mark.encode(),        # Step 4
                          self.request.checkpoint_key(partition).encode())
                p.commit_transaction(TXN_TIMEOUT)
                return
            except ProducerFenced as e:
                raise RestoreError(
                    f"another restore into {to}[{partition}] took over (transactional id "
                    f"{self.request.transactional_id(partition)}); this one stops") from e
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

        Raises:
            RestoreRefused: the range overlaps one already restored into the target
                (without ``request.force``); nothing was produced.
        """
        self.prepare_topics(plan_)                       # a
        parts = [p.partition for p in plan_.partitions if p.first is not None]
        marks = self.load_marks(parts)
        refusals = incarnation_refusals(self.request, plan_, marks) + \
            overlap_refusals(self.request, plan_, marks)  # b
        if refusals:
            raise RestoreRefused(refusals)
        results: list[PartitionResult] = []
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
            self.start_producer(pp.partition)           # c
            marks = self.load_marks([pp.partition])      # d
            # Another restore may have written between b and the fence of c.
            one = Plan(plan_.range, (pp,))
            refusals = incarnation_refusals(self.request, one, marks) + \
                overlap_refusals(self.request, one, marks)
            if refusals:
                raise RestoreRefused([*refusals, "partitions restored before this was found: "
                                      f"{[r.partition for r in results] or 'none'}"])
            own = marks[pp.partition].get(self.request.checkpoint_key(pp.partition))
            results.append(self._run_partition(pp.partition, pp.first, pp.last,
                                               list(pp.steps), own))
        return results

    def _run_partition(self, partition: int, first: int, last: int, steps: list[Step],
                       cp: RestoreMark | None) -> PartitionResult:
        req = self.request
        where = f"{req.source_region}/{req.topic}[{partition}] into {req.to_topic}"
        result = PartitionResult(partition)
        done = first - 1
        self._times[partition] = None
        if cp is not None:
            done = max(done, self._resume(partition, first, cp, where))
            self._times[partition] = cp.times
            result.resumed_after = cp.offset
            if self.progress is not None:
                self.progress.resumed[partition] = cp.offset
            log.info("%s: resuming after offset %d (checkpoint)", where, cp.offset)
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
            self._send(partition, [], last, "", first, result)
        log.info("%s: restored %d record(s) (offsets %d-%d)", where, result.records, first, last)
        return result

    def _resume(self, partition: int, first: int, cp: RestoreMark, where: str) -> int:
        """The last position this request restored (its checkpoint ``cp``), checked against
        the range as the archive holds it now (with an open ``--from-offset`` its start
        may have moved).

        Raises:
            RestoreError: the archive now starts before the checkpoint's origin, or after
                its offset (positions never restored, unless gaps are allowed).
        """
        req = self.request
        if cp.origin > first:
            raise RestoreError(
                f"{where}: this restore started at offset {cp.origin} (checkpoint "
                f"{req.checkpoint_key(partition)}) but the archive now holds the range from "
                f"{first}: restore into another topic, or delete that checkpoint")
        if cp.offset + 1 < first:
            # The archive's start moved past what this restore reached (an open
            # --from-offset): those positions can no longer be restored.
            if not req.allow_gaps:
                raise RestoreError(
                    f"{where}: positions {cp.offset + 1}-{first - 1} are no longer in the "
                    "archive and this restore had not reached them (--allow-gaps skips them)")
            log.error("%s: positions %d-%d are no longer in the archive and skipped",
                      where, cp.offset + 1, first - 1)
            if self.progress is not None:
                self.progress.gaps.append((partition, cp.offset + 1, first - 1))
        return cp.offset

    def _count_skipped_step(self, step: Step) -> None:
        if self.progress is not None:
            self.progress.bytes_read += step.segment.size

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
                    self._send(partition, pending, last, key.to_key(), origin, result)
                    done, pending, n = last, [], 0
            # The step's end: its last position is restored (or was filtered out).
            self._send(partition, pending, step.last, key.to_key(), origin, result)
        if self.progress is not None:
            self.progress.bytes_read += step.segment.size
            self._report()
        return step.last

    def _skipped(self, n: int) -> None:
        if self.progress is not None:
            self.progress.skipped += n

    def _send(self, partition: int, batches: list[pa.RecordBatch], last: int, segment: str,
              origin: int, result: PartitionResult) -> None:
        """Deliver ``batches`` (may be none) with the checkpoint ``last`` (the last position
        they cover) and the time span restored, theirs included.
        """
        batch = pa.Table.from_batches(batches).combine_chunks().to_batches()[0] \
            if len(batches) > 1 else (batches[0] if batches else None)
        if batch is not None and batch.num_rows == 0:
            batch = None
        raw = 0 if batch is None else raw_size_of_batch(batch)
        if self._bucket is not None and raw:
            wait = self._bucket.take(raw, self._clock())
            if wait > 0:
                self._sleep(wait)
        times = self._times.get(partition)
        if batch is not None:
            lo, hi = timestamp_range(batch)
            times = (lo, hi) if times is None else (min(times[0], lo), max(times[1], hi))
        mark = RestoreMark(self.request.range, origin, last, segment, times, datetime.now(UTC))
        self._deliver(partition, batch, mark)
        self._times[partition] = times
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
