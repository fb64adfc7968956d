"""The partition writer: naming, exact limits, the durability order, failures, cancels."""

from __future__ import annotations

import ctypes
import logging
import tracemalloc
from collections.abc import Iterator

import pyarrow as pa
import pytest

from egress.columns import ROW_OVERHEAD, ColumnBuffer
from egress.rotation import CloseReason, SegmentLimits
from egress.segment import Segment
from formats._common import GroupBuffer
from formats.base import SEGMENT_SCHEMA
from formats.records import Record, batch_to_records
from formats.segment_io import open_segment
from replicator.core.errors import KafkaFatalError, KafkaRetriableError, StorageError
from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectInfo
from tests.unit.egress.fakes import FakeMessage, Harness, messages, records


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def make(**kw: object) -> Harness:
    return Harness(**kw)  # type: ignore[arg-type]


def read(h: Harness, key: str) -> list[Record]:
    with open_segment(h.store, SegmentKey.parse(key)) as r:
        return [rec for b in r.iter_batches(1000) for rec in batch_to_records(b)]


def test_column_buffer_keeps_nulls_headers_and_timestamps() -> None:
    recs = [Record(0, 5, None, b"a"), Record(1, 6, b"", None, (("x", None), ("y", b"z"))),
            Record(2, -1, b"k", b"", (), 0)]
    buf = ColumnBuffer()
    taken, raw = buf.add(messages(recs))
    assert (taken, raw) == (3, 1 + 1 + 1 + 1 + 1)
    assert list(batch_to_records(buf.take())) == recs
    assert len(buf) == 0 and buf.raw_bytes == 0


@pytest.mark.parametrize("types", ["mixed", "one"])
@pytest.mark.parametrize("keys", ["all", "none", "some"])
def test_column_buffer_batch_equals_arrow_built_one(keys: str, types: str) -> None:
    # take() joins binary columns into one buffer (and falls back to pa.array when a
    # column has nulls), and a timestamp type shared by every row is one byte repeated:
    # the batch must be the one pa.array builds, value for value.
    recs = [Record(o, 1_700_000_000_000 + o,
                   None if keys == "none" or (keys == "some" and o % 3 == 0) else b"k%d" % o,
                   b"" if o % 5 == 0 else bytes(range(o % 256)) * 3, (),
                   o % 3 if types == "mixed" else 2)
            for o in range(10**9, 10**9 + 2500)]
    buf = ColumnBuffer()
    buf.add(messages(recs))
    batch = buf.take()
    expected = pa.RecordBatch.from_arrays(
        [pa.array([r.offset for r in recs], pa.int64()),
         pa.array([r.timestamp_ms for r in recs], SEGMENT_SCHEMA.field("timestamp").type),
         pa.array([r.timestamp_type for r in recs], pa.int8()),
         pa.array([r.key for r in recs], pa.binary()),
         pa.array([r.value for r in recs], pa.binary()),
         pa.array([[] for _ in recs], SEGMENT_SCHEMA.field("headers").type)],
        schema=SEGMENT_SCHEMA)
    assert batch.equals(expected)
    assert list(batch_to_records(batch)) == recs


def test_column_buffer_stops_at_the_byte_budget() -> None:
    buf = ColumnBuffer()
    taken, raw = buf.add(messages(records(range(10), size=98)), byte_budget=350)
    # Each record: 2-3 key bytes + 98 value bytes; the fourth reaches 350.
    assert taken == 4 and raw >= 350 and buf.offsets == [0, 1, 2, 3]


def test_durability_order(h: Harness) -> None:
    h.writer.append(messages(records(range(5))), now=0.0)
    seg = h.writer.close(CloseReason.AGE)
    assert seg is not None
    h.settle()
    final = "data/r1/t/0/0/00000000000000000000-00000000000000000004"
    ops = [op for op, _ in h.store.ops]
    # 1. complete (a small object is one put at the temp key), 2. copy, 3. delete, 4. commit
    assert ops == ["open_upload", "put", "copy", "delete", "commit"]
    assert h.store.ops[2] == ("copy", final)
    assert h.store.ops[1][1] == h.store.ops[3][1]  # the temp key put, then deleted
    assert h.commits == [5]
    assert h.final_keys() == [final] and h.temp_keys() == []
    assert read(h, final) == records(range(5))
    assert h.metrics.value("egress_segments_total", {"region": "r1", "topic": "t",
                                                     "partition": "0", "reason": "age"}) == 1
    assert h.writer.committed_offset == 5 and h.writer.closing == []


