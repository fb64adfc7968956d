"""The replay of one segment by a ``ReplayWorker`` (``ingress.worker``): the worker's state
machine decides *which* segment to replay (``planner.next_action``); this part opens it,
reads and decodes its batches (capped by records and bytes, one read ahead) and hands
them to the session's delivery, either one batch at a time (``_replay_segment``) or,
over the process's shared transaction loop, parked while its batch waits for the
transaction (``_begin`` / ``_continue``). A segment that goes away or turns out corrupt
while read is reported and left to the inventory.

``SegmentReplay`` is a part of ``ReplayWorker`` (a mixin): it reads and moves the worker's
state (position, origin, inventory, the session's delivery), declared below.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from formats.segment_io import SegmentStreamReader, open_segment
from ingress.delivery import Delivery
from ingress.first_position import NOT_RECORDED
from ingress.inventory import SegmentInventory
from ingress.metrics import IngressMetrics
from ingress.permits import BudgetRequest, ByteBudget
from ingress.rows import Rows, batch_rows, record_bytes, split_by_bytes
from ingress.scheduler import WAIT
from replicator.core.clock import Clock
from replicator.core.errors import ObjectNotFound, ReplicatorError, SegmentCorrupt
from replicator.core.keys import SegmentKey
from replicator.core.queues import read_ahead
from replicator.core.storage import ObjectStore
from replicator.core.wire import Checkpoint

if TYPE_CHECKING:
    from ingress.first_position import FirstPosition
    from ingress.worker import WorkerConfig

log = logging.getLogger(__name__)

PREFETCH_BATCHES = 1
"""Batches read and decoded ahead while the current one is delivered (memory: about two
batches per active replay)."""

SENT_RECHECK = 1.0
"""Seconds a worker parked on its batch's transaction sleeps before it checks the batch
itself (its partition revoked, the transaction thread gone); the transaction's callback
wakes it at once otherwise."""


@dataclass(eq=False)
class SegmentRun:
    """A segment replayed over the shared transaction loop: at most one batch in its
    transaction (``sent``) and one decoded ahead (``ahead``), each with its bytes of
    ``ingress.max_bytes_in_flight``; ``reader`` is ``None`` once the segment is read.
    """

    seg: SegmentKey
    name: str
    reader: SegmentStreamReader | None
    parts: Iterator[pa.RecordBatch]
    after: int | None
    ahead: tuple[Rows, Checkpoint, BudgetRequest | None] | None = None
    sent: tuple[object, Rows | None, Checkpoint, BudgetRequest | None] | None = None
    cut_short: bool = False
    """The segment went away or turned out corrupt while read (reported already)."""
    reading: BudgetRequest | None = None
    """The bytes asked for (or granted) to read the next batch."""


class SegmentReplay:
    """The segment-replay steps of a ``ReplayWorker`` (see the module)."""

    # The worker's state these steps read and move (set by ``ReplayWorker.__init__``).
    cfg: WorkerConfig
    store: ObjectStore
    metrics: IngressMetrics
    clock: Clock
    budget: ByteBudget | None
    inventory: SegmentInventory
    first: FirstPosition
    key: str
    where: str
    position: int | None
    origin: int | None
    _labels: dict[str, str]
    _reported_below: int | None
    _delivery: Delivery | None
    _run: SegmentRun | None
    _orphan: tuple[Delivery, object, Checkpoint] | None

    if TYPE_CHECKING:
        @property
        def stopping(self) -> bool: ...
        def _wake(self) -> None: ...
        def _drop_permit(self) -> None: ...
        def _deliver(self, rows: Rows | None, cp: Checkpoint) -> None: ...
        def _prepare(self, rows: Rows | None, cp: Checkpoint
                     ) -> tuple[Rows | None, Checkpoint]: ...
        def _delivered(self, rows: Rows | None, cp: Checkpoint) -> None: ...

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
        if after is None and self.origin is None:
            self.origin = seg.start
            self._reported_below = None
            log.info("%s: first replay, no checkpoint: starts at %d; a segment arriving later "
                     "below it will be reported as skipped", self.where, seg.start)
        return reader, after

    def _holes(self, seg: SegmentKey) -> Checkpoint | None:
        """The checkpoint of ``seg``'s end when its last record lies before it: the footer
        vouches for the range, positions after the last record are holes.
        """
        if self.position is not None and self.position >= seg.end:
            return None
        name = seg.to_key()
        log.warning("%s: segment %s ends at %d but its last record is %s; checkpointing "
                    "its end", self.where, name, seg.end, self.position)
        return Checkpoint(seg.end, name, self.clock())

    def _segment_done(self, seg: SegmentKey) -> None:
        cp = self._holes(seg)
        if cp is not None:
            self._deliver(None, cp)
        self.inventory.prune()      # the segments now below the position
        self.metrics.segments_replayed.labels(**self._labels).inc()
        log.info("%s: segment %s done, checkpoint %d", self.where, seg.to_key(),
                 self.position)

    def _replay_segment(self, seg: SegmentKey, skip_through: int | None) -> None:
        """One segment in one step, each batch waited for (a sink without ``submit``)."""
        name = seg.to_key()
        opened = self._open(seg, skip_through)
        if opened is None:
            return
        reader, after = opened
        # The next batch is read and decoded while the current one is delivered.
        # Batches (and transactions) are capped by records and by bytes; the read-ahead
        # holds PREFETCH_BATCHES of them.
        batches = read_ahead((batch_rows(part, after, self.cfg.origin)
                              for b in reader.iter_batches(self.cfg.batch_size)
                              for part in split_by_bytes(b, self.cfg.batch_bytes)),
                             PREFETCH_BATCHES, name=f"prefetch-{self.key}")
        try:
            for rows in batches:
                if self.stopping:
                    return
                if rows is None:
                    continue
                self._deliver(rows, Checkpoint(rows.last_offset, name, self.clock()))
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

    def _begin(self, seg: SegmentKey, skip_through: int | None) -> float:
        """Open ``seg`` (the worker holds a slot) and go on with ``_continue``."""
        opened = self._open(seg, skip_through)
        if opened is None:
            self._drop_permit()
            return 0
        reader, after = opened
        parts = (part for b in reader.iter_batches(self.cfg.batch_size)
                 for part in split_by_bytes(b, self.cfg.batch_bytes))
        self._run = SegmentRun(seg, seg.to_key(), reader, parts, after)
        return self._continue()

    def _continue(self) -> float:
        """One step of the segment being replayed: collect the batch whose transaction
        ended, hand the next one over, read one more ahead; park while the batch in the
        transaction waits.
        """
        run = self._run
        assert run is not None and self._delivery is not None
        if not self._collect():
            return SENT_RECHECK
        while not self.stopping:
            if run.sent is None and run.ahead is not None:
                ahead, cp, hold = run.ahead
                run.ahead = None
                rows, cp = self._prepare(ahead, cp)
                assert rows is not None
                run.sent = (self._delivery.submit(rows, cp, self._wake), rows, cp, hold)
            if run.ahead is not None or run.reader is None:
                break
            if not self._has_bytes(run):
                # Woken when granted (or by the transaction of the batch in flight).
                return WAIT if run.sent is None else SENT_RECHECK
            self._read(run)
        if run.reader is None:
            # Read to its end: the slot goes to another partition while the batch waits.
            self._drop_permit()
        if run.sent is not None or self.stopping:
            return SENT_RECHECK if run.sent is not None else 0
        assert run.ahead is None and run.reader is None
        holes = None if run.cut_short else self._holes(run.seg)
        if holes is not None:
            # Its checkpoint goes into a transaction like a batch (no thread waits for it).
            _, cp = self._prepare(None, holes)
            run.sent = (self._delivery.submit(None, cp, self._wake), None, cp, None)
            return SENT_RECHECK
        self._run = None
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
        rows = batch_rows(part, run.after, self.cfg.origin)
        if rows is None:
            return                  # every record at or below the checkpoint
        hold, run.reading = run.reading, None
        if hold is not None and self.budget is not None:
            self.budget.resize(hold, int(record_bytes(part).sum()))
        run.ahead = (rows, Checkpoint(rows.last_offset, run.name, self.clock()), hold)

    def _has_bytes(self, run: SegmentRun) -> bool:
        """True once ``batch_bytes`` of ``max_bytes_in_flight`` are granted for the next
        read; asks for them otherwise (FIFO; the grant wakes the worker).
        """
        if self.budget is None:
            return True
        if run.reading is None:
            run.reading = self.budget.request(self.cfg.batch_bytes, self._wake)
        return run.reading.granted

    def _collect(self) -> bool:
        """True unless the run's batch still waits for its transaction; when it ended,
        its outcome: the position moves (committed) or the error is raised.
        """
        run = self._run
        if run is None or run.sent is None:
            return True
        assert self._delivery is not None
        handle, rows, cp, hold = run.sent
        if not self._delivery.collect(handle, cp):
            return False
        run.sent = None
        self._give_back(hold)
        self._delivered(rows, cp)
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

    def _end_run(self) -> None:
        """The session ends: close the reader, give every byte back. A batch still in a
        transaction is kept as ``_orphan``: the next session starts only once it ended
        (``_orphan_settled``), so it loads the checkpoint that batch may have committed.
        """
        run, self._run = self._run, None
        if run is None:
            return
        self._close_reader(run)
        if run.ahead is not None:
            self._give_back(run.ahead[2])
        if run.sent is not None:
            self._give_back(run.sent[3])
            if self._delivery is not None:
                self._orphan = (self._delivery, run.sent[0], run.sent[2])

    def _orphan_settled(self) -> bool:
        """True once the batch a failed session left in a transaction has ended (either
        way: committed, its checkpoint is what the next session loads; failed, nothing of
        it is visible).
        """
        if self._orphan is None:
            return True
        delivery, handle, cp = self._orphan
        try:
            if not delivery.collect(handle, cp):
                return False
        except ReplicatorError as e:
            log.info("%s: the batch up to %d left by the failed session was not committed: "
                     "%s", self.where, cp.offset, e)
        self._orphan = None
        return True

    def _replay_after(self, skip_through: int | None) -> int | None:
        """Records at or below this offset are skipped: the checkpoint, or, before the
        first one, what lies below the partition's recorded first position (nothing).
        """
        if self.position is None and skip_through is not None \
                and self.first.get() != NOT_RECORDED:
            return skip_through
        return self.position

    def _missing(self, seg: SegmentKey) -> None:
        log.warning("%s: segment %s is gone (compacted or deleted); reloading the segment "
                    "list", self.where, seg.to_key())
        self.metrics.segments_missing.labels(**self._labels).inc()
        self.inventory.mark_gone(seg)

    def _corrupt(self, seg: SegmentKey, e: SegmentCorrupt) -> None:
        log.error("%s: segment %s cannot be read and is skipped (its range waits for another "
                  "segment, then counts as lost): %s", self.where, seg.to_key(), e)
        self.metrics.segments_corrupt.labels(**self._labels).inc()
        self.inventory.mark_bad(seg)
