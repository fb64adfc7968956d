"""Step 4 of the durability method: offset commits, served on the poll thread.

A worker that made a segment durable asks to commit ``end + 1`` and waits for the result
(``committer``). The poll thread serves every queued request in one synchronous commit
(``serve``): a synchronous commit issued from another thread waits for the poll thread's
next ``fetch`` anyway, and commits must interleave correctly with rebalances, which run on
the poll thread.

Only a partition's current writer commits: each ``committer`` is a new owner of its
partition, and ``retire`` (revoke, loss) ends ownership. A request from a writer that no
longer owns its partition (a zombie still finishing a segment after its partition moved) is
refused, never sent: the broker would accept it from this member, and a stale commit landing
after the partition's new owner read its start position makes that owner name a segment from
one offset while reading from another.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from typing import Protocol

from replicator.core.errors import KafkaRetriableError, ReplicatorError
from replicator.core.kafka import Consumer, TopicPartition
from replicator.core.retry import RetryPolicy, retry

log = logging.getLogger(__name__)

COMMIT_POLICY = RetryPolicy(attempts=3, initial=timedelta(milliseconds=100))
COMMIT_WAIT = 120.0
"""Seconds a worker waits for the poll thread to serve its commit (far above a poll turn)."""

_Request = tuple[str, int, int, str, int, "Future[None]"]
"""(topic, partition, offset, metadata, owner generation, result)"""

NEXT_SEGMENT = "next-segment-start="
"""Commit metadata of a position past records egress skipped (``[egress] skip_origins``):
where the partition's next segment starts, below the committed offset."""

FIRST_POSITION = "first-position"
"""Commit metadata of the start egress chose for a partition without a commit (``start =
"latest"`` or a time): the committed offset is where the partition's history in the
bucket begins, and no segment of it exists yet. A member that resumes from such a commit
records the offset as the partition's first position (it is not a resume of earlier
segments). Older readers see an offset with metadata that is not theirs and resume at the
offset, as before."""


TOPIC_ID = "topic-id="
"""Commit metadata of a plain commit (no mark above): the id of the source topic whose
records the commit covers. At assignment a commit naming another id than the live topic's
is ignored (the topic was deleted and created again, and the commit is the earlier
topic's: honoured, the new topic's records below it would never be archived). Commits with
a mark carry no id, so an egress of an earlier release still reads their mark; an earlier
release reads this one as a plain offset, as before."""


def commit_metadata(offset: int, next_segment: int, topic_id: str | None = None) -> str:
    """The metadata committed with ``offset`` when the next segment starts at
    ``next_segment`` (pure): the skip mark when they differ, else the topic id when known
    (``TOPIC_ID``), else empty.
    """
    if next_segment != offset:
        return f"{NEXT_SEGMENT}{next_segment}"
    return "" if topic_id is None else f"{TOPIC_ID}{topic_id}"


def committed_topic_id(metadata: str) -> str | None:
    """The topic id a commit's ``metadata`` names (pure; ``None``: none)."""
    if not metadata.startswith(TOPIC_ID):
        return None
    return metadata.removeprefix(TOPIC_ID) or None


def of_another_topic(metadata: str, live_id: str | None) -> bool:
    """Whether a commit was made for another incarnation than the live topic ``live_id``
    (pure): both ids known and different.
    """
    committed = committed_topic_id(metadata)
    return committed is not None and live_id is not None and committed != live_id


def started_here(metadata: str) -> bool:
    """True when a commit's ``metadata`` marks the start egress chose for the partition
    (``FIRST_POSITION``), not a resume after segments (pure).
    """
    return metadata == FIRST_POSITION


def next_segment_start(offset: int, metadata: str) -> int:
    """Where the next segment starts for a committed ``offset`` and its ``metadata``
    (pure): the offset itself unless the metadata names an earlier start (the records in
    between were skipped). Metadata egress did not write (another tool's commit) or a
    start above the offset is ignored, with a WARNING.
    """
    if not metadata.startswith(NEXT_SEGMENT):
        return offset
    try:
        start = int(metadata.removeprefix(NEXT_SEGMENT))
    except ValueError:
        start = -1
    if not 0 <= start <= offset:
        log.warning("commit metadata %r of offset %d names no usable segment start; the next "
                    "segment starts at the offset", metadata, offset)
        return offset
    return start


class Commit(Protocol):
    """One partition's commit (``CommitService.committer``)."""

    def __call__(self, offset: int, next_segment: int | None = None, *,
                 first: bool = False, topic_id: str | None = None) -> None: ...


class NotOwner(ReplicatorError):
    """A commit from a writer whose partition was revoked or lost: never sent."""


class CommitService:
    """Commit requests of the partition workers, served by the poll thread."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._owners: dict[tuple[str, int], int] = {}
        self._generation = 0

    def committer(self, topic: str, partition: int) -> Commit:
        """The commit of a new owner of the partition (poll thread: at assignment).

        ``commit(offset, next_segment)`` returns once ``offset`` is committed, with
        ``next_segment`` (where the partition's next segment starts, below ``offset`` when
        the records in between were skipped) in its metadata; ``first=True`` marks the
        offset as the start egress chose (``FIRST_POSITION``). Earlier committers of the
        partition are refused from now on.

        Raises (from ``commit``):
            ReplicatorError: the broker refused, this writer no longer owns the partition,
                or the poll loop ended or did not serve the request within
                ``COMMIT_WAIT`` seconds.
        """
        self._generation += 1
        generation = self._generation
        self._owners[(topic, partition)] = generation

        def commit(offset: int, next_segment: int | None = None, *,
                   first: bool = False, topic_id: str | None = None) -> None:
            meta = FIRST_POSITION if first else \
                commit_metadata(offset, offset if next_segment is None else next_segment,
                                topic_id)
            done: Future[None] = Future()
            self._requests.put((topic, partition, offset, meta, generation, done))
            deadline = time.monotonic() + COMMIT_WAIT
            while True:
                try:
                    done.result(timeout=0.2)
                    return
                except TimeoutError:
                    if self._closed.is_set() or time.monotonic() > deadline:
                        raise KafkaRetriableError(
                            f"commit {topic}[{partition}]@{offset}: the poll loop "
                            "ended or did not serve it in time") from None

        return commit

    def retire(self, topic: str, partition: int) -> None:
        """The partition's writer no longer owns it (poll thread: revoke, loss)."""
        self._owners.pop((topic, partition), None)

    def serve(self, consumer: Consumer) -> None:
        """Commit every queued offset of current owners in one synchronous request (poll
        thread only); refuse the others.
        """
        requests: list[_Request] = []
        while True:
            try:
                r = self._requests.get_nowait()
            except queue.Empty:
                break
            t, p, o, _meta, generation, done = r
            if self._owners.get((t, p)) != generation:
                done.set_exception(NotOwner(
                    f"commit {t}[{p}]@{o} refused: this writer no longer owns the "
                    "partition (it was revoked or lost; its new owner reads from its own "
                    "start)"))
                continue
            requests.append(r)
        if not requests:
            return
        what = ", ".join(f"{t}[{p}]@{o}" for t, p, o, *_ in requests)
        offsets = [TopicPartition(t, p, o, meta) for t, p, o, meta, *_ in requests]
        try:
            refused = retry(lambda: consumer.commit(offsets), COMMIT_POLICY,
                            what=f"commit {what}")
        except ReplicatorError as e:
            for *_, done in requests:
                done.set_exception(e)
            return
        for t, p, *_, done in requests:
            err = refused.get((t, p))
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(err)

    def close(self) -> None:
        """Nobody serves commits any more: waiting and later requests fail at once."""
        self._closed.set()
