"""A record the destination refuses stops only its partition, at the record, in both
delivery modes: over the real seams (``SharedAcks`` and the Kafka ``Producer`` over a fake
client whose broker answers late; the shared ``TransactionLoop``), never ``MemorySink``,
whose ``produce`` raises before anything is enqueued and so cannot show what a delivery
report learnt late does (ingress/README.md, "Destination limits").

Each test is one order of events: the refusal learnt from a delivery report while later
batches are queued, at the first or last record of a batch, twice in a row, with the limit
raised while a retry runs, a record above the client's own ``message.max.bytes``, a stop
while throttled or while stopped at the record, the checkpoint topic refusing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

import confluent_kafka as ck
import pytest

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from ingress import delivery
from ingress.acks import SharedAcks, SharedAckSink
from ingress.delivery import PIPELINE_DEPTH
from ingress.limits import DestinationLimits
from ingress.replay_state import ReplayState
from ingress.rows import Rows
from ingress.scheduler import Scheduler
from ingress.throttle import ProduceThrottle
from ingress.worker import ReplayWorker
from replicator.core.errors import RecordRefused
from replicator.core.kafka import Producer
from replicator.core.keys import SegmentKey
from replicator.core.settings import KafkaSettings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Checkpoint
from tests.unit.ingress_fakes import FakeClient, Queued, seam_over_fake, too_large
from tests.unit.test_ingress_worker import Harness, key

BATCH = 7
BIG = 5000
"""Bytes of a record above ``LIMIT``."""
LIMIT = 2000
"""The destination topic's ``max.message.bytes`` in the tests that know it."""


def write_records(store: MemoryObjectStore, k: SegmentKey, big: set[int]) -> None:
    """Records ``k.start``..``k.end``; those at ``big`` carry a ``BIG``-byte value."""
    recs = [Record(o, 1_700_000_000_000 + o, b"%d" % o,
                   b"x" * BIG if o in big else b"v%d" % o, (), 1)
            for o in range(k.start, k.end + 1)]
    up = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    up.write_batch(records_to_batch(recs))
    publish_segment(store, up.finish(SegmentMetadata.for_key(k, len(recs))).key, k)


@dataclass
class Alo:
    """An at-least-once worker over ``SharedAcks`` and the Kafka seam over ``FakeClient``s
    whose broker answers each record ``rtt`` seconds after it was produced and refuses the
    source offsets in ``refused`` (``MSG_SIZE_TOO_LARGE``)."""

    h: Harness
    worker: ReplayWorker
    shared: SharedAcks
    scheduler: Scheduler
    clients: list[FakeClient]
    refused: set[int]
    refuse_times: dict[int, int]
    """Source offsets refused this many more times, then taken."""

    def answer(self, offset: int) -> object:
        """The broker's answer to the record at source ``offset``: ``None`` appends it."""
        if self.refuse_times.get(offset, 0) > 0:
            self.refuse_times[offset] -= 1
            return too_large()
        return too_large() if offset in self.refused else None

    def delivered(self) -> Counter[int]:
        out: Counter[int] = Counter()
        for c in self.clients:
            for q in c.log:
                if q.topic == "copy" and q.key is not None:
                    out[int(q.key)] += 1
        return out

    def wait(self, cond: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out in {self.worker.state}"
            time.sleep(0.005)

    def refusals(self) -> float:
        return self.h.metric("replicator_ingress_records_refused_total")

    def retry_until_refused_again(self) -> None:
        before = self.refusals()
        self.worker.retry_refused()
        self.wait(lambda: self.refusals() > before and self.worker.state is ReplayState.REFUSED)


def alo(last: int = 99, *, refused: set[int], big: set[int] = frozenset(),  # type: ignore[assignment]
        rtt: float = 0.02, limits: DestinationLimits | None = None,
        throttle: ProduceThrottle | None = None,
        client: type[FakeClient] = FakeClient) -> Alo:
    h = Harness(exactly_once=False, batch_size=BATCH)
    h.cfg = replace(h.cfg, limits=limits)
    write_records(h.store, key(0, last), big)
    clients: list[FakeClient] = []
    box: list[Alo] = []

    def fail(q: Queued) -> object:
        if q.topic == "cps":                         # delivered checkpoints feed the store
            assert q.key is not None
            h.checkpoints.append(q.key.decode(), q.value)
            return None
        return None if q.key is None else box[0].answer(int(q.key))

    def make() -> Producer:
        import tests.unit.ingress_fakes as fakes
        real = fakes.FakeClient
        fakes.FakeClient = client  # type: ignore[misc]
        try:
            p, c = seam_over_fake(auto=False, name="ingress producer", track_acks=True)
        finally:
            fakes.FakeClient = real  # type: ignore[misc]
        c.fail = fail  # type: ignore[assignment]

        def lagging_broker() -> None:
            now = time.monotonic()
            with c.lock:
                for q in c.queued:
                    if not hasattr(q, "t"):
                        q.t = now  # type: ignore[attr-defined]
                n = 0
                for q in c.queued:
                    if now - q.t < rtt:  # type: ignore[attr-defined]
                        break
                    n += 1
            c.answer(n)
        c.on_poll = lagging_broker
        clients.append(c)
        return p

    shared = SharedAcks(KafkaSettings(brokers="fake:1"), timeout=2.0, make_producer=make,
                        limits=limits)
    shared.throttle = throttle
    shared.start()
    scheduler = Scheduler(2, name="test-refusals")
    scheduler.start()
    w = ReplayWorker(h.cfg, store=h.store, checkpoints=h.checkpoints,
                     make_sink=lambda: SharedAckSink(shared, topic="copy", partition=3,
                                                     checkpoint_topic="cps"),
                     metrics=h.m, scheduler=scheduler)
    box.append(Alo(h, w, shared, scheduler, clients, set(refused), {}))
    return box[0]


@pytest.fixture(autouse=True)
def _short_ack_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delivery, "ACK_TIMEOUT", 2.0)


