"""Stateful property tests of ingress delivery under failure (Hypothesis
``RuleBasedStateMachine``), shared by the short CI run (``test_ingress_stateful.py``) and
the long one (``bench/ingress_stateful.py``).

``AtLeastOnceMachine``: sources replaying into one destination partition (fan-in) through
the process's shared idempotent producer (``SharedAcks`` over the real Kafka seam and a
fake client): records fail once at random, the broker answers late or not at all, sinks
are released at their revoke deadline (the whole producer purged and replaced), sessions
restart from their checkpoints. After every step: no checkpoint of a source covers a
record of it that was not delivered; a source's checkpoints only move forward. At the end,
with the broker healthy, every source settles and checkpoints all it produced.

``ExactlyOnceMachine``: workers of three sources (two into one destination partition)
hand batches to the shared transaction loop (``TransactionLoop._transact``, run by the
machine so a step is one transaction); grants, revokes, stops without a revoke (a zombie
batch left waiting), retriable commit failures, fencing and generation refusals come at
any step. After every step: each source's committed records are exactly its committed
checkpoint's prefix, each once; every committed checkpoint was in the log before the
generation check.

``STATS`` counts steps, faults injected and violations (an invariant that fails raises).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ingress import delivery
from ingress.acks import SharedAcks, SharedAckSink
from ingress.delivery import AtLeastOnce
from ingress.metrics import IngressMetrics
from ingress.ownership import Ownership
from ingress.rows import Rows
from ingress.transactions import Batch, PartitionRevoked, TransactionLoop
from replicator.core.errors import (
    GenerationFenced,
    KafkaRetriableError,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
)
from replicator.core.kafka import DeliveryReport, GroupMetadata, Producer, TopicPartition
from replicator.core.metrics import Metrics
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint
from tests.unit.ingress_fakes import FakeClient, Queued, seam_over_fake, too_large

STATS: Counter[str] = Counter()
"""Steps run and faults injected, over every machine run in this process."""

DEST = "copy"
CPS = "cps"
IN_GENERATION = GroupMetadata(b"CGMDv2:\x07\x00\x00\x00grp\x00member-1\x00\x01")


def cp(offset: int) -> Checkpoint:
    return Checkpoint(offset, "seg", datetime.now(UTC))


def source_rows(src: int, lo: int, n: int) -> Rows:
    offs = list(range(lo, lo + n))
    return Rows(offs, [1] * n, [b"%d" % src] * n, [b"%d:%d" % (src, o) for o in offs],
                [None] * n)


# --- at-least-once ----------------------------------------------------------------------


class _Session:
    def __init__(self, shared: SharedAcks, src: int) -> None:
        self.sink = SharedAckSink(shared, topic=DEST, partition=0, checkpoint_topic=CPS)
        self.sink.start()
        self.delivery = AtLeastOnce(self.sink, f"src-{src}", f"src-{src}",
                                    on_checkpointed=lambda c: None, on_aborted=lambda: None)


class AtLeastOnceMachine(RuleBasedStateMachine):
    """Fan-in over the shared idempotent producer (see the module)."""

    SOURCES = 2

    def __init__(self) -> None:
        super().__init__()
        self._ack_timeout = delivery.ACK_TIMEOUT
        delivery.ACK_TIMEOUT = 0.05      # a source left unanswered gives up in 50 ms
        self.clients: list[FakeClient] = []
        self.fail_once: set[tuple[int, int]] = set()
        self.failed: set[tuple[int, int]] = set()
        self.shared = SharedAcks(KafkaSettings(brokers="fake:1"), timeout=0.05,
                                 make_producer=self._make)
        self.shared.start()
        self.sessions = [_Session(self.shared, i) for i in range(self.SOURCES)]
        self.pos = [0] * self.SOURCES

    def _make(self) -> Producer:
        p, c = seam_over_fake(auto=False, name="ingress producer", track_acks=True)
        c.fail = self._fail  # type: ignore[assignment]
        self.clients.append(c)
        return p

    def _fail(self, q: Queued) -> object:
        if q.topic != DEST or q.value is None:
            return None
        src, off = (int(x) for x in q.value.split(b":"))
        if (src, off) in self.fail_once and (src, off) not in self.failed:
            self.failed.add((src, off))
            return too_large()
        return None

    @property
    def client(self) -> FakeClient:
        return self.clients[-1]

    def _delivered(self) -> set[tuple[int, int]]:
        out = set()
        for c in self.clients:
            for q in c.log:
                if q.topic == DEST and q.value is not None:
                    src, off = (int(x) for x in q.value.split(b":"))
                    out.add((src, off))
        return out

    def _checkpoints(self, src: int) -> list[int]:
        key = b"src-%d" % src
        return [Checkpoint.decode(q.value).offset for c in self.clients for q in c.log
                if q.topic == CPS and q.key == key and q.value is not None]

    def _restart(self, src: int) -> None:
        STATS["restarts"] += 1
        self.sessions[src].sink.close()
        self.sessions[src] = _Session(self.shared, src)
        cps = self._checkpoints(src)
        self.pos[src] = cps[-1] + 1 if cps else 0

    @rule(src=st.integers(0, SOURCES - 1), n=st.integers(1, 6),
          fails=st.sets(st.integers(0, 5), max_size=2))
    def deliver(self, src: int, n: int, fails: set[int]) -> None:
        STATS["steps"] += 1
        lo = self.pos[src]
        for f in fails:
            if f < n:
                self.fail_once.add((src, lo + f))
                STATS["faults"] += 1
        try:
            self.sessions[src].delivery.deliver(source_rows(src, lo, n), cp(lo + n - 1))
            self.pos[src] = lo + n
        except ReplicatorError:
            self._restart(src)

    @rule(k=st.integers(0, 12))
    def broker_answers(self, k: int) -> None:
        """The broker answers the first ``k`` queued records (0: it stays silent)."""
        STATS["steps"] += 1
        self.client.answer(k)
        self.client.poll()

    @rule(src=st.integers(0, SOURCES - 1))
    def settle(self, src: int) -> None:
        STATS["steps"] += 1
        self.client.auto = True
        try:
            self.sessions[src].delivery.settle()
        except ReplicatorError:
            self._restart(src)
        finally:
            for c in self.clients:
                c.auto = False

    @rule(src=st.integers(0, SOURCES - 1))
    def revoke_deadline(self, src: int) -> None:
        """The source's worker missed its revoke deadline: released, then replaced."""
        STATS["steps"] += 1
        STATS["faults"] += 1
        self.shared.release(self.sessions[src].sink)
        self._restart(src)

    @invariant()
    def no_checkpoint_past_an_undelivered_record(self) -> None:
        delivered = self._delivered()
        for src in range(self.SOURCES):
            cps = self._checkpoints(src)
            assert cps == sorted(cps), f"source {src}: checkpoints went back: {cps}"
            if cps:
                missing = [o for o in range(cps[-1] + 1) if (src, o) not in delivered]
                assert not missing, (f"source {src}: checkpoint {cps[-1]} covers records "
                                     f"never delivered: {missing}")

    def teardown(self) -> None:
        try:
            self.fail_once.clear()
            for src in range(self.SOURCES):
                for _ in range(5):
                    for c in self.clients:
                        c.auto = True
                    try:
                        self.sessions[src].delivery.settle()
                        break
                    except ReplicatorError:
                        self._restart(src)
                cps = self._checkpoints(src)
                if self.pos[src]:
                    assert cps and cps[-1] == self.pos[src] - 1, \
                        f"source {src}: settled at {cps[-1:]}, produced up to {self.pos[src] - 1}"
            self.no_checkpoint_past_an_undelivered_record()
        finally:
            delivery.ACK_TIMEOUT = self._ack_timeout


