"""The process's shared producer: ownership epochs, the transaction loop's steps and its
refusals, with a fake producer (the Kafka behaviour itself is in
tests/integration/test_kafka_ingress_fencing.py and test_kafka_exactly_once.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from ingress.limits import DestinationLimits
from ingress.metrics import IngressMetrics
from ingress.ownership import Ownership
from ingress.rows import Rows
from ingress.transactions import Batch, PartitionRevoked, TransactionLoop
from replicator.core.errors import (
    GenerationFenced,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
)
from replicator.core.kafka import DeliveryReport, GroupMetadata, Producer, TopicPartition
from replicator.core.metrics import Metrics
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint

T = "dest"
IN_GENERATION = GroupMetadata(b"CGMDv2:\x07\x00\x00\x00grp\x00member-1\x00\x01")
NO_GENERATION = GroupMetadata(b"CGMDv2:\xff\xff\xff\xffgrp\x00\x00\x01")


class FakeProducer:
    """Records what a transaction did; hooks make steps fail or block."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.open: list[tuple[str, int, int]] = []
        self.committed: list[tuple[str, int, int]] = []
        self.on_offsets: Callable[[], None] = lambda: None
        self.on_commit: Callable[[], None] = lambda: None
        self.queued_checkpoints = 0
        """Checkpoint records produced and not delivered yet (a flush delivers them)."""
        self.undelivered_at_offsets: list[int] = []
        self.refuse: set[int] = set()
        """Partitions whose records the destination refuses (``MSG_SIZE_TOO_LARGE``)."""
        self.refuse_values: set[bytes] = set()
        """Values the destination refuses (the request holding one: its partition)."""
        self.failures: list[Any] = []
        self.calls: list[tuple[str, int]] = []
        """``produce_many`` calls: (topic, records)."""

    def init_transactions(self, timeout: float) -> None:
        self.log.append("init")

    def begin_transaction(self) -> None:
        self.log.append("begin")
        self.open = []

    def produce_many(self, topic: str, partition: int, timestamps: Sequence[int],
                     keys: Sequence[bytes | None], values: Sequence[bytes | None],
                     headers: Sequence[Any], ids: Sequence[int], **kw: Any) -> None:
        self.calls.append((topic, len(ids)))
        self.log.append(f"produce {topic}[{partition}]:{len(ids)}")
        if partition in self.refuse or self.refuse_values.intersection(values):
            self.failures.append(DeliveryReport(topic, partition, -1, RecordRefused(
                f"{topic}[{partition}]: refused", reason="Broker: Message size too large")))
            return
        self.open += [(topic, partition, o) for o in ids]

    def flush(self, timeout: float) -> int:
        self.log.append("flush")
        self.queued_checkpoints = 0
        return 0

    def check_deliveries(self, where: str) -> None:
        pass

    def take_failures(self) -> list[Any]:
        out, self.failures = self.failures, []
        return out

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None) -> None:
        self.log.append(f"checkpoint {key!r}")
        self.queued_checkpoints += 1

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group: GroupMetadata,
                                    timeout: float) -> None:
        self.log.append("offsets")
        self.undelivered_at_offsets.append(self.queued_checkpoints)
        self.on_offsets()

    def commit_transaction(self, timeout: float) -> None:
        self.on_commit()
        self.log.append("commit")
        self.committed += self.open
        self.open = []

    def abort_transaction(self, timeout: float) -> None:
        self.log.append("abort")
        self.open = []