@pytest.fixture
def close() -> Iterator[list[Alo]]:
    made: list[Alo] = []
    yield made
    for a in made:
        a.worker.stop()
        a.worker.join(5)
        a.scheduler.close()


def limited() -> DestinationLimits:
    limits = DestinationLimits()
    limits.update("copy", LIMIT)
    return limits


@pytest.mark.parametrize("at", [10, 7, 13], ids=["mid-batch", "first-of-batch",
                                                "last-of-batch"])
def test_at_least_once_no_retry_writes_anything_after_a_refused_record(
        close: list[Alo], at: int) -> None:
    """The refusal is learnt from a delivery report, after later records and the
    pipelined batches were produced (the destination's limit unknown): those reach the
    partition once. Was: every retry (10 s doubling) produced them again, up to ~30,000
    duplicates a retry at default batch sizes. Now a retry produces and checkpoints only
    what precedes the record, then the record alone, waited for: nothing after it, ever,
    until it passes; then the copy completes with the duplicates bounded."""
    a = alo(refused={at})
    close.append(a)
    a.worker.start()
    a.wait(lambda: a.worker.state is ReplayState.REFUSED)
    first = a.delivered()
    after_first = {o: n for o, n in first.items() if o > at}
    for _ in range(3):
        a.retry_until_refused_again()
        got = a.delivered()
        assert {o: n for o, n in got.items() if o > at} == after_first, \
            "a retry wrote records after the refused one"
        assert all(n <= 2 for o, n in got.items() if o < at), got
    cp = Checkpoint.decode(a.h.checkpoints.values[a.worker.key][-1])
    assert cp.offset == at - 1 and cp.refused is not None and cp.refused.offset == at
    a.refused.clear()                           # the limit was raised
    a.worker.retry_refused()
    a.wait(lambda: a.worker.checkpointed == 99)
    got = a.delivered()
    assert set(got) == set(range(100)), sorted(set(range(100)) - set(got))
    duplicates = sum(got.values()) - 100
    assert duplicates <= (PIPELINE_DEPTH + 2) * BATCH, duplicates
    assert a.h.metric("replicator_ingress_partition_refused") == 0


