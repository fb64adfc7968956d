"""Replay workers over the process's shared transaction loop park while their batch waits
for its transaction: they hold no pool thread and, once their segment is read, no replay
slot, so one transaction carries the batches of many partitions; decoded bytes are bounded
by ``max_bytes_in_flight`` instead (ingress/README.md, "Threads"). A fake producer stands
for Kafka (the broker's behaviour is in tests/integration/test_kafka_*.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, cast

import pytest

from formats.records import records_to_batch
from ingress.checkpoints import MemoryCheckpointStore
from ingress.delivery import delivery_for
from ingress.metrics import IngressMetrics
from ingress.ownership import Ownership
from ingress.permits import ByteBudget, FifoPermits
from ingress.scheduler import Scheduler
from ingress.transactions import TransactionLoop
from ingress.txn_sink import SharedTxnSink
from ingress.worker import ReplayWorker
from ingress.worker_config import WorkerConfig
from replicator.core.errors import KafkaRetriableError, StorageError
from replicator.core.kafka import GroupMetadata, Producer, TopicPartition
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSourceSettings, KafkaSettings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Checkpoint
from tests.unit.test_ingress_worker import rec, topic_json, write

DEST = "copy"
IN_GENERATION = GroupMetadata(b"CGMDv2:\x07\x00\x00\x00grp\x00member-1\x00\x01")


class TxnProducer:
    """A transactional producer whose commits write checkpoints where workers load them;
    ``gate`` holds every commit until set, ``fail_next`` makes the next commit fail.
    """

    def __init__(self, checkpoints: MemoryCheckpointStore,
                 transactions: list[set[int]], committed: dict[int, list[int]]) -> None:
        self.checkpoints = checkpoints
        self.transactions = transactions
        self.committed = committed
        self.open: list[tuple[int, int]] = []
        self.open_cps: list[tuple[str, bytes]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = 0

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        self.open, self.open_cps = [], []

    def produce_many(self, topic: str, partition: int, timestamps: Sequence[int],
                     keys: Sequence[bytes | None], values: Sequence[bytes | None],
                     headers: Sequence[Any], ids: Sequence[int]) -> None:
        self.open += [(partition, o) for o in ids]

    def flush(self, timeout: float) -> int:
        return 0

    def check_deliveries(self, where: str) -> None:
        pass

    def take_failures(self) -> list[Any]:
        return []

    def produce(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        assert key is not None
        self.open_cps.append((key.decode(), value))

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group: GroupMetadata,
                                    timeout: float) -> None:
        pass

    def commit_transaction(self, timeout: float) -> None:
        assert self.gate.wait(30)
        if self.fail_next:
            self.fail_next -= 1
            raise KafkaRetriableError("commit failed (test)")
        self.transactions.append({p for p, _ in self.open})
        for p, o in self.open:
            self.committed.setdefault(p, []).append(o)
        for k, v in self.open_cps:
            self.checkpoints.append(k, v)
        self.open, self.open_cps = [], []

    def abort_transaction(self, timeout: float) -> None:
        self.open, self.open_cps = [], []


class Process:
    """``n`` partitions of one source, each with ``segments`` segments of ``per_segment``
    records, replayed by workers over one transaction loop, ``slots`` replay slots and
    ``threads`` pool threads.
    """

    def __init__(self, n: int, *, slots: int, threads: int, segments: int = 1,
                 per_segment: int = 10, batch_size: int = 100, batch_bytes: int = 10**9,
                 budget: int | None = None) -> None:
        self.n = n
        self.store = MemoryObjectStore("dest")
        topic_json(self.store, None)     # an egress that records no first positions
        self.checkpoints = MemoryCheckpointStore()
        self.transactions: list[set[int]] = []
        self.committed: dict[int, list[int]] = {}
        self.producer = TxnProducer(self.checkpoints, self.transactions, self.committed)
        self.metrics = Metrics()
        self.m = IngressMetrics.create(self.metrics)
        self.ownership = Ownership()
        self.ownership.grant((DEST, p) for p in range(n))
        self.loop = TransactionLoop(KafkaSettings(brokers="unused:1"), transactional_id="g.a",
                                    checkpoint_topic="cps", ownership=self.ownership,
                                    group=lambda: IN_GENERATION, metrics=self.m, timeout=5,
                                    make_producer=lambda: cast("Producer", self.producer))
        self.permits = FifoPermits(slots)
        self.budget = ByteBudget(budget) if budget is not None else None
        self.pool = Scheduler(threads, name="test-replay")
        self.records = segments * per_segment
        src = IngressSourceSettings(region="us-east-1", topic="t", first_segment_delay="0s")
        self.workers: list[ReplayWorker] = []
        for p in range(n):
            ref = PartitionRef("data", "us-east-1", "t", p)
            for i in range(segments):
                lo = i * per_segment
                write(self.store, SegmentKey("data", "us-east-1", "t", p, 0, lo,
                                             lo + per_segment - 1))
            cfg = WorkerConfig(source=src, ref=ref, destination_topic=DEST,
                               delivery=delivery_for("exactly-once"), batch_size=batch_size,
                               batch_bytes=batch_bytes, rescan_interval=timedelta(seconds=30))
            epoch = self.ownership.epoch((DEST, p)) or 0
            self.workers.append(ReplayWorker(
                cfg, store=self.store, checkpoints=self.checkpoints,
                make_sink=lambda p=p, epoch=epoch: SharedTxnSink(  # type: ignore[misc]
                    self.loop, topic=DEST, partition=p, epoch=epoch),
                metrics=self.m, scheduler=self.pool, permits=self.permits,
                budget=self.budget))

    def start(self) -> None:
        self.loop.start()
        self.pool.start()
        for w in self.workers:
            w.start()

    def wait(self, cond: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out; committed {self.committed}"
            time.sleep(0.01)

    def all_committed(self) -> bool:
        return all(len(self.committed.get(p, [])) >= self.records for p in range(self.n))

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(10)
        self.producer.gate.set()
        self.loop.close()
        self.pool.close()


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    made: list[Process] = []
    yield made
    for p in made:
        p.close()


def test_batches_of_many_partitions_share_one_transaction_with_fewer_slots(
        procs: list[Process]) -> None:
    # 2 slots, 3 pool threads, 12 partitions: while the first transaction is held, every
    # other partition reads its segment and hands its batch over; they do not wait for a
    # slot held by a batch that waits for a transaction.
    proc = Process(12, slots=2, threads=3)
    procs.append(proc)
    proc.producer.gate.clear()
    proc.start()
    proc.wait(lambda: all_parked(proc))
    assert proc.pool.running == 0     # every worker parked: no pool thread held
    assert proc.permits.waiting == 0  # nor a slot: every segment was read
    proc.producer.gate.set()
    proc.wait(proc.all_committed)
    # The first transaction (held) and one with every batch handed over meanwhile.
    assert len(proc.transactions) == 2
    assert max(len(t) for t in proc.transactions) >= 6
    for p in range(12):
        assert proc.committed[p] == list(range(10)), p      # once each, in order


def test_a_failed_transaction_wakes_every_parked_worker_and_nothing_is_lost(
        procs: list[Process]) -> None:
    # One batch per segment: a worker gives its slot back once its segment is read (one
    # still being read keeps it: its reader is open).
    proc = Process(10, slots=2, threads=3, segments=3, per_segment=4, batch_size=4)
    procs.append(proc)
    proc.producer.gate.clear()
    proc.producer.fail_next = 2
    proc.start()
    proc.wait(lambda: all_parked(proc))
    proc.producer.gate.set()
    proc.wait(proc.all_committed)
    # Each batch of the failed transactions raised in its worker's session, which
    # restarted from its checkpoint.
    failed = [w for w in proc.workers if w.failed is not None]
    assert len(failed) == 10
    assert all(isinstance(w.failed, KafkaRetriableError) for w in failed)
    for p in range(10):
        assert proc.committed[p] == list(range(12)), p


def test_decoded_bytes_stay_within_max_bytes_in_flight(procs: list[Process]) -> None:
    one = int(record_size() * 4)         # a batch of 4 records
    limit = 5 * one
    proc = Process(10, slots=4, threads=5, segments=2, per_segment=8, batch_size=4,
                   batch_bytes=one, budget=limit)
    procs.append(proc)
    proc.producer.gate.clear()
    proc.start()
    budget = proc.budget
    assert budget is not None
    # Commits held: the partitions fill the budget and then wait for bytes, not beyond.
    proc.wait(lambda: budget.waiting > 0 and proc.pool.running == 0)
    assert budget.in_use <= limit
    proc.producer.gate.set()
    proc.wait(proc.all_committed)
    assert budget.peak <= limit
    assert budget.peak >= 2 * one        # the bound is what limited it, not the slots
    proc.wait(lambda: budget.in_use == 0)
    for p in range(10):
        assert proc.committed[p] == list(range(16)), p


def all_parked(proc: Process) -> bool:
    """Every worker's batch waits for a transaction and no step runs."""
    return proc.pool.running == 0 and all(
        w.replay.run is not None and w.replay.run.sent is not None for w in proc.workers)


