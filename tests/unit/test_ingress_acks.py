"""At-least-once over the process's shared idempotent producer (``ingress.acks``): each
sink's failures and acknowledgements are its own, and no checkpoint ever covers a record
that was not delivered (RELIABILITY.md, "At-least-once delivery under failure"). The seam's
``Producer`` runs for real over a fake client (``tests/unit/ingress_fakes.py``).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from ingress import delivery
from ingress.acks import SharedAcks, SharedAckSink
from ingress.delivery import AtLeastOnce
from ingress.rows import Rows
from replicator.core.errors import (
    KafkaFatalError,
    KafkaRetriableError,
    RecordRefused,
    ReplicatorError,
)
from replicator.core.kafka import Producer
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint
from tests.unit.ingress_fakes import FakeClient, Queued, fake_producer, too_large

DEST = "copy"
CPS = "cps"


def rows(lo: int, hi: int, value: bytes = b"v") -> Rows:
    n = hi - lo
    return Rows(list(range(lo, hi)), [1] * n, [b"k"] * n, [value] * n, [None] * n)


class Acks:
    """A ``SharedAcks`` over the seam and a fake client, and its checkpoints."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, auto: bool = True,
                 capacity: int | None = None, timeout: float = 5.0,
                 ack_timeout: float = 3.0) -> None:
        # A regression fails in seconds, not after the 120 s of production.
        monkeypatch.setattr(delivery, "ACK_TIMEOUT", ack_timeout)
        self.clients: list[FakeClient] = []
        self.monkeypatch = monkeypatch
        self.auto = auto
        self.capacity = capacity
        self.shared = SharedAcks(KafkaSettings(brokers="fake:1"), timeout=timeout,
                                 make_producer=self._make)
        self.shared.start()

    def _make(self) -> Producer:
        p, c = fake_producer(self.monkeypatch, auto=self.auto, capacity=self.capacity,
                             name="ingress producer", track_acks=True)
        self.clients.append(c)
        return p

    @property
    def client(self) -> FakeClient:
        return self.clients[-1]

    def sink(self, partition: int = 0) -> SharedAckSink:
        s = SharedAckSink(self.shared, topic=DEST, partition=partition,
                          checkpoint_topic=CPS)
        s.start()
        return s

    def delivery(self, sink: SharedAckSink, key: str) -> AtLeastOnce:
        return AtLeastOnce(sink, key, f"{key}->{sink.where}",
                           on_checkpointed=lambda cp: None, on_aborted=lambda: None)

    def checkpoints(self, key: str) -> list[int]:
        """Offsets of ``key``'s checkpoints the broker appended."""
        self.client.answer()
        self.client.poll()
        return [Checkpoint.decode(q.value).offset for q in self.client.log
                if q.topic == CPS and q.key == key.encode() and q.value is not None]


def cp(offset: int) -> Checkpoint:
    return Checkpoint(offset, "seg", datetime.now(UTC))


def test_a_failure_in_fan_in_belongs_to_the_source_whose_record_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sources replay into one destination partition. B's second record is refused
    (a smaller destination ``max.message.bytes``). Was: failures were kept per destination
    partition, A's wait took B's failure (A restarted for nothing) and B, finding no
    failure and nothing outstanding, checkpointed past the record that never arrived."""
    acks = Acks(monkeypatch)
    a, b = acks.sink(), acks.sink()

    def refuse(q: Queued) -> object:
        return too_large() if q.value == b"huge" else None

    acks.client.fail = refuse  # type: ignore[assignment]
    a.produce(rows(0, 3))
    b.produce(Rows([10, 11, 12], [1] * 3, [b"k"] * 3, [b"v", b"huge", b"v"], [None] * 3))
    assert a.outstanding(0.0) == 0                   # A's records are all delivered
    with pytest.raises(RecordRefused, match="the destination refused"):
        b.outstanding(0.0)
    with pytest.raises(KafkaRetriableError):
        b.produce_checkpoint("src-b", cp(12))        # and never a checkpoint after it
    assert acks.checkpoints("src-b") == []


def test_a_session_never_checkpoints_past_a_record_that_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fan-in through the worker's durability method: B's batch holds a refused record;
    B's settle must raise and leave no checkpoint at or above it, while A goes on."""
    acks = Acks(monkeypatch, auto=False)
    a, b = acks.sink(), acks.sink()
    acks.client.fail = lambda q: too_large() if q.value == b"huge" else None
    da, db = acks.delivery(a, "src-a"), acks.delivery(b, "src-b")
    da.deliver(rows(0, 3), cp(2))
    db.deliver(Rows([10, 11], [1, 1], [b"k", b"k"], [b"huge", b"v"], [None, None]), cp(11))
    acks.client.auto = True          # the broker answers; A happens to poll first
    da.settle()
    with pytest.raises(KafkaRetriableError):
        db.settle()
    assert acks.checkpoints("src-a") == [2]
    assert acks.checkpoints("src-b") == []