class Harness:
    def __init__(self, group: GroupMetadata = IN_GENERATION,
                 limits: DestinationLimits | None = None) -> None:
        self.log: list[str] = []
        self.producers: list[FakeProducer] = []
        self.ownership = Ownership()
        self.metrics = Metrics()
        self.group = group
        self.loop = TransactionLoop(KafkaSettings(brokers="unused:1"), transactional_id="g.a",
                                    checkpoint_topic="cps", ownership=self.ownership,
                                    group=lambda: self.group,
                                    metrics=IngressMetrics.create(self.metrics), timeout=5,
                                    make_producer=self._make, limits=limits)

    def _make(self) -> Producer:
        p = FakeProducer(self.log)
        self.producers.append(p)
        return cast("Producer", p)

    @property
    def producer(self) -> FakeProducer:
        return self.producers[-1]

    def batch(self, partition: int, lo: int, hi: int, epoch: int | None = None,
              value: bytes = b"v") -> Batch:
        e = self.ownership.epoch((T, partition)) if epoch is None else epoch
        n = hi - lo
        rows = Rows(list(range(lo, hi)), [1] * n, [b"k"] * n, [value] * n, [None] * n)
        return Batch(T, partition, e or 0, rows, f"src:{partition}",
                     Checkpoint(hi - 1, "seg", datetime.now(UTC)))

    def outcome(self, b: Batch) -> BaseException | None:
        try:
            self.loop.wait(b)
        except ReplicatorError as e:
            return e
        return None


@pytest.fixture
def h() -> Iterator[Harness]:
    h = Harness()
    h.ownership.grant([(T, 0), (T, 1)])
    yield h
    h.loop.close()


def test_batches_of_several_partitions_share_one_transaction_in_the_durability_order(
        h: Harness) -> None:
    b0, b1 = h.batch(0, 0, 3), h.batch(1, 0, 2)
    h.loop.submit(b0)
    h.loop.submit(b1)
    h.loop.start()
    assert h.outcome(b0) is None and h.outcome(b1) is None
    assert h.producer.committed == [(T, 0, 0), (T, 0, 1), (T, 0, 2), (T, 1, 0), (T, 1, 1)]
    assert h.log == ["init", "begin", "produce dest[0]:3", "produce dest[1]:2", "flush",
                     "checkpoint b'src:0'", "checkpoint b'src:1'", "flush", "offsets", "commit"]


def test_a_refused_record_fails_only_its_partition_and_the_others_commit_at_once(
        h: Harness) -> None:
    """The destination refuses partition 0's batch for good (larger than its
    max.message.bytes). Was: the whole shared transaction failed and every partition in it
    restarted its session; now only partition 0's batch fails, naming the record, and
    partition 1's goes into the next transaction without waiting."""
    h.loop.start()
    h.producer.refuse = {0}
    b0, b1 = h.batch(0, 0, 3, value=b"x" * 500), h.batch(1, 0, 2)
    h.loop.submit(b0)
    h.loop.submit(b1)
    err = h.outcome(b0)
    assert isinstance(err, RecordRefused)
    assert "source offset 0" in str(err) and err.offset == 0
    assert h.outcome(b1) is None
    assert h.producer.committed == [(T, 1, 0), (T, 1, 1)]
    assert h.log.count("abort") == 1 and h.log.count("commit") == 1
    assert h.metrics.total("replicator_ingress_transactions_total", outcome="refused") == 1


def test_in_fan_in_only_the_source_whose_record_was_refused_stops(h: Harness) -> None:
    """Two sources write partition 0 (fan-in) and one of them holds a record the
    destination refuses: the refusal names the partition, not the source, so the loop sets
    the partition's batches apart (one per transaction) until it knows which; the other
    source's batch and partition 1's commit."""
    h.loop.start()
    h.producer.refuse_values = {b"huge"}
    bad = h.batch(0, 0, 3, value=b"huge")
    ok = h.batch(0, 0, 2)
    ok.key = "src:other"
    other = h.batch(1, 0, 2)
    for b in (bad, ok, other):
        h.loop.submit(b)
    assert isinstance(h.outcome(bad), RecordRefused)
    assert h.outcome(ok) is None and h.outcome(other) is None
    assert sorted(h.producer.committed) == [(T, 0, 0), (T, 0, 1), (T, 1, 0), (T, 1, 1)]
    assert h.loop._apart == set()