@pytest.mark.parametrize("big", [{10}, {10, 11}, {7}, {13}],
                         ids=["one", "twice-in-a-row", "first-of-batch", "last-of-batch"])
def test_at_least_once_a_record_over_the_known_limit_is_sent_alone_nothing_after_it(
        close: list[Alo], big: set[int]) -> None:
    """The destination's limit is known: a record above it is produced alone, once every
    record before it is acknowledged and checkpointed, and waited for. Its refusal stops
    the partition with nothing after it produced and no duplicate at all, in the first
    attempt as in every retry; raised, the copy ends exact."""
    a = alo(refused=set(big), big=big, limits=limited())
    close.append(a)
    a.worker.start()
    a.wait(lambda: a.worker.state is ReplayState.REFUSED)
    at = min(big)
    a.retry_until_refused_again()
    got = a.delivered()
    assert sorted(got) == list(range(at)) and set(got.values()) == {1}, got
    assert a.worker.checkpointed == at - 1
    a.refused.clear()
    a.worker.retry_refused()
    a.wait(lambda: a.worker.checkpointed == 99)
    got = a.delivered()
    assert sorted(got) == list(range(100)) and set(got.values()) == {1}, got


def test_at_least_once_the_limit_raised_while_a_retry_runs_is_not_lost(
        close: list[Alo]) -> None:
    """The configs change while a retry runs, and that retry is still refused (it sent the
    record under the old limit): the worker tries again at once when it fails, not after
    the refusal backoff (10 s). Was: the change reset a backoff the failure then set again
    (the cause of a flaky test under load)."""
    a = alo(refused=set(), big={10}, limits=limited(), rtt=0.05)
    a.refuse_times[10] = 2                     # the first attempt and the retry below
    close.append(a)
    a.worker.start()
    a.wait(lambda: a.worker.state is ReplayState.REFUSED)
    a.worker.retry_refused()
    a.wait(lambda: a.worker.state is not ReplayState.REFUSED)
    a.worker.retry_refused()                   # the limit raised while the retry runs
    a.wait(lambda: a.worker.checkpointed == 99, timeout=8)   # well before the 10 s backoff
    assert a.refusals() == 2 and a.refuse_times[10] == 0


class LocalSizeClient(FakeClient):
    """The client refuses a record above its own ``message.max.bytes`` when enqueued (what
    confluent-kafka raises: ``KafkaException(MSG_SIZE_TOO_LARGE)``)."""

    def produce(self, topic: str, value: bytes | None = None, *args: Any, **kw: Any) -> None:
        if value is not None and len(value) > LIMIT:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE,
                                                  "Unable to produce message"))
        super().produce(topic, value, *args, **kw)


def test_at_least_once_a_record_over_the_clients_own_limit_stops_only_its_partition(
        close: list[Alo]) -> None:
    """A record above the client's ``message.max.bytes`` is refused when enqueued. Was: a
    ``KafkaFatalError``, the whole call counted although nothing after it was enqueued,
    the sink's close waited 10 s and purged the shared producer under every other
    partition. Now the partition stops at it (``RecordRefused`` naming the client's
    setting); nothing after it, no purge, no duplicate."""
    limits = DestinationLimits(client_max=LIMIT)
    a = alo(refused=set(), big={10}, limits=limits, client=LocalSizeClient)
    close.append(a)
    other = SharedAckSink(a.shared, topic="copy", partition=4, checkpoint_topic="cps")
    other.start()
    a.worker.start()
    a.wait(lambda: a.worker.state is ReplayState.REFUSED)
    assert a.worker.refused is not None and a.worker.refused.offset == 10
    assert "kafka.config" in str(a.worker.refused)
    assert len(a.clients) == 1 and not other.broken
    got = a.delivered()
    assert sorted(got) == list(range(10)) and set(got.values()) == {1}


