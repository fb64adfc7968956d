"""The replay of one segment for a ``ReplayWorker`` (``ingress.worker``): the worker's state
machine decides *which* segment to replay (``planner.next_action``); a ``SegmentReplayer``
opens it, reads and decodes its batches (capped by records and bytes, one read ahead) and
hands them to the session's delivery through the worker's ``Progress``, either one batch
at a time (``replay_segment``) or, over the process's shared transaction loop, parked
while its batch waits for the transaction (``begin`` / ``cont``). A segment that goes away
or turns out corrupt while read is reported and left to the inventory.

A record the destination may refuse (larger than its limit or the client's own, or the
record refused before: ``ingress.limits.isolate``) is handed over as a batch of its own,
once everything before it is durable, and nothing after it is handed over before it is
durable itself: a refusal stops the partition exactly at it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from formats.segment_io import SegmentStreamReader, open_segment
from ingress.checkpoint_writer import CheckpointWriter
from ingress.delivery import Delivery
from ingress.first_position import NOT_RECORDED, FirstPosition
from ingress.inventory import SegmentInventory
from ingress.limits import isolate
from ingress.metrics import IngressMetrics
from ingress.permits import BudgetRequest, ByteBudget
from ingress.progress import Progress
from ingress.rows import Rows, batch_rows, record_bytes, split_by_bytes, wire_sizes
from ingress.scheduler import WAIT
from ingress.worker_config import WorkerConfig
from replicator.core.clock import Clock
from replicator.core.errors import ObjectNotFound, ReplicatorError, SegmentCorrupt
from replicator.core.keys import SegmentKey
from replicator.core.queues import read_ahead
from replicator.core.storage import ObjectStore
from replicator.core.wire import Checkpoint

log = logging.getLogger(__name__)

PREFETCH_BATCHES = 1
"""Batches read and decoded ahead while the current one is delivered (memory: about two
batches per active replay)."""

SENT_RECHECK = 1.0
"""Seconds a worker parked on its batch's transaction sleeps before it checks the batch
itself (its partition revoked, the transaction thread gone); the transaction's callback
wakes it at once otherwise."""

Parts = list[tuple[Rows, bool]]
"""A decoded batch as the parts handed over one after the other, each with whether it is a
record that goes alone (``ingress.limits.isolate``)."""


@dataclass(eq=False)
class SegmentRun:
    """A segment replayed over the shared transaction loop: at most one batch in its
    transaction (``sent``) and one decoded batch ahead (``ahead``: its parts, the last
    one holding the read's bytes of ``ingress.max_bytes_in_flight``); ``reader`` is
    ``None`` once the segment is read.
    """

    seg: SegmentKey
    name: str
    reader: SegmentStreamReader | None
    parts: Iterator[pa.RecordBatch]
    after: int | None
    ahead: deque[tuple[Rows, Checkpoint, bool, BudgetRequest | None]] = \
        field(default_factory=deque)
    sent: tuple[object, Rows | None, Checkpoint, BudgetRequest | None] | None = None
    cut_short: bool = False
    """The segment went away or turned out corrupt while read (reported already)."""
    reading: BudgetRequest | None = None
    """The bytes asked for (or granted) to read the next batch."""


@dataclass
class ReplayerHooks:
    """What a ``SegmentReplayer`` asks of its worker."""

    wake: Callable[[], None]
    """Wake the worker (a transaction ended, bytes were granted)."""
    drop_permit: Callable[[], None]
    """Give the replay slot back."""
    stopping: Callable[[], bool]
    """True once the worker was asked to stop."""
    refused_at: Callable[[], int | None]
    """The source offset of a record refused before (replayed alone), if any."""


class SegmentReplayer:
    """Replays segments of one worker's partition (see the module)."""

    def __init__(self, cfg: WorkerConfig, *, store: ObjectStore, metrics: IngressMetrics,
                 labels: dict[str, str], clock: Clock, budget: ByteBudget | None,
                 inventory: SegmentInventory, first: FirstPosition, progress: Progress,
                 writer: CheckpointWriter, where: str, key: str,
                 hooks: ReplayerHooks) -> None:
        self.cfg = cfg
        self.store = store
        self.metrics = metrics
        self.labels = labels
        self.clock = clock
        self.budget = budget
        self.inventory = inventory
        self.first = first
        self.progress = progress
        self.writer = writer
        self.where = where
        self.key = key
        self.hooks = hooks
        self.run: SegmentRun | None = None
        """The segment being replayed over the shared transaction loop (``cont``)."""
        self.orphan: tuple[Delivery, object, Checkpoint] | None = None
        """A failed session's batch still in a transaction (``end_run``)."""

    @property
    def delivery(self) -> Delivery:
        assert self.progress.delivery is not None
        return self.progress.delivery

    def _open(self, seg: SegmentKey, skip_through: int | None
              ) -> tuple[SegmentStreamReader, int | None] | None:
        """Open a segment to replay: its reader and the offset records must lie above;
        ``None`` if it is gone or corrupt (reported, the inventory told).
        """
        try:
            reader = open_segment(self.store, seg)
        except ObjectNotFound:
            self._missing(seg)
            return None
        except SegmentCorrupt as e:
            self._corrupt(seg, e)
            return None
        log.info("%s: replaying segment %s%s", self.where, seg.to_key(),
                 "" if skip_through is None else f" (skipping offsets <= {skip_through})")
        after = self._replay_after(skip_through)
        progress = self.progress
        if after is None and progress.origin is None:
            progress.origin = seg.start
            progress.reported_below = None
            log.info("%s: first replay, no checkpoint: starts at %d; a segment arriving later "
                     "below it will be reported as skipped", self.where, seg.start)
        return reader, after

    def _parts(self, batch: pa.RecordBatch, after: int | None) -> Parts | None:
        """The records of ``batch`` above ``after`` as the parts handed over one after
        the other: one part, unless a record may be refused (``ingress.limits``).
        """
        rows = batch_rows(batch, after, self.cfg.origin)
        if rows is None:
            return None
        refused_at = self.hooks.refused_at()
        hit = refused_at is not None and rows.offsets[0] <= refused_at <= rows.offsets[-1]
        limits = self.cfg.limits
        if limits is None and not hit:
            return [(rows, False)]
        above = limits.alone_above(self.cfg.destination_topic) if limits is not None \
            else 2**62
        sizes = wire_sizes(batch, self.cfg.origin)[-len(rows):]
        if not hit and int(sizes.max()) <= above:
            return [(rows, False)]
        return isolate(rows, sizes.tolist(), above, refused_at)

    def _segment_done(self, seg: SegmentKey) -> None:
        cp = self.writer.holes(seg)
        if cp is not None:
            self.progress.deliver(None, cp)
        self.inventory.prune()      # the segments now below the position
        self.metrics.segments_replayed.labels(**self.labels).inc()
        log.info("%s: segment %s done, checkpoint %d", self.where, seg.to_key(),
                 self.progress.position)

    def replay_segment(self, seg: SegmentKey, skip_through: int | None) -> None:
        """One segment in one step, each batch waited for (a sink without ``submit``)."""
        name = seg.to_key()
        opened = self._open(seg, skip_through)
        if opened is None:
            return
        reader, after = opened
        # The next batch is read and decoded while the current one is delivered.
        # Batches (and transactions) are capped by records and by bytes; the read-ahead
        # holds PREFETCH_BATCHES of them.
        batches = read_ahead((self._parts(part, after)
                              for b in reader.iter_batches(self.cfg.batch_size)
                              for part in split_by_bytes(b, self.cfg.batch_bytes)),
                             PREFETCH_BATCHES, name=f"prefetch-{self.key}")
        stopping = self.hooks.stopping
        try:
            for parts in batches:
                for rows, alone in parts or ():
                    if stopping():
                        return
                    self.progress.deliver(rows, Checkpoint(rows.last_offset, name,
                                                           self.clock()), alone=alone)
        except ObjectNotFound:
            # Deleted while read (compaction, a replicated delete): the batches delivered
            # so far stay; reload the list and go on from the segment that covers the rest.
            self._missing(seg)
            return
        except SegmentCorrupt as e:
            self._corrupt(seg, e)
            return
        finally:
            batches.close()
            reader.close()
        self._segment_done(seg)

    # --- a segment over the shared transaction loop -----------------------------------
    #
    # The worker holds its replay slot while the segment is open for reading (the slot
    # bounds open readers and decoding), and its decoded batches hold bytes of
    # ``max_bytes_in_flight`` until their transaction ends. It parks (no pool thread) while
    # its batch waits for the transaction, and gives the slot back once the segment is
    # read: so one transaction carries the batches of many partitions.

    def begin(self, seg: SegmentKey, skip_through: int | None) -> float:
        """Open ``seg`` (the worker holds a slot) and go on with ``cont``."""
        opened = self._open(seg, skip_through)
        if opened is None:
            self.hooks.drop_permit()
            return 0
        reader, after = opened
        parts = (part for b in reader.iter_batches(self.cfg.batch_size)
                 for part in split_by_bytes(b, self.cfg.batch_bytes))
        self.run = SegmentRun(seg, seg.to_key(), reader, parts, after)
        return self.cont()

    def cont(self) -> float:
        """One step of the segment being replayed: collect the batch whose transaction
        ended, hand the next one over, read one more ahead; park while the batch in the
        transaction waits.
        """
        run = self.run
        assert run is not None
        if not self.collect():
            return SENT_RECHECK
        stopping = self.hooks.stopping
        while not stopping():
            if run.sent is None and run.ahead:
                ahead, cp, alone, hold = run.ahead.popleft()
                rows, cp = self.progress.prepare(ahead, cp)
                assert rows is not None
                run.sent = (self.delivery.submit(rows, cp, self.hooks.wake, alone=alone),
                            rows, cp, hold)
            if run.ahead or run.reader is None:
                break
            if not self._has_bytes(run):
                # Woken when granted (or by the transaction of the batch in flight).
                return WAIT if run.sent is None else SENT_RECHECK
            self._read(run)
        if run.reader is None:
            # Read to its end: the slot goes to another partition while the batch waits.
            self.hooks.drop_permit()
        if run.sent is not None or stopping():
            return SENT_RECHECK if run.sent is not None else 0
        assert not run.ahead and run.reader is None
        holes = None if run.cut_short else self.writer.holes(run.seg)
        if holes is not None:
            # Its checkpoint goes into a transaction like a batch (no thread waits for it).
            _, cp = self.progress.prepare(None, holes)
            run.sent = (self.delivery.submit(None, cp, self.hooks.wake), None, cp, None)
            return SENT_RECHECK
        self.run = None
        if not run.cut_short:
            self._segment_done(run.seg)
        return 0

    def _read(self, run: SegmentRun) -> None:
        """Decode the next batch of ``run`` into ``ahead`` (with its bytes), or close the
        reader at the segment's end (or when the segment went away or is corrupt: the
        batches handed over so far stay; the inventory knows where to go on).
        """
        assert run.reader is not None
        try:
            part = next(run.parts, None)
        except ObjectNotFound:
            self._missing(run.seg)
            part, run.cut_short = None, True
        except SegmentCorrupt as e:
            self._corrupt(run.seg, e)
            part, run.cut_short = None, True
        if part is None:
            self._close_reader(run)
            return
        parts = self._parts(part, run.after)
        if parts is None:
            return                  # every record at or below the checkpoint
        hold, run.reading = run.reading, None
        if hold is not None and self.budget is not None:
            self.budget.resize(hold, int(record_bytes(part).sum()))
        for i, (rows, alone) in enumerate(parts):
            # The read's bytes go back with its last part's transaction.
            run.ahead.append((rows, Checkpoint(rows.last_offset, run.name, self.clock()),
                              alone, hold if i == len(parts) - 1 else None))

    def _has_bytes(self, run: SegmentRun) -> bool:
        """True once ``batch_bytes`` of ``max_bytes_in_flight`` are granted for the next
        read; asks for them otherwise (FIFO; the grant wakes the worker).
        """
        if self.budget is None:
            return True
        if run.reading is None:
            run.reading = self.budget.request(self.cfg.batch_bytes, self.hooks.wake)
        return run.reading.granted

    def collect(self) -> bool:
        """True unless the run's batch still waits for its transaction; when it ended,
        its outcome: the position moves (committed) or the error is raised.
        """
        run = self.run
        if run is None or run.sent is None:
            return True
        handle, rows, cp, hold = run.sent
        if not self.delivery.collect(handle, cp):
            return False
        run.sent = None
        self._give_back(hold)
        self.progress.delivered(rows, cp)
        return True

    def _give_back(self, hold: BudgetRequest | None) -> None:
        if hold is not None and self.budget is not None:
            self.budget.cancel(hold)

    def _close_reader(self, run: SegmentRun) -> None:
        reader, run.reader = run.reader, None
        run.parts = iter(())
        self._give_back(run.reading)
        run.reading = None
        if reader is not None:
            try:
                reader.close()
            except ReplicatorError as e:
                log.warning("%s: closing segment %s: %s", self.where, run.name, e)

    def end_run(self) -> None:
        """The session ends: close the reader, give every byte back. A batch still in a
        transaction is kept as ``orphan``: the next session starts only once it ended
        (``orphan_settled``), so it loads the checkpoint that batch may have committed.
        """
        run, self.run = self.run, None
        if run is None:
            return
        self._close_reader(run)
        for _, _, _, hold in run.ahead:
            self._give_back(hold)
        run.ahead.clear()
        if run.sent is not None:
            self._give_back(run.sent[3])
            if self.progress.delivery is not None:
                self.orphan = (self.progress.delivery, run.sent[0], run.sent[2])

    def orphan_settled(self) -> bool:
        """True once the batch a failed session left in a transaction has ended (either
        way: committed, its checkpoint is what the next session loads; failed, nothing of
        it is visible).
        """
        if self.orphan is None:
            return True
        delivery, handle, cp = self.orphan
        try:
            if not delivery.collect(handle, cp):
                return False
        except ReplicatorError as e:
            log.info("%s: the batch up to %d left by the failed session was not committed: "
                     "%s", self.where, cp.offset, e)
        self.orphan = None
        return True

    def _replay_after(self, skip_through: int | None) -> int | None:
        """Records at or below this offset are skipped: the checkpoint, or, before the
        first one, what lies below the partition's recorded first position (nothing).
        """
        position = self.progress.position
        if position is None and skip_through is not None \
                and self.first.get() != NOT_RECORDED:
            return skip_through
        return position

    def _missing(self, seg: SegmentKey) -> None:
        log.warning("%s: segment %s is gone (compacted or deleted); reloading the segment "
                    "list", self.where, seg.to_key())
        self.metrics.segments_missing.labels(**self.labels).inc()
        self.inventory.mark_gone(seg)

    def _corrupt(self, seg: SegmentKey, e: SegmentCorrupt) -> None:
        log.error("%s: segment %s cannot be read and is skipped (its range waits for another "
                  "segment, then counts as lost): %s", self.where, seg.to_key(), e)
        self.metrics.segments_corrupt.labels(**self.labels).inc()
        self.inventory.mark_bad(seg)