def test_segments_touch_across_offset_holes() -> None:
    h = make(expected=10, low=0)
    try:
        # Offsets 10 (a transaction marker) and 14-15 are holes.
        h.writer.append(messages(records([11, 12, 13])), now=0.0)
        h.writer.close(CloseReason.AGE)
        h.writer.append(messages(records([16, 17])), now=1.0)
        h.writer.close(CloseReason.AGE)
        h.settle()
        assert h.final_keys() == ["data/r1/t/0/0/00000000000000000010-00000000000000000013",
                                  "data/r1/t/0/0/00000000000000000014-00000000000000000017"]
        assert h.commits == [14, 18]
        assert h.metrics.total("egress_source_lost_messages_total") == 0
    finally:
        h.close()


def test_a_hole_before_a_segment_is_not_loss_by_itself() -> None:
    # The log start moved past records the consumer had already fetched (they sit in its
    # queue): the hole before them (a transaction marker at 14) is no loss. Only the
    # broker's "position out of range" reports loss (test_poll_loop.py); opening a segment
    # asks nothing of the broker.
    h = make(expected=14, low=40)
    try:
        h.writer.append(messages(records([15, 16])), now=0.0)
        h.writer.close(CloseReason.AGE)
        h.settle()
        assert h.final_keys() == ["data/r1/t/0/0/00000000000000000014-00000000000000000016"]
        assert h.metrics.total("egress_source_lost_messages_total") == 0
    finally:
        h.close()


def test_count_and_size_limits_are_exact() -> None:
    h = make(limits=SegmentLimits(max_messages=5, max_bytes=250, max_age=60.0))
    try:
        h.writer.append(messages(records(range(10), size=10)), now=0.0)   # 12-13 B each
        h.writer.append(messages(records(range(10, 13), size=200)), now=0.0)
        h.writer.close(CloseReason.SHUTDOWN)
        h.settle()
        spans = [(k.start, k.end) for k in map(SegmentKey.parse, h.final_keys())]
        # count closes 0-4, 5-9; 10 + 11 (~203 B each) reach 250 B; 12 on shutdown
        assert spans == [(0, 4), (5, 9), (10, 11), (12, 12)]
        reasons = {r: h.metrics.total("egress_segments_total", reason=r)
                   for r in ("count", "size", "shutdown")}
        assert reasons == {"count": 2, "size": 1, "shutdown": 1}
    finally:
        h.close()


def test_copy_fails_twice_then_succeeds(h: Harness) -> None:
    h.store.fail["copy"] = 2
    h.writer.append(messages(records(range(3))), now=0.0)
    h.writer.close(CloseReason.COUNT)
    h.settle()
    assert h.commits == [3]
    assert [op for op, _ in h.store.ops].count("copy") == 3


def test_copy_fails_for_good_nothing_visible_nothing_committed_then_rewind(h: Harness) -> None:
    h.store.fail["copy"] = 100
    h.writer.append(messages(records(range(3))), now=0.0)
    h.writer.close(CloseReason.COUNT)
    h.writer.append(messages(records(range(3, 6))), now=0.0)   # the next segment, queued
    h.writer.close(CloseReason.COUNT)
    h.settle()
    assert h.commits == [] and h.final_keys() == [] and h.temp_keys() == []
    assert h.writer.failed is not None and h.writer.broken.is_set()
    # Messages arriving before the rewind are dropped (they are read again).
    h.writer.append(messages(records(range(6, 8))), now=0.0)
    assert h.writer.segment is None
    assert h.metrics.total("egress_segment_failures_total", step="copy") == 1
    h.store.fail["copy"] = 0
    assert not h.writer.ready_to_rewind(now=0.0)                 # backoff first
    assert h.writer.ready_to_rewind(now=100.0)
    assert h.writer.rewind() == 0
    h.writer.append(messages(records(range(6))), now=100.0)
    h.writer.close(CloseReason.COUNT)
    h.settle()
    assert h.commits == [6]
    assert h.final_keys() == ["data/r1/t/0/0/00000000000000000000-00000000000000000005"]