def record_size() -> int:
    """Record bytes (key + value + headers) of one ``rec`` record."""
    from ingress.rows import record_bytes
    return int(record_bytes(records_to_batch([rec(0)])).sum())



def test_a_segment_ending_in_holes_checkpoints_its_end_through_the_loop(
        procs: list[Process]) -> None:
    proc = Process(1, slots=1, threads=2, segments=0)
    procs.append(proc)
    write(proc.store, SegmentKey("data", "us-east-1", "t", 0, 0, 0, 19), range(15))
    write(proc.store, SegmentKey("data", "us-east-1", "t", 0, 0, 20, 29))
    proc.start()
    w = proc.workers[0]
    proc.wait(lambda: w.checkpointed == 29)
    assert proc.committed[0] == [*range(15), *range(20, 30)]
    cps = [Checkpoint.decode(v).offset for v in proc.checkpoints.values["us-east-1:t:0:copy"]
           if v is not None]
    assert cps == [14, 19, 29]      # 19: positions 15-19 are holes, checkpointed alone


def test_a_stopped_worker_waits_for_its_batch_in_a_transaction_before_it_ends(
        procs: list[Process]) -> None:
    # The revoke callback stops the worker and then waits for it: it must not end while
    # the transaction with its batch may still commit.
    proc = Process(1, slots=1, threads=2)
    procs.append(proc)
    proc.producer.gate.clear()          # the transaction with the batch is held in commit
    proc.start()
    w = proc.workers[0]
    proc.wait(lambda: all_parked(proc))
    w.stop()
    assert not w.join(0.5)              # still waiting: its batch may commit
    proc.producer.gate.set()
    assert w.join(5)
    assert proc.committed[0] == list(range(10))
    assert w.checkpointed == 9


def test_a_session_failing_with_its_batch_in_a_transaction_restarts_after_its_end(
        procs: list[Process], monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading ahead fails (a storage error) while the first batch is in a held
    # transaction: the next session must not load the checkpoint before that transaction
    # ended, or it would replay the batch again beside it.
    import ingress.segment_replay as replay_module
    from ingress.rows import batch_rows as real

    calls = {"n": 0}

    def flaky(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise StorageError("read failed (test)")
        return real(*a, **k)

    monkeypatch.setattr(replay_module, "batch_rows", flaky)
    proc = Process(1, slots=1, threads=2, per_segment=10, batch_size=5)
    procs.append(proc)
    proc.producer.gate.clear()
    proc.start()
    w = proc.workers[0]
    proc.wait(lambda: isinstance(w.failed, StorageError))
    time.sleep(1.0)                      # past the restart backoff: still waiting
    assert calls["n"] == 2
    proc.producer.gate.set()
    proc.wait(lambda: w.checkpointed == 9)
    assert proc.committed[0] == list(range(10))      # each record once
