"""Stateful property tests of ingress delivery under failure (Hypothesis
``RuleBasedStateMachine``), shared by the short CI run (``test_ingress_stateful.py``) and
the long one (``bench/ingress_stateful.py``).

``AtLeastOnceMachine``: sources replaying into one destination partition (fan-in) through
the process's shared idempotent producer (``SharedAcks`` over the real Kafka seam and a
fake client): records fail once at random or are refused for good (until the limit is
raised), the broker answers late or not at all, sinks are released at their revoke
deadline (the whole producer purged and replaced), sessions restart from their
checkpoints and, after a refusal, replay the refused record alone as the worker does.
After every step: no checkpoint of a source covers a record of it that was not delivered;
a source's checkpoints only move forward; nothing of a released sink, nor of a sink whose
record was refused, reaches the partition after its release or its close, and nothing
after a record replayed alone is produced before that record is acknowledged. At the end,
with the broker healthy, every source settles and checkpoints all it produced.

``ExactlyOnceMachine``: workers of three sources (two into one destination partition, a
topic whose limit cuts batches into chunks) hand batches to the shared transaction loop,
which the machine runs one transaction a step through its real queueing (``_take``: the
batches set apart after a fan-in refusal, records that go alone, the throttle's tokens);
grants, revokes (also in the middle of a transaction), stops without a revoke (a zombie
batch left waiting), retriable commit failures, fencing, generation refusals, a record
refused by the destination or by the client, and the checkpoint topic refusing come at any
step. After every step: each source's committed records are exactly its committed
checkpoint's prefix, each once, each batch's records consecutive in its partition; every
committed checkpoint was in the log before the generation check; no round of a
transaction queued two chunks of one partition; a batch that goes alone was alone; a
transaction the checkpoint topic refused ended all its batches. At the end every batch
handed over has ended.

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
from ingress.limits import DestinationLimits
from ingress.metrics import IngressMetrics
from ingress.ownership import Ownership
from ingress.rows import Rows
from ingress.throttle import ProduceThrottle
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
    def __init__(self, shared: SharedAcks, src: int, gen: int) -> None:
        self.gen = gen
        self.sink = SharedAckSink(shared, topic=DEST, partition=0, checkpoint_topic=CPS)
        self.sink.start()
        self.delivery = AtLeastOnce(self.sink, f"src-{src}", f"src-{src}",
                                    on_checkpointed=lambda c: None, on_aborted=lambda: None)


def alo_rows(src: int, gen: int, lo: int, n: int) -> Rows:
    """Records of ``src`` from ``lo``; the value names the session (``gen``) too."""
    offs = list(range(lo, lo + n))
    return Rows(offs, [1] * n, [b"%d" % src] * n, [b"%d:%d:%d" % (src, o, gen) for o in offs],
                [None] * n)


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
        self.refused_for_good: set[tuple[int, int]] = set()
        """Records the destination refuses until the limit is raised (``raise_limit``)."""
        self.refused_at: list[int | None] = [None] * self.SOURCES
        """A source's record refused before: its sessions replay it alone."""
        self.ended: dict[int, int] = {}
        """Sessions released or closed after a refusal, with how many of their records the
        partition held then: it never holds more."""
        self.shared = SharedAcks(KafkaSettings(brokers="fake:1"), timeout=0.05,
                                 make_producer=self._make)
        self.shared.start()
        self.gens = 0
        self.sessions = [self._session(i) for i in range(self.SOURCES)]
        self.pos = [0] * self.SOURCES

    def _make(self) -> Producer:
        p, c = seam_over_fake(auto=False, name="ingress producer", track_acks=True)
        c.fail = self._fail  # type: ignore[assignment]
        self.clients.append(c)
        return p

    def _session(self, src: int) -> _Session:
        self.gens += 1
        return _Session(self.shared, src, self.gens)

    def _fail(self, q: Queued) -> object:
        if q.topic != DEST or q.value is None:
            return None
        src, off, _gen = (int(x) for x in q.value.split(b":"))
        if (src, off) in self.refused_for_good:
            return too_large()
        if (src, off) in self.fail_once and (src, off) not in self.failed:
            self.failed.add((src, off))
            return too_large()
        return None

    def _logged(self) -> list[tuple[int, int, int]]:
        out = []
        for c in self.clients:
            for q in c.log:
                if q.topic == DEST and q.value is not None:
                    src, off, gen = (int(x) for x in q.value.split(b":"))
                    out.append((src, off, gen))
        return out

    def _queued(self) -> list[tuple[int, int, int]]:
        out = []
        for c in self.clients:
            with c.lock:
                for q in c.queued:
                    if q.topic == DEST and q.value is not None:
                        src, off, gen = (int(x) for x in q.value.split(b":"))
                        out.append((src, off, gen))
        return out

    @property
    def client(self) -> FakeClient:
        return self.clients[-1]

    def _delivered(self) -> set[tuple[int, int]]:
        return {(src, off) for src, off, _ in self._logged()}

    def _checkpoints(self, src: int) -> list[int]:
        key = b"src-%d" % src
        return [Checkpoint.decode(q.value).offset for c in self.clients for q in c.log
                if q.topic == CPS and q.key == key and q.value is not None]

    def _restart(self, src: int, refused: bool = False) -> None:
        STATS["restarts"] += 1
        old = self.sessions[src]
        old.sink.close()
        if refused:
            # Closed after a refusal: what it produced has ended, nothing more arrives.
            self.ended[old.gen] = sum(1 for _, _, g in self._logged() if g == old.gen)
        self.sessions[src] = self._session(src)
        cps = self._checkpoints(src)
        self.pos[src] = cps[-1] + 1 if cps else 0

    @rule(src=st.integers(0, SOURCES - 1), n=st.integers(1, 6),
          fails=st.sets(st.integers(0, 5), max_size=2),
          refuse=st.sampled_from([None, None, None, 0, 2, 5]))
    def deliver(self, src: int, n: int, fails: set[int], refuse: int | None) -> None:
        """One batch of the source, as its worker hands it over: a record refused before
        (``refused_at``) alone, once everything before it is acknowledged."""
        STATS["steps"] += 1
        lo = self.pos[src]
        for f in fails:
            if f < n:
                self.fail_once.add((src, lo + f))
                STATS["faults"] += 1
        if refuse is not None and refuse < n:
            self.refused_for_good.add((src, lo + refuse))      # refused for good
            STATS["faults"] += 1
        s = self.sessions[src]
        at = self.refused_at[src]
        parts = self._parts(lo, n, at)
        try:
            for a, b, alone in parts:
                s.delivery.deliver(alo_rows(src, s.gen, a, b), cp(a + b - 1), alone=alone)
                self.pos[src] = a + b
                if alone:
                    self.refused_at[src] = None      # it passed
        except RecordRefused as e:
            if at is not None and self.refused_at[src] == at and e.offset == at:
                after = [o for x, o, g in self._logged() + self._queued()
                         if x == src and g == s.gen and o > at]
                assert not after, f"source {src}: records after the refused {at}: {after}"
            if e.offset is not None:
                self.refused_at[src] = e.offset
            self._restart(src, refused=True)
        except ReplicatorError:
            self._restart(src)

    @staticmethod
    def _parts(lo: int, n: int, at: int | None) -> list[tuple[int, int, bool]]:
        """``lo``..``lo + n - 1`` as the worker hands them over: ``at`` alone."""
        if at is None or not lo <= at < lo + n:
            return [(lo, n, False)]
        return [(a, b, alone) for a, b, alone in
                ((lo, at - lo, False), (at, 1, True), (at + 1, lo + n - at - 1, False))
                if b > 0]

    @rule(src=st.integers(0, SOURCES - 1))
    def raise_limit(self, src: int) -> None:
        """The destination takes the source's refused records now."""
        STATS["steps"] += 1
        self.refused_for_good = {r for r in self.refused_for_good if r[0] != src}

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
        s = self.sessions[src]
        self.shared.release(s.sink)
        self.ended[s.gen] = sum(1 for _, _, g in self._logged() if g == s.gen)
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

    @invariant()
    def nothing_of_an_ended_session_arrives_afterwards(self) -> None:
        held = Counter(g for _, _, g in self._logged())
        for gen, n in self.ended.items():
            assert held[gen] == n, f"session {gen}: {held[gen] - n} record(s) arrived after " \
                                   "its release or its close after a refusal"

    def teardown(self) -> None:
        try:
            self.fail_once.clear()
            self.refused_for_good.clear()
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
    commit; faults come from the machine; each flush ends a round of produce calls."""

    def __init__(self, m: ExactlyOnceMachine) -> None:
        self.m = m
        self.records: list[tuple[int, int, int]] = []
        self.cps: list[tuple[int, int]] = []
        self.undelivered = 0
        self.parts: set[int] = set()
        self.round: Counter[int] = Counter()

    def init_transactions(self, timeout: float) -> None:
        self.m.inits += 1

    def begin_transaction(self) -> None:
        self.records, self.cps, self.undelivered = [], [], 0
        self.parts = set()
        self.round = Counter()

    def produce_many(self, topic: str, partition: int, timestamps: Any, keys: Any,
                     values: Any, headers: Any, ids: Any, **kw: Any) -> None:
        if self.m.fault == "client" and int(keys[0]) == self.m.client_refuses:
            # The client refuses a record above its own message.max.bytes when enqueued.
            self.m.fault = None
            self.m.refused = partition
            raise RecordRefused("injected: larger than message.max.bytes", enqueued=0,
                                reason="Broker: Message size too large")
        self.records += [(partition, int(k), o) for k, o in zip(keys, ids, strict=True)]
        self.parts.add(partition)
        self.round[partition] += 1

    def flush(self, timeout: float) -> int:
        self.m.rounds.append(self.round)
        self.round = Counter()
        self.undelivered = 0
        return 0

    def check_deliveries(self, where: str) -> None:
        pass

    def take_failures(self) -> list[Any]:
        """The destination refuses the records of one partition for good (``refused``),
        or the checkpoint topic its records (``refused_cps``, once they were produced)."""
        if self.m.fault == "refused_cps" and self.cps:
            self.m.fault = None
            self.m.cps_refused = True
            return [DeliveryReport(CPS, 0, -1, RecordRefused(
                "injected: refused", reason="Broker: Topic authorization failed"))]
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
        if self.m.fault == "revoke" and self.parts:
            # The revoke callback runs between the generation check and the commit.
            self.m.fault = None
            self.m.revoke_partition(min(self.parts))

    def commit_transaction(self, timeout: float) -> None:
        fault, self.m.fault = self.m.fault, None
        if fault == "retriable":
            raise KafkaRetriableError("injected: commit failed")
        if fault == "fenced":
            raise ProducerFenced("injected: fenced")
        self.m.committed += [(k, o) for _, k, o in self.records]
        self.m.transactions.append(self.records)
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
    LIMIT = 250
    """The destination topic's max.message.bytes: a chunk holds a few records."""

    def __init__(self) -> None:
        super().__init__()
        self.ownership = Ownership()
        self.fault: str | None = None
        self.refused: int | None = None
        """The destination partition whose records the last transaction had refused."""
        self.client_refuses: int | None = None
        self.cps_refused = False
        self.committed: list[tuple[int, int]] = []
        self.committed_cps: list[tuple[int, int]] = []
        self.transactions: list[list[tuple[int, int, int]]] = []
        self.rounds: list[Counter[int]] = []
        self.undelivered_at_check: list[int] = []
        self.inits = 0
        self.handed: list[Batch] = []
        limits = DestinationLimits()
        limits.update(DEST, self.LIMIT)
        self.now = 0.0
        self.loop = TransactionLoop(
            KafkaSettings(brokers="unused:1"), transactional_id="m", checkpoint_topic=CPS,
            ownership=self.ownership, group=lambda: IN_GENERATION,
            metrics=IngressMetrics.create(Metrics()), timeout=1,
            make_producer=lambda: cast(Producer, _TxnProducer(self)), limits=limits)
        self.loop.throttle = ProduceThrottle(40, clock=lambda: self.now)
        self.loop._stopping.set()    # a recreated producer does not wait its backoff here
        self.owned: set[int] = set()
        self.workers: dict[int, _Worker] = {}

    def _tp(self, src: int) -> tuple[str, int]:
        return (DEST, self.PARTITION_OF[src])

    def _checkpoint(self, src: int) -> int:
        mine = [o for s, o in self.committed_cps if s == src]
        return mine[-1] if mine else -1

    def revoke_partition(self, p: int) -> None:
        self.ownership.revoke([(DEST, p)], 0.0)
        self.owned.discard(p)
        for src, w in self.workers.items():
            if self.PARTITION_OF[src] == p:
                w.alive = False

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
        self.revoke_partition(data.draw(st.sampled_from(sorted(self.owned))))

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
    @rule(data=st.data(), n=st.integers(1, 5), alone=st.booleans())
    def submit(self, data: st.DataObject, n: int, alone: bool) -> None:
        """A worker hands its next batch to the loop (``alone``: one record it isolated,
        as a record its destination may refuse)."""
        STATS["steps"] += 1
        src = data.draw(st.sampled_from(self._idle()))
        w = self.workers[src]
        n = 1 if alone else n
        b = Batch(DEST, self.PARTITION_OF[src], w.epoch, source_rows(src, w.pos, n),
                  f"src-{src}", cp(w.pos + n - 1), alone=alone)
        w.sent = b
        self.handed.append(b)
        self.loop.submit(b)

    @precondition(lambda self: bool(self._alive()))
    @rule(data=st.data())
    def replace_worker(self, data: st.DataObject) -> None:
        """The controller stops a worker and starts another for the same source (a
        partition count changed, a source toggled) while its batch may still wait."""
        self.stop_worker(data)
        self.start_worker(data)

    @rule(seconds=st.sampled_from([0.5, 2.0]))
    def tick(self, seconds: float) -> None:
        """Time passes: the throttle's tokens come back."""
        self.now += seconds

    @precondition(lambda self: bool(self.loop._pending))
    @rule(fault=st.sampled_from([None, None, "retriable", "fenced", "generation",
                                 "refused", "revoke", "client", "refused_cps"]))
    def transact(self, fault: str | None) -> None:
        """One transaction of the loop, of the batches its queue gives (``_take``); ``fault``
        is what its generation check or commit meets, a revoke between the two, a
        destination refusing one partition's records for good (``refused``) or the client
        refusing one (``client``): only that partition's batches fail, the others wait
        for the next transaction; the checkpoint topic refusing (``refused_cps``): every
        batch of it fails."""
        STATS["steps"] += 1
        if fault is not None:
            STATS["faults"] += 1
        self.fault = fault
        self.refused = None
        self.cps_refused = False
        with self.loop._cond:
            take = self.loop._take()
        first = take[0].rows
        self.client_refuses = None if first is None else int(first.keys[0] or b"-1")
        if any(b.alone for b in take):
            assert len(take) == 1, "a batch that goes alone shared its transaction"
        self.loop._transact(take)
        self.fault = None
        if self.refused is not None:
            for b in take:
                if b.partition != self.refused:
                    assert b.error is None or isinstance(b.error, PartitionRevoked), \
                        f"partition {b.partition} failed by another's refusal: {b.error!r}"
        if self.cps_refused:
            assert all(b.done.is_set() and b.error is not None for b in take), \
                "a transaction the checkpoint topic refused left batches waiting"
            self.loop._paused_until = 0.0
        self._collect(take)

    def _collect(self, take: list[Batch]) -> None:
        """Each worker whose batch ended: its position moves, or its session restarts."""
        for src, w in self.workers.items():
            b = w.sent
            if b is None or b not in take or not b.done.is_set():
                continue
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
    def each_batch_consecutive_in_its_partition(self) -> None:
        for records in self.transactions[-1:]:
            for p in (0, 1):
                srcs = [k for q, k, _ in records if q == p]
                runs = sum(1 for i, k in enumerate(srcs) if i == 0 or srcs[i - 1] != k)
                assert runs <= len(set(srcs)), \
                    f"partition {p}: sources' records interleave in a transaction: {srcs}"

    @invariant()
    def one_chunk_of_a_partition_per_round(self) -> None:
        assert all(n <= 1 for r in self.rounds[-8:] for n in r.values()), self.rounds[-8:]

    @invariant()
    def checkpoints_in_the_log_before_the_generation_check(self) -> None:
        assert all(n == 0 for n in self.undelivered_at_check), self.undelivered_at_check

    def teardown(self) -> None:
        """With no more faults every batch handed over ends (committed, or failed: its
        partition revoked, its worker stopped)."""
        self.now += 1000.0
        for _ in range(3 * len(self.handed) + 3):
            if not self.loop._pending:
                break
            self.now += 1000.0
            with self.loop._cond:
                take = self.loop._take()
            self.loop._transact(take)
        left = [b for b in self.handed if not b.done.is_set()]
        assert not left, f"{len(left)} batch(es) never ended"