def test_what_was_delivered_is_read_before_the_failures_are_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One source. The failure report and the batch's end are served by another thread
    between the sink's two reads. Was: failures were taken first (none yet), then the
    delivered count (the whole batch, the failed record included): nothing outstanding,
    and the checkpoint went out past the failed record."""
    acks = Acks(monkeypatch, auto=False)
    s = acks.sink()
    d = acks.delivery(s, "src")
    acks.client.fail = lambda q: too_large() if q.value == b"huge" else None
    d.deliver(Rows([0, 1, 2], [1] * 3, [b"k"] * 3, [b"v", b"huge", b"v"], [None] * 3),
              cp(2))
    serve_between(acks, s)
    with pytest.raises(KafkaRetriableError):
        d.settle()
    assert acks.checkpoints("src") == []


def serve_between(acks: Acks, sink: SharedAckSink) -> None:
    """Make the answers arrive (served by "another thread") right when the sink reads
    how many of its records were delivered: the worst moment for the reads' order."""
    read = sink.unanswered

    def unanswered() -> int:
        acks.client.answer()
        acks.client.poll()
        return read()

    sink.unanswered = unanswered  # type: ignore[method-assign]


def test_a_sink_counts_only_its_own_unacknowledged_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fan-in: B's records are acknowledged, A's (produced after them) are not yet. Was:
    the count was the destination partition's, so B waited for A's records too."""
    acks = Acks(monkeypatch, auto=False)
    a, b = acks.sink(), acks.sink()
    b.produce(rows(10, 12))
    a.produce(rows(0, 3))
    acks.client.answer(2)                    # the broker answered B's two records
    assert b.outstanding(0.0) == 0
    assert a.outstanding(0.0) == 3


def test_a_source_settles_while_another_keeps_its_destination_partition_busy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fan-in livelock: source A catches up and always has a record in flight in the
    shared destination partition. Was: B's settle waited for the partition's count to
    reach its own, never did, and B restarted at ``ACK_TIMEOUT`` in a loop (duplicates)."""
    acks = Acks(monkeypatch, auto=False, ack_timeout=1.0)
    a, b = acks.sink(), acks.sink()
    db = acks.delivery(b, "src-b")
    db.deliver(rows(10, 12), cp(11))
    offset = iter(range(1000))
    busy = [False]

    def a_produces_more() -> None:           # each poll: answers, and A's next record
        if busy[0]:
            return
        busy[0] = True
        try:
            acks.client.answer()
            a.produce(rows(next(offset), next(offset) + 1))
        finally:
            busy[0] = False

    acks.client.on_poll = a_produces_more
    db.settle()                               # was: KafkaRetriableError after 1 s
    acks.client.on_poll = lambda: None
    assert acks.checkpoints("src-b") == [11]


@pytest.mark.parametrize("waiting", ["records", "checkpoint"])
def test_a_full_producer_queue_does_not_block_the_revoke(
        monkeypatch: pytest.MonkeyPatch, waiting: str) -> None:
    """The broker stopped answering and the local queue is full: a worker's produce waits
    for space. The revoke deadline's release must purge the producer (the only thing that
    empties the queue) at once. Was: the produce waited holding the lock the release
    needs, so the revoke callback blocked up to ``message.timeout.ms``."""
    acks = Acks(monkeypatch, auto=False, capacity=4)
    s = acks.sink()
    outcome: list[BaseException | None] = []

    if waiting == "checkpoint":
        s.produce(rows(0, 4))                # fills the queue; the checkpoint waits

    def produce() -> None:
        try:
            if waiting == "records":
                s.produce(rows(0, 10))
            else:
                s.produce_checkpoint("src", cp(3))
            outcome.append(None)
        except ReplicatorError as e:
            outcome.append(e)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    first = acks.client
    deadline = time.monotonic() + 5
    while len(first) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(first) == 4                   # the queue is full, the produce waits
    released = threading.Thread(target=acks.shared.release, args=(s,), daemon=True)
    started = time.monotonic()
    released.start()
    released.join(3)
    assert not released.is_alive(), "the release waited for the full queue"
    assert time.monotonic() - started < 3
    t.join(3)
    assert outcome and isinstance(outcome[0], KafkaFatalError)
    assert first.log == []                   # nothing of the purged queue was delivered
    assert acks.client is not first          # a new producer for the other partitions