def test_the_shared_producer_counts_only_what_the_client_enqueued() -> None:
    """``SharedAcks`` directly (the repro's order): a call whose record the client refuses
    raises ``RecordRefused``, leaves nothing counted, and closing the sink purges nothing."""
    made: list[FakeClient] = []

    def make() -> Producer:
        import tests.unit.ingress_fakes as fakes
        real = fakes.FakeClient
        fakes.FakeClient = LocalSizeClient  # type: ignore[misc]
        try:
            p, c = seam_over_fake(auto=False, name="ingress producer", track_acks=True)
        finally:
            fakes.FakeClient = real  # type: ignore[misc]
        made.append(c)
        return p

    shared = SharedAcks(KafkaSettings(brokers="fake:1"), timeout=1.0, make_producer=make,
                        limits=DestinationLimits(client_max=LIMIT))
    shared.start()
    a = SharedAckSink(shared, topic="copy", partition=0, checkpoint_topic="cps")
    b = SharedAckSink(shared, topic="copy", partition=1, checkpoint_topic="cps")
    a.start()
    b.start()
    a.produce(Rows([0, 1], [1] * 2, [b"k"] * 2, [b"v"] * 2, [None] * 2))
    with pytest.raises(RecordRefused) as e:
        b.produce(Rows([5], [1], [b"k"], [b"x" * BIG], [None]))
    assert e.value.offset == 5 and b.unanswered() == 0
    t0 = time.monotonic()
    b.close()
    assert time.monotonic() - t0 < 0.5 and len(made) == 1 and not a.broken


def test_at_least_once_a_stop_is_not_held_up_by_the_throttle(close: list[Alo]) -> None:
    """A produce waiting in the token bucket gives up when its worker stops: the revoke
    does not wait its timeout, and nothing is purged. Was: the wait ran to its end (the
    debt of the calls before it), the revoke then purged the shared producer."""
    a = alo(refused=set(), rtt=0.0, throttle=ProduceThrottle(3))   # 3 B/s: seconds a batch
    close.append(a)
    a.worker.start()
    a.wait(lambda: bool(a.delivered()))
    t0 = time.monotonic()
    a.worker.stop()
    assert a.worker.join(1.5), "the stop waited for the throttle"
    assert time.monotonic() - t0 < 1.5 and len(a.clients) == 1
    assert a.worker.state is ReplayState.STOPPED


def test_a_worker_stopped_at_a_refused_record_stops_at_once_with_nothing_queued(
        close: list[Alo]) -> None:
    """A revoke lands while the partition is stopped at the record (between retries, and
    during one): it ends at once and leaves nothing of it in the shared producer."""
    a = alo(refused={10}, big={10}, limits=limited(), rtt=0.05)
    close.append(a)
    a.worker.start()
    a.wait(lambda: a.worker.state is ReplayState.REFUSED)
    a.worker.retry_refused()
    a.wait(lambda: a.worker.state is not ReplayState.REFUSED)
    a.worker.stop()
    assert a.worker.join(3)
    assert a.shared.producer.outstanding() == 0
    assert max(a.delivered()) < 10


def test_the_refused_state_is_kept_from_the_checkpoint_across_a_restart(
        close: list[Alo]) -> None:
    """A new worker (a restart, another owner) resumes from a checkpoint that records the
    refusal: it replays that record alone first, so even its first attempt writes nothing
    after it (the limit unknown to it)."""
    a = alo(refused={10})
    close.append(a)
    a.worker.start()
    a.wait(lambda: a.worker.state is ReplayState.REFUSED)
    a.retry_until_refused_again()              # the checkpoint now records the refusal
    a.worker.stop()
    assert a.worker.join(5)
    before = a.delivered()
    b = alo(refused={10})
    b.h.checkpoints = a.h.checkpoints
    b.h.store = a.h.store
    close.append(b)
    w = ReplayWorker(b.h.cfg, store=a.h.store, checkpoints=a.h.checkpoints,
                     make_sink=lambda: SharedAckSink(b.shared, topic="copy", partition=3,
                                                     checkpoint_topic="cps"),
                     metrics=b.h.m, scheduler=b.scheduler)
    b.worker = w
    w.start()
    b.wait(lambda: w.state is ReplayState.REFUSED)
    assert not any(o > 10 for o in b.delivered()), b.delivered()
    assert before


def counts_per_round(log: list[str]) -> list[list[str]]:
    rounds, cur = [], []
    for e in log:
        if e.startswith("produce dest["):
            cur.append(e)
        elif e == "flush" and cur:
            rounds.append(cur)
            cur = []
    return rounds


