"""One merge task: stream input segments into one output segment, verified, then published.

This module is what runs *inside* a Spark task (and in-process with ``LocalExecutor``). It
never imports pyspark: ``compaction.executors`` runs it in-process or, through
``compaction.spark_job``, in Spark tasks that receive plain JSON task descriptions.

Memory per task is bounded by configuration, not by segment size: one ``batch_size`` batch
in flight, one read buffer, the format writer's row-group buffer and one upload part.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from formats.base import SegmentFormat, SegmentMetadata, WriterOptions
from formats.registry import open_reader
from formats.segment_io import SegmentUpload, open_segment, publish_segment
from replicator.core.errors import ObjectNotFound, SegmentCorrupt, SegmentNotFound
from replicator.core.keys import SegmentKey
from replicator.core.queues import read_ahead
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class TaskSpec:
    """What a merge task needs, as JSON-able values (it crosses to Spark executors)."""

    inputs: list[str]
    input_sizes: list[int]
    output: str
    batch_size: int
    storage_class: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TaskSpec:
        return cls(list(d["inputs"]), list(d["input_sizes"]), d["output"], int(d["batch_size"]),
                   d.get("storage_class"))


@dataclass(frozen=True)
class TaskResult:
    """What a merge task reports back to the driver."""

    output: str
    ok: bool
    records: int = 0
    segments_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: int = 0
    """Records skipped because an overlapping earlier input already held their offsets."""
    existing: bool = False
    """The output was already published by an earlier (interrupted) run."""
    conflict: bool = False
    """Failed because overlapping inputs hold different records at the same positions
    (``InputsDisagree``)."""
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TaskResult:
        return cls(**d)


def _drop_written(batch: pa.RecordBatch, last_written: int) -> pa.RecordBatch:
    """The rows of ``batch`` whose offset is after ``last_written`` (offsets ascend)."""
    offsets = batch.column("offset")
    if offsets[0].as_py() > last_written:
        return batch
    n_old = pc.sum(pc.less_equal(offsets, last_written), min_count=0).as_py()
    return batch.slice(int(n_old))


class InputsDisagree(SegmentCorrupt):
    """Two inputs of a merge hold different records at the same positions: another topic
    incarnation, or a partition truncated or reset. Nothing is merged; both are kept.
    """


class _OverlapGuard:
    """Checks that records dropped as already written are the records written.

    Inputs overlap when egress rewrote a range it had published but not committed: the
    same records, and the merge keeps the first copy. When a topic was recreated or a
    partition truncated, the positions repeat but the records differ, and dropping them
    would lose the later ones. So the offsets and timestamps written in the ranges a later
    input overlaps are kept (only those: 16 bytes a record of the overlap), and each later
    input must hold exactly those offsets there, with the same timestamps.
    """

    def __init__(self, inputs: list[SegmentKey]) -> None:
        self.inputs = inputs
        self.lo: int | None = None
        self.hi = -1
        """Offsets ``lo..hi`` are remembered: the union of what later inputs overlap."""
        reach = -1
        for k in inputs:
            if reach >= k.start:
                self.lo = k.start if self.lo is None else min(self.lo, k.start)
                self.hi = max(self.hi, min(reach, k.end))
            reach = max(reach, k.end)
        self._offsets: list[pa.Array] = []
        self._times: list[pa.Array] = []
        self._owner: list[pa.Array] = []
        self._current = -1
        self._dropped = 0
        self._expected = 0

    def written(self, index: int, batch: pa.RecordBatch) -> None:
        """``batch`` of input ``index`` was written."""
        if self.lo is None:
            return
        offsets = batch.column("offset")
        keep = pc.and_(pc.greater_equal(offsets, self.lo), pc.less_equal(offsets, self.hi))
        if not pc.any(keep).as_py():
            return
        kept = batch.filter(keep)
        self._offsets.append(kept.column("offset"))
        self._times.append(kept.column("timestamp").cast(pa.int64()))
        self._owner.append(pa.array([index] * kept.num_rows, pa.int32()))

    def started(self, index: int, last_written: int) -> None:
        """Input ``index`` begins; everything written so far ends at ``last_written``."""
        self.finished()
        self._current, self._dropped = index, 0
        k = self.inputs[index]
        if self.lo is None or k.start > last_written:
            self._expected = 0
            return
        offsets = self._all(self._offsets, pa.int64())
        inside = pc.and_(pc.greater_equal(offsets, k.start),
                         pc.less_equal(offsets, min(k.end, last_written)))
        self._expected = pc.sum(inside, min_count=0).as_py()

    def dropped(self, rows: pa.RecordBatch) -> None:
        """``rows`` of the current input were not written: their offsets already were."""
        self._dropped += rows.num_rows
        if self.lo is None or not rows.num_rows:
            return
        offsets = self._all(self._offsets, pa.int64())
        at = pc.index_in(rows.column("offset"), value_set=offsets)
        missing = pc.is_null(at)
        if pc.any(missing).as_py():
            o = pc.filter(rows.column("offset"), missing)[0].as_py()
            self._disagree(None, f"it holds offset {o}, which no earlier input holds")
        times = pc.take(self._all(self._times, pa.int64()), at)
        mine = rows.column("timestamp").cast(pa.int64())
        differ = pc.not_equal(times, mine)
        if pc.any(differ).as_py():
            i = pc.index(differ, True).as_py()
            owner = pc.take(self._all(self._owner, pa.int32()), at)[i].as_py()
            self._disagree(owner, f"offset {rows.column('offset')[i].as_py()} has timestamp "
                                  f"{mine[i].as_py()} ms there and {times[i].as_py()} ms in "
                                  f"the earlier input")

    def finished(self) -> None:
        """The current input ended: it must have held every remembered offset it overlaps."""
        if self._current >= 0 and self._dropped != self._expected:
            self._disagree(None, f"it holds {self._dropped} records where earlier inputs "
                                 f"hold {self._expected}")
        self._current = -1

    def _disagree(self, owner: int | None, detail: str) -> None:
        later = self.inputs[self._current]
        earlier = ([self.inputs[owner]] if owner is not None else
                   [k for k in self.inputs[:self._current] if k.end >= later.start])
        raise InputsDisagree(
            f"{later} and {', '.join(str(k) for k in earlier)} overlap but hold different "
            f"records at the same positions ({detail}): a topic recreated or a partition "
            f"truncated or reset; nothing merged, both kept")

    @staticmethod
    def _all(chunks: list[pa.Array], type_: pa.DataType) -> pa.Array:
        return pa.concat_arrays(chunks) if chunks else pa.array([], type_)


READ_AHEAD_BATCHES = 2
"""Decoded input batches queued ahead of the writer (``read_ahead``): reading and decoding
overlap encoding and uploading; memory stays bounded: at most this many batches queued plus
one being read and one being written."""

def _input_batches(store: ObjectStore, fmt: SegmentFormat, inputs: list[SegmentKey],
                   batch_size: int, stopped: Callable[[], bool], where: str,
                   topic_ids: set[str | None] | None = None,
                   ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Every record batch of ``inputs`` in order, with the input's index, each input
    verified (step 3, per input): it yields its footer's record count, all inside its own
    key range, increasing (``open_segment``'s reader checks the offsets as it reads).
    ``topic_ids`` collects the inputs' footer ``topic_id``.
    """
    for index, k in enumerate(inputs):
        if stopped():
            raise InterruptedError(f"{where}: merge cancelled before reading {k}")
        read = 0
        with open_segment(store, k) as reader:
            expected_count = reader.metadata.message_count
            if topic_ids is not None:
                topic_ids.add(reader.metadata.topic_id)
            for batch in reader.iter_batches(batch_size):
                if batch.num_rows == 0:
                    continue
                read += batch.num_rows
                yield index, batch
        if read != expected_count:
            raise SegmentCorrupt(f"{k}: footer says {expected_count} records, read {read}")