def test_a_batch_above_its_topics_limit_is_produced_in_rounds_that_fit() -> None:
    """A topic limited to 10 KB: its batch of 40 records of 1 KB goes out in chunks of at
    most 9 records, each flushed before the next is enqueued (librdkafka would otherwise
    batch them together); the ordinary topic's batch goes out whole in the first round."""
    limits = DestinationLimits()
    limits.update(T, 10_000)
    h = Harness(limits=limits)
    h.ownership.grant([(T, 0), ("plain", 0)])
    try:
        h.loop.start()
        small = h.batch(0, 0, 40, value=b"x" * 1000)
        n = 5
        plain = Batch("plain", 0, h.ownership.epoch(("plain", 0)) or 0,
                      Rows(list(range(n)), [1] * n, [b"k"] * n, [b"v"] * n, [None] * n),
                      "src:p", Checkpoint(n - 1, "seg", datetime.now(UTC)))
        h.loop.submit(small)
        h.loop.submit(plain)
        assert h.outcome(small) is None and h.outcome(plain) is None
        sizes = [k for t, k in h.producer.calls if t == T]
        assert sum(sizes) == 40 and max(sizes) <= 9 and len(sizes) == 5
        steps = [e for e in h.log if e.startswith(("produce", "flush"))]
        assert steps[:3] == ["produce dest[0]:9", "produce plain[0]:5", "flush"]
        assert steps[3:11:2] == ["produce dest[0]:9"] * 3 + ["produce dest[0]:4"]
        assert steps[4:12:2] == ["flush"] * 4                 # one chunk per round
        assert [o for t, _, o in h.producer.committed if t == T] == list(range(40))
    finally:
        h.loop.close()


def test_checkpoints_are_in_the_log_before_the_generation_check(h: Harness) -> None:
    """The generation check (``send_offsets_to_transaction``) is what stops a former
    member; the next owner's checkpoint load waits for a transaction only if its
    checkpoint record is in the log. Was: the checkpoints were still queued (linger) at
    the check and reached the log only in the commit, so a member whose commit stalled
    past ``revoke_timeout`` let the next owner load the older checkpoint and replay, and
    the stalled commit then landed too: the batch twice."""
    b0, b1 = h.batch(0, 0, 3), h.batch(1, 0, 2)
    h.loop.submit(b0)
    h.loop.submit(b1)
    h.loop.start()
    assert h.outcome(b0) is None and h.outcome(b1) is None
    assert h.producer.undelivered_at_offsets == [0]


def test_a_batch_of_a_revoked_partition_never_joins_a_transaction(h: Harness) -> None:
    b0 = h.batch(0, 0, 3)
    assert h.ownership.revoke([(T, 0)], 1.0)
    h.loop.start()
    h.loop.submit(b0)
    assert isinstance(h.outcome(b0), PartitionRevoked)
    assert "begin" not in h.log and h.producer.committed == []


def test_a_batch_of_a_former_grant_is_refused_although_the_partition_came_back(
        h: Harness) -> None:
    """A worker that missed its revoke deadline still waits with its batch when the
    partition is assigned to this process again: only the new worker's batches commit."""
    old = h.batch(0, 0, 3)
    h.ownership.revoke([(T, 0)], 1.0)
    h.ownership.grant([(T, 0)])
    new = h.batch(0, 0, 3)
    assert new.epoch != old.epoch
    h.loop.submit(old)
    h.loop.submit(new)
    h.loop.start()
    assert isinstance(h.outcome(old), PartitionRevoked)
    assert h.outcome(new) is None
    assert h.producer.committed == [(T, 0, 0), (T, 0, 1), (T, 0, 2)]


def test_a_partition_revoked_before_the_commit_aborts_and_the_others_commit_next(
        h: Harness) -> None:
    b0, b1 = h.batch(0, 0, 3), h.batch(1, 0, 2)
    revoked = threading.Event()

    def revoke_once() -> None:
        if not revoked.is_set():
            revoked.set()
            h.ownership.revoke([(T, 0)], 1.0)

    h.loop.start()
    h.producer.on_offsets = revoke_once
    h.loop.submit(b0)
    h.loop.submit(b1)
    assert isinstance(h.outcome(b0), PartitionRevoked)
    assert h.outcome(b1) is None
    assert h.producer.committed == [(T, 1, 0), (T, 1, 1)]
    assert h.log.count("abort") == 1 and h.log.count("commit") == 1
    assert h.metrics.total("replicator_ingress_transactions_total", outcome="revoked") == 1


