"""A former owner cannot commit once its partitions moved, on Apache Kafka.

Ingress writes every partition it owns through one transactional producer per process, so
a new owner can no longer fence the former one through a shared ``transactional.id``. The
placement group's generation does it instead (ingress/README.md, "Producer and fencing"):
each transaction sends the placement consumer's group metadata with
``send_offsets_to_transaction`` before it commits, and the group coordinator refuses a
member of an older generation.

The zombie here is a process that stopped polling (stuck, or cut off): it still believes it
owns both partitions (its revoke callback never ran), and another member took them over.
Its transaction is refused and aborted: nothing of it is visible read_committed, while the
log shows its records were written (the refusal came at the fencing point, not before).

A member whose commit stalls *after* the fencing point is covered by the next owner's
checkpoint load instead (ingress/README.md, "Producer and fencing", point 3): its
checkpoint records are in the log before that point, so the load waits for the commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from ingress.checkpoints import KafkaCheckpointStore
from ingress.metrics import IngressMetrics
from ingress.ownership import Ownership
from ingress.rows import Rows
from ingress.transactions import Batch, TransactionLoop
from replicator.core.errors import GenerationFenced
from replicator.core.kafka import (
    Admin,
    Consumer,
    GroupMetadata,
    Producer,
    group_generation,
    read_to_end,
)
from replicator.core.metrics import Metrics
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint
from tests.conftest import FAST_GROUP_CONFIG, RECENT_MS, unique_name

pytestmark = pytest.mark.apache

# The zombie leaves the group this long after its last poll (librdkafka needs
# max.poll.interval.ms >= session.timeout.ms).
ZOMBIE_CONFIG = {**FAST_GROUP_CONFIG, "session.timeout.ms": 3000, "heartbeat.interval.ms": 300,
                 "max.poll.interval.ms": 3000}


def rows(lo: int, hi: int) -> Rows:
    n = hi - lo
    return Rows(list(range(lo, hi)), [RECENT_MS] * n, [b"k"] * n,
                [b"v%d" % o for o in range(lo, hi)], [None] * n)


def count(kafka: KafkaSettings, topic: str,
          isolation: Literal["read_committed", "read_uncommitted"]) -> int:
    return sum(1 for _ in read_to_end(kafka, topic, isolation=isolation, timeout=30,
                                      idle_timeout=30))


def owns(consumer: Consumer, n: int) -> Callable[[], bool]:
    def check() -> bool:
        consumer.poll(0.1)
        return len(consumer.assignment()) == n
    return check


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def zombie_commit(kafka: KafkaSettings, topic: str, checkpoints: str,
                  group: Callable[[], GroupMetadata]) -> BaseException | None:
    """One transaction of the zombie's loop (it believes it owns both partitions)."""
    ownership = Ownership()
    ownership.grant({(topic, 0), (topic, 1)})
    loop = TransactionLoop(kafka, transactional_id=unique_name("zombie"),
                           checkpoint_topic=checkpoints, ownership=ownership, group=group,
                           metrics=IngressMetrics.create(Metrics()), timeout=20)
    loop.start()
    try:
        now = datetime.now(UTC)
        batches = [Batch(topic, p, ownership.epoch((topic, p)) or 0, rows(0, 10), f"src:{p}",
                         Checkpoint(9, "seg", now)) for p in (0, 1)]
        for b in batches:
            loop.submit(b)
        try:
            for b in batches:
                loop.wait(b)
        except GenerationFenced as e:
            return e
        return None
    finally:
        loop.close()


@pytest.fixture
def moved(dest_brokers: str) -> Iterator[tuple[KafkaSettings, str, str, Consumer,
                                                GroupMetadata]]:
    """Member A owned both partitions and stopped polling; member B owns them now."""
    kafka = KafkaSettings(brokers=dest_brokers, config=dict(ZOMBIE_CONFIG))
    topic, checkpoints, group = unique_name("dest"), unique_name("cps"), unique_name("grp")
    admin = Admin(kafka)
    assert admin.create_topic(topic, 2) and admin.create_topic(checkpoints, 1)
    a = Consumer(kafka, group)
    a.subscribe([topic])
    wait_for(owns(a, 2), 30, "member A to own both partitions")
    stale = a.group_metadata()
    assert group_generation(stale)[0] >= 0
    b = Consumer(kafka, group)
    b.subscribe([topic])
    wait_for(owns(b, 2), 30, "member B to take both partitions over")
    try:
        yield kafka, topic, checkpoints, a, stale
    finally:
        b.close()
        a.close()


def test_a_former_owner_cannot_commit_after_its_partitions_moved(
        moved: tuple[KafkaSettings, str, str, Consumer, GroupMetadata]) -> None:
    kafka, topic, checkpoints, _a, stale = moved
    # The metadata A had while it owned the partitions: the coordinator refuses it.
    err = zombie_commit(kafka, topic, checkpoints, lambda: stale)
    assert isinstance(err, GenerationFenced), err
    assert count(kafka, topic, "read_committed") == 0
    assert count(kafka, checkpoints, "read_committed") == 0
    # The records were in the log: refused at the fencing point, then aborted.
    assert count(kafka, topic, "read_uncommitted") == 20


def test_a_member_in_no_generation_is_refused_before_the_broker_would_accept_it(
        moved: tuple[KafkaSettings, str, str, Consumer, GroupMetadata]) -> None:
    """Metadata of a member in no generation (a consumer of the group that has not joined,
    or whose membership the client reset): generation -1, no member id. The broker accepts
    transactional offsets without a generation (older clients send none), so the loop
    refuses them itself.
    """
    kafka, topic, checkpoints, _a, _stale = moved
    never_joined = Consumer(kafka, _group_of(moved))
    try:
        assert group_generation(never_joined.group_metadata()) == (-1, "")
        err = zombie_commit(kafka, topic, checkpoints, never_joined.group_metadata)
    finally:
        never_joined.close()
    assert isinstance(err, GenerationFenced), err
    assert count(kafka, topic, "read_committed") == 0
    assert count(kafka, checkpoints, "read_committed") == 0