# --- exactly-once -----------------------------------------------------------------------


class _TxnProducer:
    """A transactional producer: what a transaction produced becomes visible at its
    commit; faults come from the machine."""

    def __init__(self, m: ExactlyOnceMachine) -> None:
        self.m = m
        self.records: list[tuple[int, int]] = []
        self.cps: list[tuple[int, int]] = []
        self.undelivered = 0

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        self.records, self.cps, self.undelivered = [], [], 0
        self.parts: set[int] = set()

    def produce_many(self, topic: str, partition: int, timestamps: Any, keys: Any,
                     values: Any, headers: Any, ids: Any, **kw: Any) -> None:
        self.records += [(int(k), o) for k, o in zip(keys, ids, strict=True)]
        self.parts.add(partition)

    def flush(self, timeout: float) -> int:
        self.undelivered = 0
        return 0

    def check_deliveries(self, where: str) -> None:
        pass

    def take_failures(self) -> list[Any]:
        """The destination refuses the records of one partition for good (``refused``)."""
        if self.m.fault != "refused" or not self.parts:
            return []
        self.m.fault = None
        self.m.refused = min(self.parts)
        return [DeliveryReport(DEST, self.m.refused, -1, RecordRefused(
            "injected: refused", reason="Broker: Message size too large"))]

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                **kw: Any) -> None:
        assert key is not None and value is not None
        self.cps.append((int(key.split(b"-")[1]), Checkpoint.decode(value).offset))
        self.undelivered += 1

    def send_offsets_to_transaction(self, offsets: list[TopicPartition],
                                    group: GroupMetadata, timeout: float) -> None:
        self.m.undelivered_at_check.append(self.undelivered)
        if self.m.fault == "generation":
            self.m.fault = None
            raise GenerationFenced("injected: an older generation")

    def commit_transaction(self, timeout: float) -> None:
        fault, self.m.fault = self.m.fault, None
        if fault == "retriable":
            raise KafkaRetriableError("injected: commit failed")
        if fault == "fenced":
            raise ProducerFenced("injected: fenced")
        self.m.committed += self.records
        self.m.committed_cps += self.cps
        self.records, self.cps = [], []

    def abort_transaction(self, timeout: float) -> None:
        self.records, self.cps = [], []