def test_revoke_waits_for_a_commit_that_contains_the_partition(h: Harness) -> None:
    release = threading.Event()
    committing = threading.Event()

    def slow_commit() -> None:
        committing.set()
        release.wait(10)

    h.loop.start()
    h.producer.on_commit = slow_commit
    b0 = h.batch(0, 0, 3)
    h.loop.submit(b0)
    assert committing.wait(5)
    assert not h.ownership.revoke([(T, 0)], 0.2)     # still committing at the deadline
    threading.Timer(0.3, release.set).start()
    started = time.monotonic()
    assert h.ownership.revoke([(T, 0)], 5.0)          # returns once the commit ended
    assert time.monotonic() - started >= 0.2
    assert h.outcome(b0) is None


def test_a_waiting_worker_gives_up_its_batch_once_the_partition_is_revoked(
        h: Harness) -> None:
    b0 = h.batch(0, 0, 3)
    h.loop.submit(b0)          # the loop is not running: the batch waits
    threading.Timer(0.3, lambda: h.ownership.revoke([(T, 0)], 1.0)).start()
    h.loop._thread = threading.Thread(target=time.sleep, args=(3,))  # "alive"
    h.loop._thread.start()
    started = time.monotonic()
    assert isinstance(h.outcome(b0), PartitionRevoked)
    assert time.monotonic() - started < 2


def test_a_member_in_no_generation_never_commits() -> None:
    h = Harness(group=NO_GENERATION)
    h.ownership.grant([(T, 0)])
    try:
        h.loop.start()
        b0 = h.batch(0, 0, 3)
        h.loop.submit(b0)
        assert isinstance(h.outcome(b0), GenerationFenced)
        assert h.producer.committed == [] and "abort" in h.log and "offsets" not in h.log
        assert h.metrics.total("replicator_ingress_transactions_total",
                               outcome="generation") == 1
    finally:
        h.loop.close()


def test_a_fenced_producer_is_recreated_and_initialised_again(h: Harness) -> None:
    fenced = [True]

    def fence_once() -> None:
        if fenced.pop() if fenced else False:
            raise ProducerFenced("injected: fenced")

    h.loop.start()
    h.producer.on_commit = fence_once
    b0 = h.batch(0, 0, 3)
    h.loop.submit(b0)
    assert isinstance(h.outcome(b0), ProducerFenced)
    again = h.batch(0, 0, 3)
    h.loop.submit(again)
    assert h.outcome(again) is None
    assert len(h.producers) == 2 and h.log.count("init") == 2
    assert h.producer.committed == [(T, 0, 0), (T, 0, 1), (T, 0, 2)]


def test_closing_an_at_least_once_sink_with_nothing_outstanding_does_not_wait() -> None:
    """Many partitions stopped at once close one after another on the replay pool: a sink
    with nothing unacknowledged must not wait a poll timeout (was 50 ms each)."""
    from ingress.acks import SharedAcks, SharedAckSink

    polls: list[float] = []

    class Idle:
        def poll(self, timeout: float) -> int:
            polls.append(timeout)
            time.sleep(timeout)
            return 0

        def take_failures(self, topic: str, partition: int) -> list[Any]:
            return []

        def done(self, topic: str, partition: int) -> int:
            return 0

    shared = SharedAcks(KafkaSettings(brokers="x:1"),
                        make_producer=lambda: cast(Producer, Idle()))
    shared.start()
    sinks = [SharedAckSink(shared, topic=T, partition=p, checkpoint_topic="cps")
             for p in range(50)]
    t0 = time.monotonic()
    for s in sinks:
        s.start()
        s.close()
    assert polls and all(t == 0.0 for t in polls), polls[:5]
    assert time.monotonic() - t0 < 1.0