def _group_of(moved: tuple[KafkaSettings, str, str, Consumer, GroupMetadata]) -> str:
    return moved[3].group_id


class StallingProducer(Producer):
    """The seam's producer with a hook: its ``stall_at``-th commit waits for ``release``
    (a member frozen, or cut off, right after its generation check passed)."""

    def __init__(self, *args: Any, stall_at: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.stall_at = stall_at
        self.commits = 0
        self.committing = threading.Event()
        self.release = threading.Event()

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1
        if self.commits == self.stall_at:
            self.committing.set()
            assert self.release.wait(120)
        super().commit_transaction(timeout)


def values(kafka: KafkaSettings, topic: str) -> list[bytes | None]:
    return [m.value() for m in read_to_end(kafka, topic, isolation="read_committed",
                                           timeout=30, idle_timeout=30)]


def test_a_commit_stalled_past_the_revoke_is_waited_for_by_the_next_owners_load(
        dest_brokers: str) -> None:
    """Member A passes the generation check of its second transaction, then its commit
    stalls (a frozen pod) while its checkpoint records would still linger in the client
    (``linger.ms`` 60 s). The group moves the partition to B, whose checkpoint load must
    not return the older checkpoint: B would replay the batch, and A's commit, released
    later, would land too (the batch twice read_committed). The loop waits for its
    checkpoint records' delivery before the check, so B's load waits for A's transaction.
    """
    # A member that stops polling leaves the group 10 s later: room for a transaction on
    # a loaded machine without polling (a consumer is not polled while another thread
    # takes its group metadata here).
    kafka = KafkaSettings(brokers=dest_brokers,
                          config={**ZOMBIE_CONFIG, "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 500,
                                  "max.poll.interval.ms": 10000})
    topic, checkpoints, group = unique_name("dest"), unique_name("cps"), unique_name("grp")
    admin = Admin(kafka)
    assert admin.create_topic(topic, 1) and admin.create_topic(checkpoints, 1)
    key = "src:0"
    a = Consumer(kafka, group)
    a.subscribe([topic])
    wait_for(owns(a, 1), 30, "member A to own the partition")
    producers: list[StallingProducer] = []

    def make_a() -> Producer:
        p = StallingProducer(kafka, transactional_id=unique_name("a"), stall_at=2,
                             overrides={"linger.ms": 60000,
                                        "transaction.timeout.ms": 120000})
        producers.append(p)
        return p

    own_a = Ownership()
    own_a.grant({(topic, 0)})
    loop_a = TransactionLoop(kafka, transactional_id="unused", checkpoint_topic=checkpoints,
                             ownership=own_a, group=a.group_metadata,
                             metrics=IngressMetrics.create(Metrics()), timeout=20,
                             make_producer=make_a)
    b: Consumer | None = None
    loop_b: TransactionLoop | None = None
    try:
        loop_a.start()
        epoch_a = own_a.epoch((topic, 0)) or 0
        a.poll(0.1)                               # A is a live member for its first commit
        first = Batch(topic, 0, epoch_a, rows(0, 10), key, Checkpoint(9, "s", datetime.now(UTC)))
        loop_a.submit(first)
        loop_a.wait(first)
        a.poll(0.1)
        second = Batch(topic, 0, epoch_a, rows(10, 20), key,
                       Checkpoint(19, "s", datetime.now(UTC)))
        loop_a.submit(second)
        assert producers[0].committing.wait(30), "A's second commit never started"
        # A is frozen from here (no poll, its commit stalled); B takes the partition over.
        b = Consumer(kafka, group)
        b.subscribe([topic])
        wait_for(owns(b, 1), 60, "member B to take the partition over")
        loaded: list[Checkpoint | None] = []
        load = threading.Thread(target=lambda: loaded.append(
            KafkaCheckpointStore(kafka, checkpoints, Metrics(), timeout=60).load(key)))
        load.start()
        # A's commit resumes well after the revoke (B keeps its membership meanwhile).
        threading.Timer(5.0, producers[0].release.set).start()
        while load.is_alive():
            b.poll(0.1)
        loop_a.wait(second)                       # A's commit landed
        assert loaded and loaded[0] is not None
        if loaded[0].offset < 19:                 # B replays what its checkpoint lacks
            own_b = Ownership()
            own_b.grant({(topic, 0)})
            loop_b = TransactionLoop(kafka, transactional_id=unique_name("b"),
                                     checkpoint_topic=checkpoints, ownership=own_b,
                                     group=b.group_metadata,
                                     metrics=IngressMetrics.create(Metrics()), timeout=20)
            loop_b.start()
            lo = loaded[0].offset + 1
            again = Batch(topic, 0, own_b.epoch((topic, 0)) or 0, rows(lo, 20), key,
                          Checkpoint(19, "s", datetime.now(UTC)))
            b.poll(0.1)
            loop_b.submit(again)
            loop_b.wait(again)
        got = values(kafka, topic)
        dup = len(got) - len(set(got))
        assert dup == 0, f"{dup} record(s) twice read_committed (B loaded {loaded[0]})"
        assert sorted(v or b"" for v in got) == sorted(b"v%d" % o for o in range(20))
    finally:
        for p in producers:
            p.release.set()
        if loop_b is not None:
            loop_b.close()
        loop_a.close()
        if b is not None:
            b.close()
        a.close()