def merge_segments(store: ObjectStore, fmt: SegmentFormat, options: WriterOptions,
                   temp_prefix: str, spec: TaskSpec,
                   stopped: Callable[[], bool] = lambda: False) -> TaskResult:
    """Merge ``spec.inputs`` into ``spec.output``; the durability order of one output.

    1. If the output key already holds a valid segment (an earlier run published it and
       died before deleting the inputs), report it and write nothing.
    2. Stream every input, in order, in ``batch_size`` batches into one temp upload, keeping
       only offsets after the last one written (overlapping inputs never duplicate); the
       records dropped so must be the ones written (same offsets and timestamps,
       ``_OverlapGuard``), or the merge fails with ``InputsDisagree``.
    3. Verify: each input yielded its footer's record count inside its own range (checked
       as it is read, ``_input_batches``); the output starts at or after its key's start
       and ends exactly at its key's end.
    4. Finish the temp object with the output key's footer; re-open it and check the
       footer against the key.
    5. Publish: copy to the final key with the level's storage class, delete the temp.
    6. Return the result; the driver deletes the inputs only after this.

    Any failure aborts the temp upload (nothing partial is ever visible) and leaves the
    inputs in place.

    Raises:
        SegmentCorrupt: an input or the output fails verification.
        InputsDisagree: overlapping inputs hold different records at the same positions.
        SegmentNotFound: an input is gone.
        StorageError: retriable storage failure.
    """
    t0 = time.monotonic()
    output = SegmentKey.parse(spec.output)
    inputs = [SegmentKey.parse(k) for k in spec.inputs]
    where = f"{output.topic}[{output.partition}]"

    # Step 1
    existing = _existing_output(store, fmt, output)
    if existing is not None:
        log.info("%s: %s already published (%d records); only the inputs are left to delete",
                 where, output, existing.message_count)
        return TaskResult(spec.output, True, records=existing.message_count,
                          segments_in=len(inputs), existing=True,
                          seconds=time.monotonic() - t0)

    # Step 2
    upload = SegmentUpload(store, fmt, temp_prefix, options)
    try:
        last = -1
        dropped = 0
        guard = _OverlapGuard(inputs)
        current = -1
        ids: set[str | None] = set()
        batches = _input_batches(store, fmt, inputs, spec.batch_size, stopped, where, ids)
        for index, batch in read_ahead(batches, READ_AHEAD_BATCHES, name="merge-read-ahead"):
            if index != current:
                guard.started(index, last)
                current = index
            fresh = _drop_written(batch, last)
            old = batch.num_rows - fresh.num_rows
            if old:
                guard.dropped(batch.slice(0, old))
            dropped += old
            if fresh.num_rows:
                upload.write_batch(fresh)
                guard.written(index, fresh)
                last = fresh.column("offset")[-1].as_py()
        guard.finished()

        # Step 3 (output)
        count = upload.message_count
        first_out = upload.first_offset
        if count == 0 or first_out is None or first_out < output.start or last != output.end:
            raise SegmentCorrupt(
                f"{where}: merged offsets {first_out}-{last} ({count} records) do not fit "
                f"{output} (must start at or after {output.start} and end at {output.end})")

        # Step 4
        # The inputs' topic id when they all name the same one (one incarnation).
        temp = upload.finish(SegmentMetadata.for_key(
            output, count, created_by=options.created_by,
            topic_id=next(iter(ids)) if len(ids) == 1 else None))
        _check_written(store, fmt, temp.key, output, count)

        # Step 5
        published = publish_segment(store, temp.key, output, spec.storage_class)
        if published.temp_error is not None:
            raise published.temp_error
        final = published.info
    except BaseException:
        upload.abort()
        raise

    # Step 6
    result = TaskResult(spec.output, True, records=count, segments_in=len(inputs),
                        bytes_in=sum(spec.input_sizes), bytes_out=final.size, dropped=dropped,
                        seconds=time.monotonic() - t0)
    log.info("%s: merged %d segments into %s: %d records (%d overlapping dropped), "
             "%d -> %d bytes in %.2fs", where, len(inputs), output, count, dropped,
             result.bytes_in, result.bytes_out, result.seconds)
    return result


def _existing_output(store: ObjectStore, fmt: SegmentFormat, output: SegmentKey,
                     ) -> SegmentMetadata | None:
    """The footer of an already published output, ``None`` if there is none.

    Raises:
        SegmentCorrupt: something unreadable sits under the output key; it is not
            overwritten blindly (a human should look).
    """
    try:
        with open_segment(store, output) as reader:
            return reader.metadata
    except SegmentNotFound:
        return None


def _check_written(store: ObjectStore, fmt: SegmentFormat, temp_key: str, output: SegmentKey,
                   count: int) -> None:
    where = f"s3://{store.bucket}/{temp_key} (for {output})"
    try:
        stream = store.open_read(temp_key)
    except ObjectNotFound as e:
        raise SegmentCorrupt(f"{where}: the finished temp object is missing") from e
    try:
        reader = open_reader(stream, expected=output, where=where)
        n = reader.metadata.message_count
        reader.close()
    finally:
        stream.close()
    if n != count:
        raise SegmentCorrupt(f"{where}: footer says {n} records, {count} were written")
