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


READ_AHEAD_BATCHES = 2
"""Decoded input batches queued ahead of the writer (``read_ahead``): reading and decoding
overlap encoding and uploading; memory stays bounded: at most this many batches queued plus
one being read and one being written."""

def _input_batches(store: ObjectStore, fmt: SegmentFormat, inputs: list[SegmentKey],
                   batch_size: int, stopped: Callable[[], bool], where: str,
                   ) -> Iterator[pa.RecordBatch]:
    """Every record batch of ``inputs`` in order, each input verified (step 3, per input):
    it yields its footer's record count, all inside its own key range.
    """
    for k in inputs:
        if stopped():
            raise InterruptedError(f"{where}: merge cancelled before reading {k}")
        read, first_in, last_in = 0, None, None
        with open_segment(store, k) as reader:
            expected_count = reader.metadata.message_count
            for batch in reader.iter_batches(batch_size):
                if batch.num_rows == 0:
                    continue
                read += batch.num_rows
                offsets = batch.column("offset")
                if first_in is None:
                    first_in = offsets[0].as_py()
                last_in = offsets[-1].as_py()
                yield batch
        if read != expected_count:
            raise SegmentCorrupt(f"{k}: footer says {expected_count} records, read {read}")
        if first_in is not None and (first_in < k.start or (last_in or 0) > k.end):
            raise SegmentCorrupt(f"{k}: holds offsets {first_in}-{last_in} outside its "
                                 f"key range")


def merge_segments(store: ObjectStore, fmt: SegmentFormat, options: WriterOptions,
                   temp_prefix: str, spec: TaskSpec,
                   stopped: Callable[[], bool] = lambda: False) -> TaskResult:
    """Merge ``spec.inputs`` into ``spec.output``; the durability order of one output.

    1. If the output key already holds a valid segment (an earlier run published it and
       died before deleting the inputs), report it and write nothing.
    2. Stream every input, in order, in ``batch_size`` batches into one temp upload, keeping
       only offsets after the last one written (overlapping inputs never duplicate).
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
        batches = _input_batches(store, fmt, inputs, spec.batch_size, stopped, where)
        for batch in read_ahead(batches, READ_AHEAD_BATCHES, name="merge-read-ahead"):
            fresh = _drop_written(batch, last)
            dropped += batch.num_rows - fresh.num_rows
            if fresh.num_rows:
                upload.write_batch(fresh)
                last = fresh.column("offset")[-1].as_py()

        # Step 3 (output)
        count = upload.message_count
        first_out = upload.first_offset
        if count == 0 or first_out is None or first_out < output.start or last != output.end:
            raise SegmentCorrupt(
                f"{where}: merged offsets {first_out}-{last} ({count} records) do not fit "
                f"{output} (must start at or after {output.start} and end at {output.end})")

        # Step 4
        temp = upload.finish(SegmentMetadata.for_key(output, count,
                                                     created_by=options.created_by))
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