def test_revoke_waits_for_a_commit_of_the_partition_by_any_of_several_loops() -> None:
    """``ingress.producers > 1``: loop 0 commits partition 0 (slowly) while loop 1 commits
    partition 1. Was: the commit in progress was one set, which loop 1's commit overwrote
    and cleared, so the revoke of partition 0 returned while loop 0 still committed it."""
    h = Harness()
    h.ownership.grant([(T, 0), (T, 1)])
    second: list[FakeProducer] = []

    def make() -> Producer:
        p = FakeProducer(h.log)
        second.append(p)
        return cast("Producer", p)

    other = TransactionLoop(KafkaSettings(brokers="unused:1"), transactional_id="g.a.1",
                            checkpoint_topic="cps", ownership=h.ownership,
                            group=lambda: h.group,
                            metrics=IngressMetrics.create(Metrics()), timeout=5,
                            make_producer=make, name="transactions-1")
    release, committing = threading.Event(), threading.Event()

    def slow_commit() -> None:
        committing.set()
        release.wait(10)

    try:
        h.loop.start()
        other.start()
        h.producer.on_commit = slow_commit
        b0 = h.batch(0, 0, 3)
        h.loop.submit(b0)
        assert committing.wait(5)                 # loop 0 is committing partition 0
        b1 = h.batch(1, 0, 2)
        other.submit(b1)
        other.wait(b1)                            # loop 1 committed partition 1
        assert not h.ownership.revoke([(T, 0)], 0.3), \
            "revoke returned while another loop still committed the partition"
        release.set()
        assert h.ownership.revoke([(T, 0)], 5.0)
        assert h.outcome(b0) is None
    finally:
        release.set()
        other.close()
        h.loop.close()


def test_a_retired_workers_batch_is_refused_while_the_partition_stays_owned(
        h: Harness) -> None:
    """A worker stopped without a revoke (its source no longer wanted) and a new worker of
    the same partition: only the new one's batches commit."""
    old = h.batch(0, 0, 3)
    assert h.ownership.retire(old.epoch, 1.0)
    new = h.batch(0, 0, 3)
    assert new.epoch != old.epoch
    h.loop.submit(old)
    h.loop.submit(new)
    h.loop.start()
    assert isinstance(h.outcome(old), PartitionRevoked)
    assert h.outcome(new) is None
    assert h.producer.committed == [(T, 0, 0), (T, 0, 1), (T, 0, 2)]


def test_batches_handed_over_during_the_linger_share_the_transaction() -> None:
    h = Harness()
    h.ownership.grant([(T, 0), (T, 1)])
    # A linger far longer than the test: only the second batch (every sender has one
    # waiting) can end it, so the first cannot have gone alone.
    h.loop.linger, h.loop.senders = 600.0, lambda: 2
    try:
        h.loop.start()
        b0 = h.batch(0, 0, 3)
        h.loop.submit(b0)
        # Without the linger the loop begins b0's transaction at once (well within this
        # wait); with it nothing begins until the other sender's batch comes.
        deadline = time.monotonic() + 0.5
        while "begin" not in h.log and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "begin" not in h.log
        b1 = h.batch(1, 0, 2)
        h.loop.submit(b1)
        assert h.outcome(b0) is None and h.outcome(b1) is None
        assert h.log.count("begin") == 1 and h.log.count("commit") == 1
        assert h.producer.committed == [(T, 0, 0), (T, 0, 1), (T, 0, 2), (T, 1, 0),
                                        (T, 1, 1)]
    finally:
        h.loop.close()


def test_a_batch_whose_partners_never_come_goes_when_the_linger_ends() -> None:
    h = Harness()
    h.ownership.grant([(T, 0), (T, 1)])
    h.loop.linger, h.loop.senders = 0.05, lambda: 2
    try:
        h.loop.start()
        b0 = h.batch(0, 0, 3)
        h.loop.submit(b0)
        assert h.outcome(b0) is None
        assert h.producer.committed == [(T, 0, 0), (T, 0, 1), (T, 0, 2)]
    finally:
        h.loop.close()


def test_closing_ends_the_linger() -> None:
    h = Harness()
    h.ownership.grant([(T, 0), (T, 1)])
    h.loop.linger, h.loop.senders = 600.0, lambda: 2
    h.loop.start()
    b0 = h.batch(0, 0, 3)
    h.loop.submit(b0)
    h.loop.close()      # returns long before the linger would end
    assert b0.done.is_set()
