"""The commit service: only the partition's current writer commits."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from egress.commits import COMMIT_POLICY, CommitService, NotOwner
from replicator.core.errors import KafkaRetriableError, ReplicatorError
from replicator.core.kafka import TopicPartition


class CommitRecorder:
    def __init__(self) -> None:
        self.commits: list[tuple[str, int, int]] = []

    def commit(self, offsets: Sequence[TopicPartition]) -> dict[tuple[str, int],
                                                                  ReplicatorError]:
        self.commits.extend((tp.topic, tp.partition, tp.offset) for tp in offsets)
        return {}


def commit_in_thread(commit: object, offset: int) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def run() -> None:
        try:
            commit(offset)  # type: ignore[operator]
            result.append("ok")
        except ReplicatorError as e:
            result.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, result


def serve_until(service: CommitService, consumer: CommitRecorder, t: threading.Thread) -> None:
    while t.is_alive():
        service.serve(consumer)  # type: ignore[arg-type]
        t.join(0.01)


def test_the_current_writer_commits() -> None:
    service, consumer = CommitService(), CommitRecorder()
    commit = service.committer("t", 0)
    t, result = commit_in_thread(commit, 5)
    serve_until(service, consumer, t)
    assert result == ["ok"] and consumer.commits == [("t", 0, 5)]


@pytest.mark.parametrize("then", ["retired", "reassigned"])
def test_a_writer_that_no_longer_owns_its_partition_never_commits(then: str) -> None:
    service, consumer = CommitService(), CommitRecorder()
    old = service.committer("t", 0)
    service.retire("t", 0)
    if then == "reassigned":
        service.committer("t", 0)   # the partition came back: a new writer owns it
    t, result = commit_in_thread(old, 5)
    serve_until(service, consumer, t)
    assert consumer.commits == []
    assert len(result) == 1 and isinstance(result[0], ReplicatorError)
    assert "no longer owns" in str(result[0])


# --- asynchronous commits: one in flight per partition, never backwards -----------------


class AsyncRecorder(CommitRecorder):
    """Records asynchronous sends; the test plays the client's commit callback."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[list[tuple[str, int, int]]] = []

    def commit_async(self, offsets: Sequence[TopicPartition]) -> None:
        self.sent.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(service: CommitService, commit: object, offset: int
            ) -> tuple[threading.Thread, list[object]]:
    """A worker's commit, queued and taken by the service before returning."""
    t, result = commit_in_thread(commit, offset)
    while service._requests.empty() and not result:
        t.join(0.001)
    return t, result


def settle(t: threading.Thread) -> None:
    t.join(5)
    assert not t.is_alive()


def retriable() -> KafkaRetriableError:
    return KafkaRetriableError("commit t[0]: REBALANCE_IN_PROGRESS")


def test_an_asynchronous_commit_reports_the_clients_outcome_to_the_writer() -> None:
    service, consumer = CommitService(), AsyncRecorder()
    t, result = request(service, service.committer("t", 0), 5)
    service.send(consumer)  # type: ignore[arg-type]
    assert consumer.sent == [[("t", 0, 5)]] and result == []
    service.on_commit([(TopicPartition("t", 0, 5), None)])
    settle(t)
    assert result == ["ok"]


def test_a_newer_offset_waits_for_the_one_in_flight_and_covers_older_ones() -> None:
    service, consumer = CommitService(), AsyncRecorder()
    commit = service.committer("t", 0)
    t1, r1 = request(service, commit, 5)
    service.send(consumer)  # type: ignore[arg-type]
    t2, r2 = request(service, commit, 8)
    t3, r3 = request(service, commit, 10)
    service.send(consumer)  # type: ignore[arg-type]
    # 5 is in flight: nothing else of the partition is sent until its outcome.
    assert consumer.sent == [[("t", 0, 5)]]
    service.on_commit([(TopicPartition("t", 0, 5), None)])
    service.send(consumer)  # type: ignore[arg-type]
    assert consumer.sent == [[("t", 0, 5)], [("t", 0, 10)]]
    service.on_commit([(TopicPartition("t", 0, 10), None)])
    for t in (t1, t2, t3):
        settle(t)
    assert r1 == r2 == r3 == ["ok"]