def test_cancelled_before_copy_aborts(h: Harness) -> None:
    h.writer.append(messages(records(range(3))), now=0.0)
    h.writer.cancel.set()
    h.writer.close(CloseReason.REVOKE)
    h.settle()
    assert h.commits == [] and h.final_keys() == [] and h.temp_keys() == []
    assert h.metrics.total("egress_segments_aborted_total") == 1


def test_commit_failure_after_durable_segment_is_counted(h: Harness) -> None:
    h.commit_error = KafkaRetriableError("rebalance in progress")
    h.writer.append(messages(records(range(3))), now=0.0)
    h.writer.close(CloseReason.REVOKE)
    h.settle()
    assert len(h.final_keys()) == 1
    assert h.metrics.total("egress_commit_failures_total") == 1
    assert h.writer.failed is None


@pytest.mark.parametrize(("error", "level"), [
    (KafkaRetriableError("Commit failed: Local: Waiting for coordinator"), logging.WARNING),
    (KafkaFatalError("Commit failed: Broker: Group authorization failed"), logging.ERROR)])
def test_a_commit_failing_while_the_coordinator_moves_is_a_warning(
        h: Harness, caplog: pytest.LogCaptureFixture, error: Exception, level: int) -> None:
    """A node of the source cluster restarting moves the group's coordinator: the commit
    after a durable segment fails once and the next segment's commit covers it. That is
    routine (WARNING); a commit refused for good stays an ERROR."""
    h.commit_error = error
    with caplog.at_level(logging.INFO, "egress.partition_writer"):
        h.writer.append(messages(records(range(3))), now=0.0)
        h.writer.close(CloseReason.REVOKE)
        h.settle()
    lines = [r for r in caplog.records if "is durable but committing offset" in r.getMessage()]
    assert [r.levelno for r in lines] == [level]
    assert h.metrics.total("egress_commit_failures_total") == 1


def test_held_bytes_track_open_and_closing(h: Harness) -> None:
    h.writer.append(messages(records(range(100), size=1000)), now=0.0)
    open_, closing = h.writer.held_bytes()
    assert open_ >= 100_000 and closing == 0
    h.writer.close(CloseReason.MEMORY)
    h.settle()
    assert h.writer.held_bytes() == (0, 0)


def test_headers_reach_the_segment(h: Harness) -> None:
    recs = [Record(0, 1, b"k", b"v", (("a", b"1"), ("a", None)))]
    h.writer.append([FakeMessage(r) for r in recs], now=0.0)
    h.writer.close(CloseReason.AGE)
    h.settle()
    assert read(h, h.final_keys()[0]) == recs
    assert h.writer.segment is None and not h.writer.closing
    assert h.writer.committed_offset == 1


