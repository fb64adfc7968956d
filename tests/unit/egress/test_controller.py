"""The egress controller's assignment: fetch from the positions read, owners of commits."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from egress.commits import NotOwner
from egress.controller import Egress
from replicator.core.kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition
from replicator.core.settings import load_settings
from tests.unit.egress.fakes import Harness
from tests.unit.egress.test_commits import CommitRecorder, commit_in_thread, serve_until


class AssignConsumer:
    """What ``_on_assign`` sees: committed offsets, and the assignment it makes."""

    def __init__(self, committed: dict[int, int]) -> None:
        self._committed = committed
        self.assigned: list[TopicPartition] = []

    def committed(self, tps: Sequence[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition,
                               self._committed.get(tp.partition, OFFSET_INVALID))
                for tp in tps]

    def assign_added(self, tps: Sequence[TopicPartition]) -> None:
        self.assigned.extend(tps)


@pytest.fixture
def egress() -> Iterator[Egress]:
    h = Harness()
    settings = load_settings(data={
        "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "localhost:1"},
        "egress": {"group_id": "g", "topics": {"t": {}}}}, environ={})
    eg = Egress(settings, store=h.store)
    eg._ctx = h.ctx
    yield eg
    h.close()


def test_assignment_fetches_from_the_offsets_it_read(egress: Egress) -> None:
    consumer = AssignConsumer({0: 40})
    egress._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])  # type: ignore[arg-type]
    # A commit landing after the read cannot move where the fetch starts: the partition
    # with a commit starts there, the one without from its beginning (what its segment's
    # name, the first record's offset, assumes).
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [
        (0, 40), (1, OFFSET_BEGINNING)]
    assert egress._writers[("t", 0)].expected == 40
    assert egress._writers[("t", 1)].expected is None


def test_a_lost_partitions_writer_can_no_longer_commit(egress: Egress) -> None:
    consumer = AssignConsumer({0: 40})
    egress._on_assign(consumer, [TopicPartition("t", 0)])  # type: ignore[arg-type]
    zombie = egress._writers[("t", 0)]
    egress._on_lost(consumer, [TopicPartition("t", 0)])  # type: ignore[arg-type]
    recorder = CommitRecorder()
    t, result = commit_in_thread(zombie._commit, 50)
    serve_until(egress._commits, recorder, t)
    assert recorder.commits == [] and isinstance(result[0], NotOwner)