def test_a_failed_older_commit_is_never_sent_again_over_a_newer_offset() -> None:
    service, consumer = CommitService(), AsyncRecorder()
    commit = service.committer("t", 0)
    t1, r1 = request(service, commit, 5)
    service.send(consumer)  # type: ignore[arg-type]
    t2, r2 = request(service, commit, 10)
    service._take_requests()
    service.on_commit([(TopicPartition("t", 0, 5), retriable())])
    service.send(consumer)  # type: ignore[arg-type]
    service.on_commit([(TopicPartition("t", 0, 10), None)])
    service.send(consumer)  # type: ignore[arg-type]
    sent = [o for batch in consumer.sent for _t, _p, o in batch]
    assert sent == [5, 10], "the failed 5 must ride on 10, never be sent after it"
    for t in (t1, t2):
        settle(t)
    assert r1 == r2 == ["ok"]


def test_a_retriable_failure_is_sent_again_after_the_delay_while_owned() -> None:
    clock = Clock()
    service, consumer = CommitService(clock), AsyncRecorder()
    t, result = request(service, service.committer("t", 0), 5)
    service.send(consumer)  # type: ignore[arg-type]
    service.on_commit([(TopicPartition("t", 0, 5), retriable())])
    service.send(consumer)  # type: ignore[arg-type]
    assert len(consumer.sent) == 1, "sent again only after the policy's delay"
    clock.now += 1.0
    service.send(consumer)  # type: ignore[arg-type]
    assert consumer.sent[1] == [("t", 0, 5)]
    service.on_commit([(TopicPartition("t", 0, 5), None)])
    settle(t)
    assert result == ["ok"]


def test_a_failure_after_the_owner_is_gone_is_reported_not_sent_again() -> None:
    clock = Clock()
    service, consumer = CommitService(clock), AsyncRecorder()
    t, result = request(service, service.committer("t", 0), 5)
    service.send(consumer)  # type: ignore[arg-type]
    service.retire("t", 0)
    service.committer("t", 0)   # the partition came back: a new writer owns it
    service.on_commit([(TopicPartition("t", 0, 5), retriable())])
    clock.now += 10
    service.send(consumer)  # type: ignore[arg-type]
    settle(t)
    assert len(consumer.sent) == 1
    assert len(result) == 1 and isinstance(result[0], KafkaRetriableError)


def test_retries_end_with_the_error_for_the_writer() -> None:
    clock = Clock()
    service, consumer = CommitService(clock), AsyncRecorder()
    t, result = request(service, service.committer("t", 0), 5)
    for _ in range(COMMIT_POLICY.attempts):
        service.send(consumer)  # type: ignore[arg-type]
        service.on_commit([(TopicPartition("t", 0, 5), retriable())])
        clock.now += 10
    service.send(consumer)  # type: ignore[arg-type]
    settle(t)
    assert len(consumer.sent) == COMMIT_POLICY.attempts
    assert len(result) == 1 and isinstance(result[0], KafkaRetriableError)


def test_a_release_commits_what_is_in_flight_synchronously() -> None:
    # A revoke runs inside the client's poll: no commit callback can arrive there, so the
    # offsets in flight are committed again synchronously and their writers released.
    service, consumer = CommitService(), AsyncRecorder()
    commit = service.committer("t", 0)
    t1, r1 = request(service, commit, 5)
    service.send(consumer)  # type: ignore[arg-type]
    t2, r2 = request(service, commit, 9)
    service.serve(consumer)  # type: ignore[arg-type]
    assert consumer.commits == [("t", 0, 9)]
    for t in (t1, t2):
        settle(t)
    assert r1 == r2 == ["ok"]
    # The asynchronous 5's late outcome changes nothing; later offsets are sent as usual.
    service.on_commit([(TopicPartition("t", 0, 5), retriable())])
    t3, _ = request(service, commit, 12)
    service.send(consumer)  # type: ignore[arg-type]
    assert consumer.sent[-1] == [("t", 0, 12)]
    service.on_commit([(TopicPartition("t", 0, 12), None)])
    settle(t3)


def test_a_deleted_topics_commit_is_refused_with_the_reason_never_sent() -> None:
    service, consumer = CommitService(), AsyncRecorder()
    commit = service.committer("t", 0)
    service.retire("t", 0, deleted=True)
    t, result = commit_in_thread(commit, 5)
    serve_until(service, consumer, t)
    assert consumer.commits == [] and consumer.sent == []
    assert len(result) == 1 and isinstance(result[0], NotOwner)
    assert "topic was deleted" in str(result[0])
    # A topic created again under the name has a new owner, whose commits are sent.
    t, result = commit_in_thread(service.committer("t", 0), 3)
    serve_until(service, consumer, t)
    assert result == ["ok"] and consumer.commits == [("t", 0, 3)]