def test_exactly_once_fan_in_chunks_never_share_a_round_nor_interleave() -> None:
    """Two sources' batches for one partition of a topic whose limit cuts them: one chunk
    of that partition per round (never two queued together, which librdkafka could send
    as one request over the limit), each batch's chunks one after the other (was: a3 b3
    a3 b3 a2 b2, and the offset map dropped both batches' entries)."""
    from datetime import UTC, datetime

    from ingress.transactions import Batch
    from tests.unit.test_ingress_shared import Harness as TxnHarness
    from tests.unit.test_ingress_shared import T

    limits = DestinationLimits()
    limits.update(T, 100_000)
    h = TxnHarness(limits=limits)
    h.ownership.grant([(T, 0), (T, 1)])
    e = h.ownership.epoch((T, 0)) or 0

    def batch(key: str, partition: int, n: int, tag: bytes) -> Batch:
        rows = Rows(list(range(n)), [1] * n, [tag] * n, [tag * 30_000] * n, [None] * n)
        return Batch(T, partition, e if partition == 0 else h.ownership.epoch((T, 1)) or 0,
                     rows, key, Checkpoint(n - 1, "seg", datetime.now(UTC)))

    a, b, c = batch("a", 0, 8, b"a"), batch("b", 0, 8, b"b"), batch("c", 1, 8, b"c")
    h.loop.submit(a)
    h.loop.submit(b)
    h.loop.submit(c)
    h.loop.start()
    try:
        assert h.outcome(a) is None and h.outcome(b) is None and h.outcome(c) is None
    finally:
        h.loop.close()
    rounds = counts_per_round(h.log)
    assert all(sum(1 for x in r if x.startswith("produce dest[0]")) <= 1 for r in rounds)
    order = [x.split(":")[0] for r in rounds for x in r]
    assert order.count("produce dest[1]") == 3      # partition 1 goes on beside it
    assert len(rounds) == 6                          # a: 3 chunks, then b: 3 chunks


def made(h: Any, p: Any) -> Producer:
    """``p``, kept as the harness's newest producer."""
    h.producers.append(p)
    return cast(Producer, p)


def test_exactly_once_a_record_the_client_refuses_fails_only_its_partition() -> None:
    """A record above the client's own ``message.max.bytes`` in a shared transaction:
    only its partition's batch fails, with ``RecordRefused`` naming the record and the
    client's setting; the other partition's batch commits; the producer is neither
    dropped nor initialised again. Was: ``KafkaFatalError`` for every batch, the producer
    re-created at each retry, the partition never reported refused."""
    from tests.unit.test_ingress_shared import FakeProducer, T
    from tests.unit.test_ingress_shared import Harness as TxnHarness

    class LocalSizeCheck(FakeProducer):
        def produce_many(self, topic: str, partition: int, timestamps: Any, keys: Any,
                         values: Any, headers: Any, ids: Any, **kw: Any) -> None:
            for i, v in enumerate(values):
                if len(v) > LIMIT:
                    raise RecordRefused(f"produce to {topic}[{partition}]@{ids[i]}: "
                                        "Unable to produce message", enqueued=i,
                                        reason="Broker: Message size too large")
            super().produce_many(topic, partition, timestamps, keys, values, headers, ids,
                                 **kw)

    h = TxnHarness(limits=DestinationLimits(client_max=LIMIT))
    h.loop._make = lambda: made(h, LocalSizeCheck(h.log))
    h.ownership.grant([(T, 0), (T, 1)])
    ok, huge = h.batch(0, 0, 3), h.batch(1, 0, 3, value=b"x" * BIG)
    h.loop.submit(ok)
    h.loop.submit(huge)
    h.loop.start()
    try:
        assert h.outcome(ok) is None
        err = h.outcome(huge)
        assert isinstance(err, RecordRefused) and err.offset == 0
        assert "kafka.config" in str(err)
        assert h.log.count("init") == 1
    finally:
        h.loop.close()


