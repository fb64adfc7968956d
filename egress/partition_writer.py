"""One assigned partition: its open segment, its closing segments, and the durability method.

Threads: the poll thread appends messages, decides rotation and owns every state change
(``append``, ``close``, ``rewind``). Slow work (multipart parts, row-group encoding,
completing, copying, deleting, committing) runs as tasks on the shared upload pool through
this partition's ``SerialQueue``, so one partition's tasks run in order while a stuck
partition never blocks the poll loop or the others. Workers report outcomes through
``report`` (drained by the poll thread).

A failed segment aborts its upload (nothing visible) and *breaks* the partition: every later
queued task of the partition aborts too, and once the queue is idle the controller rewinds
the consumer to the failed segment's start (``rewind``). Nothing was committed past it, so
re-reading from there is always correct.

Parts of the writer live in modules of their own: its first positions and the commits no
segment carries (``egress.writer_positions``), the failure path up to the rewind
(``egress.writer_rewind``) and the incarnation of each segment it names
(``egress.writer_incarnation``); what the writers share is ``egress.writer_context``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import pyarrow as pa

from egress.commits import Commit, NotOwner
from egress.encode_gate import EncodeCancelled
from egress.epoch_ids import EpochIds, IncarnationChanged
from egress.flow import MAX_FLUSH_BYTES, encode_reservation
from egress.metrics import PartitionMetrics
from egress.recreate_loss import SourceEnds, source_end
from egress.rotation import (
    CloseReason,
    SegmentLimits,
    decide_start,
    should_rotate,
)
from egress.segment import Segment, SegmentOutcome, SegmentState
from egress.writer_context import Cancelled, WriterContext
from egress.writer_incarnation import ID_CHANGE_HOLD, WriterIncarnation
from egress.writer_positions import WriterPositions
from egress.writer_rewind import WriterRewind
from formats.base import BATCH_OVERHEAD, SegmentMetadata
from formats.parquet import ENCODE_UNIT
from formats.segment_io import (
    Published,
    SegmentUpload,
    largest_row_bytes,
    publish_segment,
)
from replicator.core.errors import ReplicatorError, RetriableError
from replicator.core.kafka import Message
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.queues import SerialQueue
from replicator.core.retry import retry
from replicator.core.storage import ObjectInfo

__all__ = ["FLUSH_BYTES", "FLUSH_ROWS", "Cancelled", "PartitionWriter", "WriterContext"]
"""``Cancelled`` and ``WriterContext`` live in ``egress.writer_context``; importable here as
before."""

log = logging.getLogger(__name__)

T = TypeVar("T")


# Column lists become one Arrow batch at about this size: big enough that per-batch costs
# (array construction, a GroupBuffer entry) vanish, small enough that a poll thread does not
# hold much more than one batch per partition before the worker encodes it.
FLUSH_ROWS = 8192
FLUSH_BYTES = MAX_FLUSH_BYTES
"""The default of ``PartitionWriter.flush_bytes``; the poll loop lowers it with many
partitions (``egress.flow.flush_bytes``)."""


class PartitionWriter(WriterPositions, WriterRewind, WriterIncarnation):
    """Streams one partition's messages into segments and makes them durable in order.

    Args:
        ref: the partition (prefix/region/topic/partition of its keys).
        limits: rotation thresholds of the topic.
        expected: where the partition's next segment starts (the committed offset, or
            the start its commit metadata names when records before the committed offset
            were skipped), or ``None`` when the group has no commit for it.
        ctx: shared store, format, pool, clocks.
        metrics: this partition's metric children.
        commit: commits ``offset`` (the next offset to read) for this partition, with the
            next segment's start, synchronously; raises ``ReplicatorError``.
        position: the offset the consumer fetches from (the committed offset); default
            ``expected``.
        topic_id: the source topic's id when the partition was assigned (``None``: read
            before the first segment is named).
        resumed: whether ``expected`` continues segments written before (a resume from a
            commit), as opposed to a start chosen for the partition (``start = "latest"``
            or a time, ``commit_start``, or a commit that marks one); default: whether
            ``expected`` is set.

    Incarnations: each segment belongs to an *epoch* of the writer, which a reset (the
    source partition's offsets went back: the topic was deleted and created again) moves
    on; the topic id of an epoch is read once, before the epoch's first segment is named,
    so segments of the earlier topic still closing keep its id. The id is read again when
    each segment is named: a different one while no reset came after the segment means the
    topic was deleted and created again while its records were fetched without offsets
    going back (a fetch that went
    on, a rewind into the new log), so which topic each came from cannot be told
    (``IncarnationChanged``): the segment is dropped with an ERROR naming its range,
    counted as lost, and the partition is read again from the new topic's oldest record
    in a new epoch.
    """

    def __init__(self, ref: PartitionRef, limits: SegmentLimits, expected: int | None, *,
                 ctx: WriterContext, metrics: PartitionMetrics, commit: Commit,
                 position: int | None = None, topic_id: str | None = None,
                 resumed: bool | None = None) -> None:
        self.ref = ref
        self.limits = limits
        self.expected = expected
        self.ctx = ctx
        self.metrics = metrics
        self._commit = commit
        self.name = f"{ref.topic}[{ref.partition}]"
        self.segment: Segment | None = None
        self.closing: list[Segment] = []
        self.queue = SerialQueue(ctx.pool, self.name)
        self.broken = threading.Event()
        self.cancel = threading.Event()
        self.failed: Segment | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.next_offset: int | None = expected
        self.position: int | None = expected if position is None else position
        """The offset after the last record fetched, kept or skipped (``[egress]
        skip_origins``); every record from ``next_offset`` up to it was skipped."""
        self.committed_offset: int | None = self.position
        self._skip_commit_at = 0.0
        self.resumed = expected is not None if resumed is None else resumed
        self._first_recorded = ctx.first_positions is None
        self.flush_bytes = FLUSH_BYTES
        """Held bytes of buffered rows at which they become one batch (poll thread)."""
        self.epoch = 0
        self.ids = EpochIds(ref.topic, self.name, ctx.incarnations, wall=ctx.wall,
                            retry=self._retry, topic_id=topic_id)
        """The topic id of each epoch (``egress.epoch_ids``)."""
        self._epoch_starts: dict[int, int] = {}
        """Where each epoch after a reset began reading (poll thread)."""
        self.appends = 0
        """Runs appended (poll thread): a segment held at naming watches it."""
        self.source_ends = SourceEnds()
        """Each epoch's topic's known end: what a switch away from it can have lost."""
        self.hold_seconds = ID_CHANGE_HOLD
        self._switch_to: str | None = None
        """The id of a topic created again that the next rewind moves to (workers set it
        before the failure they report; the poll thread reads it at the rewind)."""

    @property
    def topic_id(self) -> str | None:
        """The current epoch's topic id, once read (heartbeats)."""
        return self.ids.get(self.epoch)

    # --- poll thread ------------------------------------------------------------------

    def append(self, msgs: Sequence[Message], now: float) -> int:
        """Append one run of this partition's messages (offset order); returns their raw
        bytes (key + value + headers), 0 when they were dropped.
        """
        if self.broken.is_set() or self.failed is not None:
            # Rewinding: these are re-read after the seek to the failed segment's start.
            self.metrics.dropped.inc(len(msgs))
            return 0
        self.appends += 1
        total = 0
        i, n = 0, len(msgs)
        limits = self.limits
        while i < n:
            seg = self.segment
            if seg is None:
                seg = self._open(msgs[i], now)
            # Limits are exact to the message: the run is split where the segment reaches
            # max_segment_messages or max_segment_size.
            chunk = msgs[i:i + limits.max_messages - seg.count]
            taken, raw = seg.columns.add(chunk, limits.max_bytes - seg.raw_bytes)
            seg.count += taken
            seg.raw_bytes += raw
            seg.end = seg.columns.offsets[-1]
            i += taken
            self.metrics.messages.inc(taken)
            self.metrics.bytes.inc(raw)
            total += raw
            if len(seg.columns) >= FLUSH_ROWS or seg.columns.held_bytes >= self.flush_bytes:
                self._flush(seg)
            reason = should_rotate(seg.stats(), limits, now)
            if reason is CloseReason.COUNT or reason is CloseReason.SIZE:
                self.close(reason)
        self.next_offset = self.expected if self.segment is None else self.segment.end + 1
        last = msgs[-1].offset()
        if last is not None and (self.position is None or last >= self.position):
            self.position = last + 1
        return total

    def note_source_end(self, high: int, consumer_position: int | None) -> None:
        """The partition's high watermark after a fetch and the consumer's position
        (``None``: unknown): the source's end in this epoch (``egress.recreate_loss``).
        """
        # A run dropped while rewinding left ``position`` behind: the watermark alone then.
        dropping = self.broken.is_set() or self.failed is not None
        end = source_end(high, consumer_position, None if dropping else self.position)
        if end is not None:
            # A dropped run's records came after any id read: never an idle fetch's.
            # Nothing handed out yet since the assignment or a seek: the client's position
            # is unknown, the writer's is where it reads from.
            reached = [p for p in (consumer_position, self.position) if p is not None]
            idle = max(reached, default=-1) >= high
            self.source_ends.note(self.epoch, -1 if dropping else self.appends, end,
                                  idle=idle)

    def skipped_to(self, position: int) -> None:
        """The records up to ``position`` (exclusive) after the last appended one were
        skipped (``[egress] skip_origins``): the consumer's position moved past them
        (poll thread).
        """
        if self.broken.is_set() or self.failed is not None:
            return      # rewinding: they are read again
        if self.position is None or position > self.position:
            self.position = position

    def _open(self, first: Message, now: float) -> Segment:
        first_offset = first.offset()
        assert first_offset is not None
        # A hole before the first record is not loss by itself (transaction markers,
        # aborted or compacted-away records): records deleted under the consumer are
        # reported when the broker says the position left the log
        # (``position_left_the_log``), so nothing is asked of the broker here.
        decision = decide_start(self.expected, first_offset)
        if decision.reset:
            resume = self.expected
            recreated = self._new_epoch(decision.start)
            if recreated is not None:
                log.warning("%s: first record at offset %d is before the resume position "
                            "%d: the source topic was deleted and created again (%s); its "
                            "segments restart at %d in a location of their own",
                            self.name, first_offset, resume, recreated, decision.start)
            else:
                log.error("%s: first record at offset %d is before the resume position %d: "
                          "the source partition was truncated or recreated; segments "
                          "restart at %d", self.name, first_offset, resume, decision.start)
        seg = Segment(decision.start, now)
        seg.epoch = self.epoch
        self.segment = seg
        return seg

    def position_left_the_log(self, position: int, log_start: int) -> None:
        """The source no longer holds ``position``, the next offset this partition would
        read; the consumer now reads from ``log_start`` (poll thread).

        Records from ``position`` up to the log start were deleted (retention,
        DeleteRecords) before egress read them: ERROR with the exact range, counted in
        ``egress_source_lost_messages_total``. The segments still touch (the next records
        continue the open segment, or the next segment starts at the expected position), so
        ingress sees no gap and the loss is reported once, here, where it is exact. A
        position beyond the log (the partition was truncated or recreated) closes the open
        segment, so the next one restarts at the first record (``decide_start``).
        """
        if log_start > position:
            lo, hi = position, log_start - 1
            log.error("%s: offsets %d..%d (%d positions) were deleted at the source before "
                      "egress read them (retention); reading on from the log start %d",
                      self.name, lo, hi, hi - lo + 1, log_start)
            self.metrics.lost.inc(hi - lo + 1)
            return
        self.close(CloseReason.RESET)
        recreated = self._new_epoch(log_start)
        # The next segment starts at the log start: the reset is this one (its first
        # record would otherwise be "before the resume position" of the earlier log, a
        # second reset and a second epoch of the same id).
        self.position = self.expected = log_start
        if recreated is not None:
            log.warning("%s: position %d is beyond the source log, which starts at %d: the "
                        "source topic was deleted and created again (%s); reading the new "
                        "topic from its start", self.name, position, log_start, recreated)
        else:
            log.error("%s: position %d is beyond the source log, which starts at %d: the "
                      "partition was truncated or recreated; reading on from its start",
                      self.name, position, log_start)

    def _new_epoch(self, start: int) -> str | None:
        """The partition's offsets went back (poll thread): a new epoch reading from
        ``start``, its topic id read now.

        Returns:
            ``"topic id A, then B"`` when both epochs' ids are known and differ: a topic
            deleted and created again, archived as a new incarnation (nothing of the
            earlier one is lost or overwritten, so a WARNING); ``None`` otherwise (the same
            id: the log was truncated under egress; or an id unknown), which is an ERROR.
        """
        before = self.ids.get(self.epoch)
        self.epoch += 1
        self._epoch_starts[self.epoch] = start
        self._went_back()
        self.ids.read_at_reset(self.epoch)
        after = self.ids.get(self.epoch)
        if before is None or after is None or before == after:
            return None
        return f"topic id {before}, then {after}"

    def _went_back(self) -> None:
        """The consumer's position went back with a reset (poll thread): the position and
        the offset committed so far are the earlier log's, never a bound for the new one's
        (a segment's commit goes up to the position: kept, it would commit the new log
        past records not read yet).
        """
        self.position = None
        self.committed_offset = None

    def _flush(self, seg: Segment) -> None:
        if not len(seg.columns):
            return
        batch = seg.columns.take()
        # Its buffers and its own objects (many small batches with tiny records).
        size = batch.nbytes + BATCH_OVERHEAD
        seg.submitted += size
        self.queue.submit(lambda: self._write(seg, batch, size))

    def close(self, reason: CloseReason) -> Segment | None:
        """Close the open segment (if any) and queue its durability task."""
        seg = self.segment
        if seg is None:
            return None
        self.segment = None
        self._flush(seg)
        seg.reason = reason
        seg.state = SegmentState.CLOSING
        # Records after the segment's last one up to the consumer's position were all
        # skipped (any other would be in the segment): the commit goes past them.
        seg.commit_to = max(seg.end + 1, self.position or 0)
        self.expected = seg.end + 1
        self.closing.append(seg)
        self.queue.submit(lambda: self.make_durable(seg))
        return seg

    def discard_open(self) -> None:
        """Drop the open segment without writing it (its queued writes abort)."""
        seg = self.segment
        if seg is None:
            return
        self.segment = None
        seg.columns.take()
        seg.state = SegmentState.ABORTED
        self.queue.submit(lambda: self._abort(seg))

    def held_bytes(self) -> tuple[int, int]:
        """(bytes held by the open segment, bytes held by closing segments)."""
        open_ = self.segment.held_bytes() if self.segment is not None else 0
        return open_, sum(s.held_bytes() for s in self.closing)

    def backlog_bytes(self) -> int:
        """Bytes handed to the worker and not yet encoded, over all segments."""
        n = self.segment.backlog_bytes() if self.segment is not None else 0
        return n + sum(s.backlog_bytes() for s in self.closing)

    # --- workers ----------------------------------------------------------------------

    def _write(self, seg: Segment, batch: pa.RecordBatch, size: int) -> None:
        try:
            if self.broken.is_set() or seg.state is SegmentState.ABORTED \
                    or self.cancel.is_set():
                return
            if seg.upload is None:
                self._open_upload(seg)
            upload = seg.upload
            assert upload is not None
            seg.largest_row = max(seg.largest_row, largest_row_bytes(batch))
            # The batch may complete a row group, which is encoded and sent now.
            with self._encoding(upload.encoded_by(batch), seg.largest_row):
                upload.write_batch(batch)
        except EncodeCancelled:
            return
        except ReplicatorError as e:
            self._fail(seg, "write", e)
        except Exception as e:
            # Not an error of ours (Arrow, a caller bug): fail the segment, never the worker.
            log.exception("%s: writing to the segment from %d failed", self.name, seg.start)
            self._fail(seg, "write", e)
        finally:
            seg.written += size

    def _open_upload(self, seg: Segment) -> None:
        ctx = self.ctx
        seg.upload = self._retry(
            lambda: SegmentUpload(ctx.store, ctx.fmt, ctx.temp_prefix, ctx.options),
            f"{self.name}: open upload of the segment from {seg.start}")

    def make_durable(self, seg: Segment) -> None:
        """Make a closed segment durable, then commit past it (the durability method).

        1. Finish the segment: the writer flushes its last row group and the footer into
           the upload, and the upload is completed (the object exists, at its temp key).
        (Before step 2 of the partition's first segment, its first position is recorded
        in ``_topic.json``: ``egress.topic_meta``.)
        2. Copy the temp object to the final key
           ``SegmentKey(prefix, region, topic, partition, 0, start, end)`` with the level-0
           storage class (server-side; multipart above the copy threshold). From here on
           the segment is visible and complete.
        3. Delete the temp object. A failure only leaves garbage that the bucket's
           lifecycle rule for ``temp/`` expires; it does not stop the commit.
           (Steps 2 and 3 are ``formats.segment_io.publish_segment``, which compaction
           publishes its outputs with too.) With ``[egress.mirror]``, the segment's copy
           into the destination region's bucket is queued right after
           (``egress.mirror``); nothing after waits for it.
        4. Commit offset ``end + 1`` for this partition, synchronously (past it when the
           records after the segment were skipped: ``skip_origins``; the commit's metadata
           then says the next segment starts at ``end + 1``).

        Nothing is committed earlier. Steps 1-3 retry ``RetriableError`` with the retry
        policy; when steps 1-2 fail for good, or the partition is cancelled before step 2,
        the upload is aborted (nothing becomes visible), and the failure breaks the
        partition so it rewinds to ``start``.
        """
        if self.broken.is_set() or seg.state is SegmentState.ABORTED:
            self._abort(seg)
            return
        step = "incarnation"
        try:
            self._check_cancel()
            topic_id, label = self._incarnation(seg)
            key = SegmentKey(self.ref.prefix, self.ref.region, self.ref.topic,
                             self.ref.partition, 0, seg.start, seg.end, label)
            step = "finish"
            # Step 1: footer, last parts, complete the multipart upload (temp key).
            if seg.upload is None:
                self._open_upload(seg)
            upload = seg.upload
            assert upload is not None
            meta = SegmentMetadata.for_key(key, seg.count, created_by=self.ctx.options.created_by,
                                           created_at=self.ctx.wall(), topic_id=topic_id)
            info = self._retry(lambda: self._finish(seg, upload, meta),
                               f"{self.name}: finish {upload.temp_key}")
            seg.stored_bytes = info.size
            self._check_cancel()
            step = "first_position"
            self._record_start(seg, key)
            # Steps 2-3: copy to the final key with the level-0 storage class, then delete
            # the temp object (its failure is returned, not raised).
            step = "copy"
            temp_key, final = upload.temp_key, key.to_key()
            published = publish_segment(
                self.ctx.store, temp_key, key, self.ctx.storage_class,
                attempt=lambda fn, what: self._retry(fn, f"{self.name}: {what}"))
        except (Cancelled, EncodeCancelled):
            self._abort(seg)
            return
        except ReplicatorError as e:
            self._fail(seg, step, e)
            return
        except Exception as e:
            log.exception("%s: step %s of the segment from %d failed", self.name, step,
                          seg.start)
            self._fail(seg, step, e)
            return
        self._published(key, temp_key, published)
        if self.cancel.is_set():
            # Revoked past the shutdown timeout, or lost, while the copy ran: the partition
            # belongs to another writer now, which reads from the commit it found. Never
            # commit for it; the segment stays (an overlap with the new owner's segment,
            # which ingress tolerates).
            log.warning("%s: segment %s is durable but the partition is no longer assigned "
                        "here: offset %d not committed", self.name, final, seg.end + 1)
            seg.state = SegmentState.ABORTED
            self.ctx.report(SegmentOutcome(self, seg, SegmentState.ABORTED, key))
            return
        # Step 4: commit end + 1 (or past skipped records after it), synchronously.
        try:
            self._commit(seg.commit_to, seg.end + 1, topic_id=topic_id)
        except NotOwner as e:
            # Revoked or lost between the check above and the commit: as above.
            log.warning("%s: segment %s is durable; %s", self.name, final, e)
        except ReplicatorError as e:
            # The segment is durable; the next segment's commit covers this one. If the
            # partition moved to another member, it re-reads from the older commit and
            # writes an overlapping segment, which ingress tolerates.
            # A retriable failure (the group coordinator moved: a node of the cluster
            # restarting) is routine on a multi-node cluster: WARNING.
            level = logging.WARNING if isinstance(e, RetriableError) else logging.ERROR
            log.log(level, "%s: segment %s is durable but committing offset %d failed "
                    "(the next segment's commit covers it): %s", self.name, final,
                    seg.commit_to, e)
            self.metrics.commit_failures.inc()
        seg.state = SegmentState.COMMITTED
        self.metrics.segment_committed(str(seg.reason), seg.stored_bytes)
        log.info("%s: segment %s committed (%d messages, %d raw bytes, %d stored bytes, "
                 "reason %s), offset %d", self.name, final, seg.count, seg.raw_bytes,
                 seg.stored_bytes, seg.reason, seg.commit_to)
        self._release(seg)
        self.ctx.report(SegmentOutcome(self, seg, SegmentState.COMMITTED, key))

    def _published(self, key: SegmentKey, temp_key: str, published: Published) -> None:
        """After step 2: queue the mirror's copy, report a temp object left behind."""
        if self.ctx.mirror is not None:
            # The low-RPO mode: the segment is visible under its final key; its copy into
            # the destination bucket is queued, and nothing after waits for it.
            self.ctx.mirror(key)
        if published.temp_error is not None:
            log.warning("%s: temp object %s of segment %s stays behind (the lifecycle rule "
                        "expires it): %s", self.name, temp_key, key.to_key(),
                        published.temp_error)
            self.metrics.temp_leftovers.inc()

    def _finish(self, seg: Segment, upload: SegmentUpload, meta: SegmentMetadata) -> ObjectInfo:
        # The last row group is encoded and sent here (a retry only completes the upload).
        with self._encoding(upload.encoding_bytes, seg.largest_row):
            return upload.finish(meta)

    @contextmanager
    def _encoding(self, group_bytes: int, largest: int) -> Iterator[None]:
        """Hold the encoder's working memory from the budget while the block encodes and
        sends up to ``group_bytes`` (``egress.encode_gate``); waits until it is granted.
        """
        gate = self.ctx.gate
        size = encode_reservation(group_bytes, largest, ENCODE_UNIT)
        if gate is None or size <= 0:
            yield      # nothing encoded (the batch is only buffered), or no budget
            return
        with gate.reserve(size, self.cancel):
            yield

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Cancelled(f"{self.name}: cancelled")

    def _sleep(self, seconds: float) -> None:
        if self.cancel.wait(seconds):
            raise Cancelled(f"{self.name}: cancelled while waiting to retry")

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        return retry(fn, self.ctx.retry_policy, what=what, sleep=self._sleep)

    def _fail(self, seg: Segment, step: str, error: BaseException) -> None:
        if isinstance(error, IncarnationChanged) and seg.state is not SegmentState.FAILED:
            self._switch(seg, error)
        self.broken.set()
        already = seg.state is SegmentState.FAILED
        seg.state = SegmentState.FAILED
        self._abort_upload(seg)
        if already:
            return
        # A topic recreated under the segment: ``_switch`` logged what it lost, if anything.
        level = logging.WARNING if isinstance(error, (RetriableError, IncarnationChanged)) \
            else logging.ERROR
        log.log(level, "%s: segment from %d failed at step %s: %s", self.name, seg.start, step,
                error)
        self.metrics.segment_failed(step)
        self.ctx.report(SegmentOutcome(self, seg, SegmentState.FAILED, error=error, step=step))

    def _abort(self, seg: Segment) -> None:
        if seg.state is not SegmentState.FAILED:
            seg.state = SegmentState.ABORTED
        self._abort_upload(seg)
        log.info("%s: segment from %d (%d messages) aborted, nothing committed past %d",
                 self.name, seg.start, seg.count, seg.start)
        self.metrics.aborted.inc()
        self.ctx.report(SegmentOutcome(self, seg, SegmentState.ABORTED))

    def _abort_upload(self, seg: Segment) -> None:
        upload = seg.upload
        self._release(seg)
        if upload is None:
            return
        try:
            upload.abort()
        except ReplicatorError as e:
            log.warning("%s: aborting upload %s failed (the lifecycle rule removes it): %s",
                        self.name, seg.temp_key, e)

    @staticmethod
    def _release(seg: Segment) -> None:
        # Drop buffers so a finished segment holds no memory while its outcome is queued.
        seg.upload = None