def test_a_writer_cancelled_while_it_copies_never_commits(h: Harness) -> None:
    # The partition was revoked (shutdown timeout passed) or lost while the copy to the
    # final key ran: the segment is visible, but the offset is not this writer's to commit.
    copy = h.store.copy

    def copy_then_lose(src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        info = copy(src, dst, storage_class=storage_class)
        h.writer.cancel.set()
        return info

    h.store.copy = copy_then_lose  # type: ignore[method-assign]
    h.writer.append(messages(records(range(3))), now=0.0)
    h.writer.close(CloseReason.REVOKE)
    h.settle()
    assert h.final_keys() == ["data/r1/t/0/0/00000000000000000000-00000000000000000002"]
    assert h.commits == [] and ("commit", "3") not in h.store.ops


def test_the_first_position_is_recorded_before_the_first_segment_is_visible() -> None:
    calls: list[tuple[int, bool]] = []
    h = make(expected=None)

    def record(ref: object, start: int, *, resumed: bool) -> None:
        with h.store.lock:
            h.store.ops.append(("first_position", str(start)))
        if not calls:
            calls.append((start, resumed))
            raise StorageError("S3 is down")      # the first attempt fails
        calls.append((start, resumed))

    h.pool.shutdown()
    h.first_positions = record
    h.__post_init__()
    try:
        h.writer.append(messages(records(range(7, 10))), now=0.0)
        h.writer.close(CloseReason.COUNT)
        h.writer.append(messages(records(range(10, 12))), now=0.0)
        h.writer.close(CloseReason.COUNT)
        h.settle()
        ops = [op for op, _ in h.store.ops]
        assert ops.index("first_position") < ops.index("copy")
        assert calls == [(7, False), (7, False)]           # retried, then once only
        assert len(h.final_keys()) == 2 and h.commits == [10, 12]
    finally:
        h.close()


def test_a_first_position_that_cannot_be_recorded_keeps_the_segment_invisible() -> None:
    h = make(expected=30)

    def record(ref: object, start: int, *, resumed: bool) -> None:
        assert resumed
        raise StorageError("S3 is down")

    h.pool.shutdown()
    h.first_positions = record
    h.__post_init__()
    try:
        h.writer.append(messages(records(range(30, 33))), now=0.0)
        h.writer.close(CloseReason.COUNT)
        h.settle()
        assert h.final_keys() == [] and h.commits == []
        assert h.writer.failed is not None
        assert h.metrics.total("egress_segment_failures_total", step="first_position") == 1
    finally:
        h.close()


def with_recorder(h: Harness, fail: int = 0) -> list[tuple[int, bool]]:
    """Install a first-position recorder on ``h`` that fails its first ``fail`` calls."""
    calls: list[tuple[int, bool]] = []

    def record(ref: object, start: int, *, resumed: bool) -> None:
        with h.store.lock:
            h.store.ops.append(("first_position", str(start)))
        calls.append((start, resumed))
        if len(calls) <= fail:
            raise StorageError("S3 is down")

    h.pool.shutdown()
    h.first_positions = record
    h.__post_init__()
    return calls


def test_a_chosen_start_is_recorded_as_the_first_position_then_committed_marked() -> None:
    # start = "latest" resolved to offset 2500 at assignment: the first position is in
    # _topic.json before the commit that makes 2500 the resume point, and the commit says
    # it is a chosen start, so a member resuming from it before the first segment (a
    # rebalance, a restart) does not take it for a resume of earlier segments.
    h = make(expected=2500)
    calls = with_recorder(h)
    try:
        assert h.writer.resumed                  # as constructed from a position ...
        h.writer.commit_start()
        assert not h.writer.resumed              # ... it is a start, not a resume
        h.settle()
        assert calls == [(2500, False)]
        ops = [op for op, _ in h.store.ops]
        assert ops.index("first_position") < ops.index("commit")
        assert h.first_commits == [2500] and h.commits == [2500]
        # The first segment does not record it again; its commit is an ordinary one.
        h.writer.append(messages(records(range(2500, 2503))), now=0.0)
        h.writer.close(CloseReason.COUNT)
        h.settle()
        assert calls == [(2500, False)]
        assert h.commits == [2500, 2503] and h.first_commits == [2500]
    finally:
        h.close()


def test_a_start_whose_first_position_cannot_be_recorded_is_still_committed() -> None:
    # S3 down at assignment: the start is committed anyway (a restart must not move it to
    # a later end of the log), and the first segment records the first position, not as
    # a resume, before it is visible.
    h = make(expected=2500)
    calls = with_recorder(h, fail=3)              # every attempt of the retry policy
    try:
        h.writer.commit_start()
        h.settle()
        assert h.first_commits == [2500]
        assert calls == [(2500, False)] * 3
        h.writer.append(messages(records(range(2500, 2503))), now=0.0)
        h.writer.close(CloseReason.COUNT)
        h.settle()
        assert calls[3:] == [(2500, False)]
        assert h.final_keys() == ["data/r1/t/0/0/00000000000000002500-00000000000000002502"]
    finally:
        h.close()


def test_a_cancelled_start_records_and_commits_nothing() -> None:
    h = make(expected=2500)
    calls = with_recorder(h)
    try:
        h.writer.cancel.set()                     # revoked before the task ran
        h.writer.commit_start()
        h.settle()
        assert calls == [] and h.commits == []
    finally:
        h.close()


class FreshMessage(FakeMessage):
    """Returns new objects from every accessor, as the consumer's messages do."""

    def offset(self) -> int:
        return int(str(self._r.offset))

    def key(self) -> bytes | None:
        return None if self._r.key is None else bytes(bytearray(self._r.key))

    def value(self) -> bytes | None:
        return None if self._r.value is None else bytes(bytearray(self._r.value))


@pytest.mark.parametrize("size", [20, 1000])
def test_held_bytes_count_what_buffered_rows_really_hold(size: int) -> None:
    # 30-byte records held 7.6 times what was counted (Python objects per row), so a
    # budget that bounds 1 KiB records let many partitions of small ones exceed it.
    msgs = [FreshMessage(r) for r in records(range(10**9, 10**9 + 30_000), size=size)]
    seg = Segment(0, 0.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(0, len(msgs), 2000):
            seg.columns.add(msgs[i:i + 2000])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = seg.held_bytes()
    assert 1 / 1.5 <= held / counted <= 1.5, (held, counted)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _malloc_in_use() -> int | None:
    """Bytes glibc malloc has handed out (``None`` without glibc's ``mallinfo2``)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    return int(m.uordblks + m.hblkhd)


def test_a_flushed_batch_counts_its_own_objects() -> None:
    # With 30-byte records and many partitions, rows are flushed as batches of a few hundred;
    # each holds ~5 KB beyond its Arrow bytes (C++ arrays, buffer wrappers, the Python
    # objects under its buffers), which the budget did not count.
    if _malloc_in_use() is None:
        pytest.skip("needs glibc mallinfo2")
    runs = [[FreshMessage(r) for r in records(range(i * 300, (i + 1) * 300), size=30)]
            for i in range(300)]
    held = GroupBuffer(1024**3)      # a segment writer's buffer, holding every batch
    before = _malloc_in_use() or 0
    for run in runs:
        buf = ColumnBuffer()
        buf.add(run)
        assert not list(held.add(buf.take()))
    used = (_malloc_in_use() or 0) - before
    assert used > 1.15 * held.nbytes, (used, held.nbytes)   # Arrow bytes alone: 1.2x under
    assert 1 / 1.15 <= used / held.held_bytes <= 1.15, (used, held.held_bytes)


def test_rows_become_a_batch_at_the_flush_size() -> None:
    # With many partitions the poll loop lowers flush_bytes: buffered rows (Python
    # objects) are then handed to the worker as one batch long before the segment closes.
    h = Harness()
    try:
        h.writer.flush_bytes = 10 * (ROW_OVERHEAD + 12)    # 10 rows of 2 + 10 bytes
        h.writer.append(messages(records(range(9), size=10)), now=0.0)
        seg = h.writer.segment
        assert seg is not None and seg.submitted == 0 and len(seg.columns) == 9
        h.writer.append(messages(records(range(9, 10), size=10)), now=0.0)
        assert len(seg.columns) == 0 and seg.submitted > 0
        assert seg.count == 10
    finally:
        h.close()


def test_a_resumed_partition_records_its_first_position_at_assignment() -> None:
    # Segments written by an egress that did not record first positions: an idle
    # partition would only record its entry at its next segment, and ingress would wait
    # for it meanwhile.
    h = make(expected=300)
    calls = with_recorder(h)
    try:
        h.writer.record_resumed()
        h.settle()
        assert calls == [(300, True)] and h.commits == []
        h.writer.append(messages(records(range(300, 303))), now=0.0)
        h.writer.close(CloseReason.COUNT)
        h.settle()
        assert calls == [(300, True)]              # not again at the first segment
    finally:
        h.close()
