"""The commit service: only the partition's current writer commits."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from egress.commits import (
    FIRST_POSITION,
    CommitService,
    commit_metadata,
    next_segment_start,
    started_here,
)
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import TopicPartition


class CommitRecorder:
    def __init__(self) -> None:
        self.commits: list[tuple[str, int, int]] = []
        self.metadata: list[str] = []

    def commit(self, offsets: Sequence[TopicPartition]) -> dict[tuple[str, int],
                                                                  ReplicatorError]:
        self.commits.extend((tp.topic, tp.partition, tp.offset) for tp in offsets)
        self.metadata.extend(tp.metadata for tp in offsets)
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


def test_commit_metadata_keeps_the_next_segment_start_only_where_it_differs() -> None:
    from egress.commits import commit_metadata, next_segment_start

    assert commit_metadata(10, 10) == ""
    assert next_segment_start(10, commit_metadata(10, 4)) == 4
    assert next_segment_start(10, "") == 10
    assert next_segment_start(10, "written by another tool") == 10
    assert next_segment_start(10, "next-segment-start=11") == 10     # above: ignored
    assert next_segment_start(10, "next-segment-start=x") == 10


def test_a_chosen_start_is_marked_and_read_back_as_one() -> None:
    service, consumer = CommitService(), CommitRecorder()
    commit = service.committer("t", 0)
    t = threading.Thread(target=lambda: commit(2500, 2500, first=True))
    t.start()
    serve_until(service, consumer, t)
    assert consumer.commits == [("t", 0, 2500)] and consumer.metadata == [FIRST_POSITION]
    assert started_here(consumer.metadata[0])
    assert next_segment_start(2500, consumer.metadata[0]) == 2500
    # Every other commit, with or without skipped records, is a resume.
    assert not started_here(commit_metadata(10, 10))
    assert not started_here(commit_metadata(10, 7))