class _Worker:
    def __init__(self, epoch: int, pos: int) -> None:
        self.epoch = epoch
        self.pos = pos
        self.alive = True
        self.sent: Batch | None = None


class ExactlyOnceMachine(RuleBasedStateMachine):
    """Workers over the shared transaction loop (see the module)."""

    PARTITION_OF = (0, 0, 1)
    """Source -> destination partition: sources 0 and 1 feed partition 0 (fan-in)."""

    def __init__(self) -> None:
        super().__init__()
        self.ownership = Ownership()
        self.fault: str | None = None
        self.refused: int | None = None
        """The destination partition whose records the last transaction had refused."""
        self.committed: list[tuple[int, int]] = []
        self.committed_cps: list[tuple[int, int]] = []
        self.undelivered_at_check: list[int] = []
        self.loop = TransactionLoop(
            KafkaSettings(brokers="unused:1"), transactional_id="m", checkpoint_topic=CPS,
            ownership=self.ownership, group=lambda: IN_GENERATION,
            metrics=IngressMetrics.create(Metrics()), timeout=1,
            make_producer=lambda: cast(Producer, _TxnProducer(self)))
        self.loop._stopping.set()    # a recreated producer does not wait its backoff here
        self.owned: set[int] = set()
        self.workers: dict[int, _Worker] = {}
        self.pending: list[tuple[int, Batch]] = []

    def _tp(self, src: int) -> tuple[str, int]:
        return (DEST, self.PARTITION_OF[src])

    def _checkpoint(self, src: int) -> int:
        mine = [o for s, o in self.committed_cps if s == src]
        return mine[-1] if mine else -1

    # Rules draw only among what they can act on (``st.data()``), so the search spends its
    # steps on transitions, not on no-ops.

    @precondition(lambda self: len(self.owned) < 2)
    @rule(data=st.data())
    def grant(self, data: st.DataObject) -> None:
        STATS["steps"] += 1
        p = data.draw(st.sampled_from(sorted({0, 1} - self.owned)))
        self.ownership.grant([(DEST, p)])
        self.owned.add(p)

    @precondition(lambda self: bool(self.owned))
    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        STATS["steps"] += 1
        STATS["faults"] += 1
        p = data.draw(st.sampled_from(sorted(self.owned)))
        self.ownership.revoke([(DEST, p)], 0.0)
        self.owned.discard(p)
        for src, w in self.workers.items():
            if self.PARTITION_OF[src] == p:
                w.alive = False

    def _startable(self) -> list[int]:
        return [s for s in range(3) if self.PARTITION_OF[s] in self.owned
                and (s not in self.workers or not self.workers[s].alive)]

    def _alive(self) -> list[int]:
        return [s for s, w in sorted(self.workers.items()) if w.alive]

    @precondition(lambda self: bool(self._startable()))
    @rule(data=st.data())
    def start_worker(self, data: st.DataObject) -> None:
        STATS["steps"] += 1
        src = data.draw(st.sampled_from(self._startable()))
        epoch = self.ownership.epoch(self._tp(src))
        assert epoch is not None
        self.workers[src] = _Worker(epoch, self._checkpoint(src) + 1)

    @precondition(lambda self: bool(self._alive()))
    @rule(data=st.data())
    def stop_worker(self, data: st.DataObject) -> None:
        """Stopped without a revoke (source no longer wanted): its batch, if any, stays
        waiting in the loop."""
        STATS["steps"] += 1
        STATS["faults"] += 1
        w = self.workers[data.draw(st.sampled_from(self._alive()))]
        w.alive = False
        self.ownership.retire(w.epoch, 0.0)

    def _idle(self) -> list[int]:
        return [s for s in self._alive() if self.workers[s].sent is None]

    @precondition(lambda self: bool(self._idle()))
    @rule(data=st.data(), n=st.integers(1, 5))
    def submit(self, data: st.DataObject, n: int) -> None:
        STATS["steps"] += 1
        src = data.draw(st.sampled_from(self._idle()))
        w = self.workers[src]
        b = Batch(DEST, self.PARTITION_OF[src], w.epoch, source_rows(src, w.pos, n),
                  f"src-{src}", cp(w.pos + n - 1))
        w.sent = b
        self.pending.append((src, b))

    @precondition(lambda self: bool(self._alive()))
    @rule(data=st.data())
    def replace_worker(self, data: st.DataObject) -> None:
        """The controller stops a worker and starts another for the same source (a
        partition count changed, a source toggled) while its batch may still wait."""
        self.stop_worker(data)
        self.start_worker(data)

    @precondition(lambda self: bool(self.pending))
    @rule(k=st.integers(1, 4),
          fault=st.sampled_from([None, None, "retriable", "fenced", "generation",
                                 "refused"]))
    def transact(self, k: int, fault: str | None) -> None:
        """One transaction of the loop with the first ``k`` waiting batches; ``fault``
        is what its generation check or commit meets, or a destination refusing one
        partition's records for good (``refused``): only that partition's batches fail,
        the others wait for the next transaction."""
        STATS["steps"] += 1
        if fault is not None:
            STATS["faults"] += 1
        self.fault = fault
        self.refused = None
        take, self.pending = self.pending[:k], self.pending[k:]
        self.loop._transact([b for _, b in take])
        self.fault = None
        if self.refused is not None:
            for _, b in take:
                if b.partition != self.refused:
                    assert b.error is None or isinstance(b.error, PartitionRevoked), \
                        f"partition {b.partition} failed by another's refusal: {b.error!r}"
        requeued = list(self.loop._pending)
        self.loop._pending.clear()
        self.pending = [(s, b) for s, b in take if b in requeued] + self.pending
        for src, b in take:
            if not b.done.is_set():
                continue
            w = self.workers.get(src)
            if w is None or w.sent is not b:
                continue                      # a former worker's batch
            w.sent = None
            if b.error is None:
                w.pos = b.checkpoint.offset + 1
            else:
                w.pos = self._checkpoint(src) + 1   # the session restarts

    @invariant()
    def each_committed_record_once_and_exactly_the_checkpoints_prefix(self) -> None:
        seen = Counter(self.committed)
        twice = [r for r, c in seen.items() if c > 1]
        assert not twice, f"committed twice: {sorted(twice)[:10]}"
        for src in range(3):
            mine = sorted(o for s, o in self.committed if s == src)
            assert mine == list(range(self._checkpoint(src) + 1)), \
                f"source {src}: committed {mine}, checkpoint {self._checkpoint(src)}"

    @invariant()
    def checkpoints_in_the_log_before_the_generation_check(self) -> None:
        assert all(n == 0 for n in self.undelivered_at_check), self.undelivered_at_check