def test_exactly_once_a_refused_checkpoint_fails_the_transaction_with_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    """The checkpoint topic refuses its records (a missing write grant): no batch matches
    the refusal. Was: every batch put back at once, a silent hot loop of aborted
    transactions (1,030 in a second). Now every batch fails (retriable: its worker
    restarts on its backoff), ERROR naming the topic, the loop waits its backoff."""
    from replicator.core.kafka import DeliveryReport
    from tests.unit.test_ingress_shared import FakeProducer, T
    from tests.unit.test_ingress_shared import Harness as TxnHarness

    class CheckpointTopicRefuses(FakeProducer):
        def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                    **kw: Any) -> None:
            super().produce(topic, value, key)
            self.failures.append(DeliveryReport(topic, 0, -1, RecordRefused(
                f"{topic}[0]: refused", reason="Broker: Topic authorization failed")))

    h = TxnHarness()
    h.loop._make = lambda: made(h, CheckpointTopicRefuses(h.log))
    h.ownership.grant([(T, 0), (T, 1)])
    b0, b1 = h.batch(0, 0, 100), h.batch(1, 0, 100)
    h.loop.submit(b0)
    h.loop.submit(b1)
    h.loop.start()
    try:
        assert b0.done.wait(5) and b1.done.wait(5)
        assert b0.error is not None and "cps" in str(b0.error)
        assert not isinstance(b0.error, RecordRefused)      # no worker stops at a record
        h.loop.submit(h.batch(0, 0, 100))                   # the worker's next session
        time.sleep(0.3)
    finally:
        h.loop.close()
    assert h.log.count("abort") <= 2, h.log.count("abort")
    assert any("cps[0]" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_healthz_is_false_once_a_transaction_loop_thread_died() -> None:
    """Every worker of a process whose transaction thread died fails for ever: /healthz
    says so (the orchestrator restarts it). Was: still true. The loop survives any
    ``Exception`` of its own; what ends the thread here is a ``BaseException``."""
    from tests.unit.test_ingress_controller import make
    from tests.unit.test_ingress_shared import Harness as TxnHarness

    class Dies:
        def hold(self, stop: threading.Event) -> None:
            raise SystemExit("the thread dies")

    ing, _store, _admin = make([{"region": "us-east-1", "topic": "t"}])
    h = TxnHarness()
    try:
        ing.transactions.append(h.loop)
        h.loop.start()
        assert ing.healthy()
        h.loop.throttle = cast(Any, Dies())
        deadline = time.monotonic() + 5
        while h.loop.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not h.loop.alive
        assert not ing.healthy() and not ing.ready()
    finally:
        ing.transactions.clear()
        h.loop.close()
        ing.close()


def test_exactly_once_a_refusal_is_seen_without_waiting_out_the_flush() -> None:
    """On Apache Kafka a refused record puts the transaction in an abortable state in which
    the rest of its records are never sent: the flush would wait its whole timeout (60 s),
    then fail every batch as "not acknowledged". Was: every partition of the transaction
    stalled a minute per attempt. The flush looks at the delivery reports between short
    waits, so only the refusing partition's batch fails, at once."""
    from tests.unit.test_ingress_shared import FakeProducer, T
    from tests.unit.test_ingress_shared import Harness as TxnHarness

    class Abortable(FakeProducer):
        def __init__(self, log: list[str]) -> None:
            super().__init__(log)
            self.refuse_values = {b"refused"}

        def flush(self, timeout: float) -> int:
            if self.failures:                   # the rest is never sent
                time.sleep(timeout)
                return 1
            return super().flush(timeout)

    h = TxnHarness()
    h.loop._make = lambda: made(h, Abortable(h.log))
    h.ownership.grant([(T, 0), (T, 1)])
    ok, bad = h.batch(0, 0, 3), h.batch(1, 0, 3, value=b"refused")
    h.loop.submit(ok)
    h.loop.submit(bad)
    h.loop.start()
    try:
        t0 = time.monotonic()
        assert h.outcome(ok) is None
        assert isinstance(h.outcome(bad), RecordRefused)
        assert time.monotonic() - t0 < 4, "waited out the flush's timeout"
    finally:
        h.loop.close()
