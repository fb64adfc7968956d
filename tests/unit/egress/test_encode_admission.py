"""The admission of encodes within the memory budget (``egress.flow.EncodeAdmissions``,
``egress.encode_gate``) and the working memory an encode reserves."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.encode_gate import EncodeCancelled, EncodeGate
from egress.flow import EncodeAdmissions, encode_reservation
from formats.parquet import ENCODE_UNIT, row_group_slices

MiB = 1024**2

# Each step: ("request", size) | ("release", index among granted) | ("held", bytes).
steps = st.lists(st.one_of(
    st.tuples(st.just("request"), st.integers(0, 300)),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("held"), st.integers(0, 150))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(budget=st.integers(1, 100), ops=steps)
def test_reservations_stay_within_the_budget_and_every_request_is_granted(
        budget: int, ops: list[tuple[str, int]]) -> None:
    a = EncodeAdmissions(budget)
    requested: list[int] = []
    for op, n in ops:
        before = set(a.granted)
        if op == "request":
            requested.append(len(requested))
            a.request(len(requested) - 1, n)
        elif op == "release" and a.granted:
            a.release(list(a.granted)[n % len(a.granted)])
        elif op == "held":
            a.set_held(n)
        # A grant fits what segments hold and the other reservations, or runs alone.
        if set(a.granted) - before:
            assert len(a.granted) == 1 or a.held + a.reserved <= budget
        assert a.reserved == sum(a.granted.values())
        assert a.reserved <= budget or len(a.granted) == 1
        # No deadlock: while a request waits, some encode holds a reservation (and ends).
        assert a.waiting == 0 or a.granted
        # In arrival order: no request is granted before an earlier one.
        assert all(int(k) < int(w) for k in a.granted for w in a._waiting)  # type: ignore[call-overload]
    # Completions in any order: every request is eventually granted.
    done = set()
    while a.granted:
        key = next(iter(a.granted))
        a.release(key)
        done.add(key)
    assert a.waiting == 0
    assert a.reserved == 0


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(1, 100), sizes=st.lists(st.integers(0, 300), max_size=30),
       order=st.randoms(use_true_random=False))
def test_every_request_is_granted_whatever_the_completion_order(
        budget: int, sizes: list[int], order: object) -> None:
    a = EncodeAdmissions(budget)
    for i, n in enumerate(sizes):
        a.request(i, n)
    granted: list[object] = []
    while a.granted:
        assert a.reserved <= budget or len(a.granted) == 1
        key = order.choice(sorted(a.granted, key=id))  # type: ignore[attr-defined]
        granted.append(key)
        a.release(key)
    assert sorted(granted) == list(range(len(sizes)))  # type: ignore[type-var]


def test_an_oversized_encode_runs_alone_and_then_the_others() -> None:
    a = EncodeAdmissions(10)
    assert a.request("small", 4)
    assert not a.request("huge", 40)          # waits for the running one
    assert not a.request("after", 1)          # never overtakes the huge one
    a.release("small")
    assert set(a.granted) == {"huge"}         # alone, past the budget
    a.release("huge")
    assert set(a.granted) == {"after"}


def test_what_segments_hold_leaves_room_for_one_encode_only() -> None:
    a = EncodeAdmissions(10)
    a.set_held(9)
    assert a.request(1, 5)                    # alone: progress
    assert not a.request(2, 1)                # 9 + 5 + 1 > 10
    a.set_held(0)
    assert a.granted.keys() == {1, 2}
    assert a.peak == 9 + 5


def test_a_waiting_encode_gives_up_when_its_partition_is_cancelled() -> None:
    gate = EncodeGate(10)
    held = threading.Event()
    cancel = threading.Event()
    errors: list[BaseException] = []
    with gate.reserve(8, threading.Event()):
        def wait() -> None:
            try:
                with gate.reserve(8, cancel):
                    held.set()
            except EncodeCancelled as e:
                errors.append(e)
        t = threading.Thread(target=wait)
        t.start()
        cancel.set()
        t.join(10)
    assert errors and not held.is_set()
    assert gate.reserved == 0 and gate.waiting == 0


def test_the_gate_runs_waiting_encodes_as_reservations_end() -> None:
    gate = EncodeGate(10)
    ran: list[int] = []
    lock = threading.Lock()
    live = [0]

    def encode(i: int) -> None:
        with gate.reserve(6, threading.Event()):
            with lock:
                live[0] += 1
                assert live[0] == 1           # 6 + 6 > 10: one at a time
            with lock:
                live[0] -= 1
                ran.append(i)

    threads = [threading.Thread(target=encode, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(ran) == list(range(8))
    assert gate.reserved == 0


@pytest.mark.parametrize("row_bytes", [[10] * 5, [5 * MiB], [8 * MiB, 8 * MiB, 3],
                                       [MiB] * 9, [0, 9 * MiB, 1, 2, 3 * MiB, 3 * MiB]])
def test_row_groups_hold_a_unit_or_one_larger_row(row_bytes: list[int]) -> None:
    slices = row_group_slices(row_bytes)
    assert [i for s, n in slices for i in range(s, s + n)] == list(range(len(row_bytes)))
    for s, n in slices:
        assert n == 1 or sum(row_bytes[s:s + n]) <= ENCODE_UNIT


_MEASURE = """
import io, os, sys
import pyarrow as pa
from formats.base import SEGMENT_SCHEMA, WriterOptions
from formats.parquet import ParquetSegmentWriter

class Null(io.RawIOBase):
    n = 0
    def writable(self): return True
    def write(self, b): self.n += len(b); return len(b)
    def tell(self): return self.n

n, size = int(sys.argv[1]), int(sys.argv[2])
table = pa.table({
    "offset": pa.array(range(n), pa.int64()),
    "timestamp": pa.array([0] * n, pa.timestamp("ms", tz="UTC")),
    "timestamp_type": pa.array([0] * n, pa.int8()),
    "key": pa.array([b"k%d" % i for i in range(n)]),
    "value": pa.array([os.urandom(size) for _ in range(n)], pa.binary()),
    "headers": pa.array([[]] * n, SEGMENT_SCHEMA.field("headers").type)}, schema=SEGMENT_SCHEMA)
pool = pa.default_memory_pool()
before = pool.bytes_allocated()
ParquetSegmentWriter(Null(), WriterOptions())._write_group(table.to_batches())
print(table.nbytes, pool.max_memory() - before)
"""


@pytest.mark.parametrize(("n", "size"), [(2, 8 * MiB), (12, MiB), (4000, 1024)])
def test_the_reservation_covers_arrows_working_memory(n: int, size: int) -> None:
    # Arrow's pool high-water mark while a group is encoded (a fresh process, so the mark
    # is this encode's) stays within what the encode reserves; the Python copy of the page
    # written is the rest of the reservation. Two 8 MiB records in one row group held
    # 48 MiB of Arrow's memory before groups were cut (the reservation is 36 MiB).
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(n), str(size)], check=True,
                          capture_output=True, text=True, env=os.environ)
    nbytes, working = map(int, done.stdout.split())
    assert 0 < working <= encode_reservation(nbytes, size + 8, ENCODE_UNIT)
