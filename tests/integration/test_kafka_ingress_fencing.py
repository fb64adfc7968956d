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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Literal

import pytest

from ingress.metrics import IngressMetrics
from ingress.rows import Rows
from ingress.shared import Batch, Ownership, TransactionLoop
from replicator.core.errors import GenerationFenced
from replicator.core.kafka import Admin, Consumer, GroupMetadata, group_generation, read_to_end
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
