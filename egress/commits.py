"""Step 4 of the durability method: offset commits, served on the poll thread.

A worker that made a segment durable asks to commit ``end + 1`` and waits for the result
(``committer``). Commits are sent by the poll thread only: commits must interleave correctly
with rebalances, which run on the poll thread.

While the loop runs, commits are asynchronous (``send``): each poll turn sends every
queued offset in one request without waiting, and the client reports the outcome through
``on_commit`` from a later ``fetch`` on the same thread (librdkafka's offset commit
callback). A synchronous commit cost the poll thread one broker round trip per turn that had
a durable segment, a quarter of its time at 1,000 partitions (bench/RESULTS.md, "Egress at
1,000 partitions"). Per partition at most one commit is in flight; newer offsets wait and
merge into one, so a late or retried commit can never land after a newer one and move the
offset back (``Book``). Releases (revoke, shutdown, deleted topics) commit synchronously
(``serve``): their commits are confirmed before the partition is given up or the consumer
closes, and no callback can run inside a rebalance callback.

Only a partition's current writer commits: each ``committer`` is a new owner of its
partition, and ``retire`` (revoke, loss) ends ownership. A request from a writer that no
longer owns its partition (a zombie still finishing a segment after its partition moved) is
refused, never sent: the broker would accept it from this member, and a stale commit landing
after the partition's new owner read its start position makes that owner name a segment from
one offset while reading from another.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta

from replicator.core.errors import KafkaRetriableError, ReplicatorError
from replicator.core.kafka import Consumer, TopicPartition
from replicator.core.retry import RetryPolicy, retry

COMMIT_POLICY = RetryPolicy(attempts=3, initial=timedelta(milliseconds=100))
COMMIT_WAIT = 120.0
"""Seconds a worker waits for the poll thread to serve its commit (far above a poll turn)."""

Key = tuple[str, int]
_Request = tuple[str, int, int, int, "Future[None]"]
"""(topic, partition, offset, owner generation, result)"""


class NotOwner(ReplicatorError):
    """A commit from a writer whose partition was revoked or lost: never sent."""


@dataclass
class Pending:
    """One offset of a partition to commit, and the workers waiting on it (older offsets
    of the same owner merged in: committing the newest covers them).
    """

    offset: int
    generation: int
    waiters: list[Future[None]] = field(default_factory=list)
    attempts: int = 0
    not_before: float = 0.0


@dataclass
class PartitionCommits:
    """One partition's commits: the offset in flight, the next one waiting to be sent."""

    in_flight: Pending | None = None
    waiting: Pending | None = None
    acked: int = -1
    """The highest offset this member committed for the partition (-1: none yet)."""


def _resolve(waiters: Sequence[Future[None]], error: BaseException | None) -> None:
    for f in waiters:
        if f.done():
            continue
        if error is None:
            f.set_result(None)
        else:
            f.set_exception(error)


class Book:
    """Which offsets to send, and what a commit's outcome means (pure; poll thread only).

    Per partition: at most one offset in flight; newer requests wait, merged into the
    newest. An outcome settles the offset in flight: success raises ``acked``; a retriable
    failure is sent again (after the policy's delay) only while its writer still owns the
    partition and nothing newer is waiting or already committed, otherwise the newer
    commit's outcome becomes its outcome, so a failed older offset is never sent over a
    newer one and the committed offset never goes back.
    """

    def __init__(self, policy: RetryPolicy = COMMIT_POLICY) -> None:
        self.policy = policy
        self.parts: dict[Key, PartitionCommits] = {}
        self.waiting: set[Key] = set()
        """Partitions with an offset waiting to be sent."""

    def add(self, key: Key, offset: int, generation: int, done: Future[None]) -> None:
        """A request of the partition's current owner (checked by the caller)."""
        st = self.parts.setdefault(key, PartitionCommits())
        if offset <= st.acked:
            done.set_result(None)    # already covered by a commit of this member
            return
        w = st.waiting
        if w is None or w.generation != generation:
            if w is not None:
                _resolve(w.waiters, _not_owner(key, w.offset))
            st.waiting = Pending(offset, generation, [done])
            self.waiting.add(key)
            return
        w.offset = max(w.offset, offset)
        w.waiters.append(done)

    def retire(self, key: Key, deleted: bool = False) -> None:
        """The partition's owner is gone: its waiting offsets are refused (the one in
        flight keeps its outcome, which settles its waiters).
        """
        st = self.parts.get(key)
        if st is None:
            return
        if st.waiting is not None:
            _resolve(st.waiting.waiters, _not_owner(key, st.waiting.offset, deleted))
            st.waiting = None
        self.waiting.discard(key)
        st.acked = -1
        if st.in_flight is None:
            del self.parts[key]

    def due(self, now: float, owners: dict[Key, int]) -> list[tuple[Key, int]]:
        """Take the waiting offsets that can be sent now (moved in flight)."""
        out: list[tuple[Key, int]] = []
        for key in list(self.waiting):
            st = self.parts[key]
            w = st.waiting
            if w is None or st.in_flight is not None or w.not_before > now:
                continue
            st.waiting = None
            self.waiting.discard(key)
            if owners.get(key) != w.generation:
                _resolve(w.waiters, _not_owner(key, w.offset))
                continue
            st.in_flight = w
            out.append((key, w.offset))
        return out

    def outcome(self, key: Key, offset: int, error: ReplicatorError | None, now: float,
                owners: dict[Key, int]) -> None:
        """The client's report for ``offset`` of ``key`` (reports of offsets not in flight,
        such as a synchronous commit's echo, are ignored).
        """
        st = self.parts.get(key)
        p = None if st is None else st.in_flight
        if st is None or p is None or p.offset != offset:
            return
        st.in_flight = None
        if error is None:
            st.acked = max(st.acked, offset)
            _resolve(p.waiters, None)
        elif offset <= st.acked:
            _resolve(p.waiters, None)
        elif st.waiting is not None and st.waiting.generation == p.generation:
            # The newer offset covers this one: its outcome is theirs.
            st.waiting.waiters.extend(p.waiters)
        elif (isinstance(error, KafkaRetriableError) and owners.get(key) == p.generation
              and p.attempts + 1 < self.policy.attempts):
            p.not_before = now + self.policy.nominal_delay(p.attempts)
            p.attempts += 1
            st.waiting = p
            self.waiting.add(key)
        else:
            _resolve(p.waiters, error)
        if st.in_flight is None and st.waiting is None and key not in owners:
            del self.parts[key]

    def take_all(self, owners: dict[Key, int]) -> dict[Key, tuple[int, list[Future[None]]]]:
        """Everything waiting or in flight of current owners, newest offset per partition,
        for a synchronous commit (a release); the rest is refused.
        """
        out: dict[Key, tuple[int, list[Future[None]]]] = {}
        for key, st in list(self.parts.items()):
            waiters: list[Future[None]] = []
            offset = -1
            for p in (st.in_flight, st.waiting):
                if p is None:
                    continue
                if owners.get(key) != p.generation:
                    if p is st.waiting:
                        _resolve(p.waiters, _not_owner(key, p.offset))
                        st.waiting = None
                        self.waiting.discard(key)
                    continue
                waiters += p.waiters
                offset = max(offset, p.offset)
            if offset >= 0:
                # Sent again synchronously: the same offset again if nothing newer waits.
                if st.in_flight is not None and owners.get(key) == st.in_flight.generation:
                    st.in_flight = None
                st.waiting = None
                self.waiting.discard(key)
                out[key] = (offset, waiters)
        return out

    def synced(self, key: Key, offset: int, error: ReplicatorError | None) -> None:
        st = self.parts.get(key)
        if st is not None and error is None:
            st.acked = max(st.acked, offset)


def _not_owner(key: Key, offset: int, deleted: bool = False) -> NotOwner:
    t, p = key
    if deleted:
        # Nothing is lost: the segment is durable before its commit, nobody can read a
        # deleted partition again, and a topic created again under the name is a new log
        # that must never start from the old one's offsets.
        return NotOwner(f"commit {t}[{p}]@{offset} not sent: the topic was deleted")
    return NotOwner(f"commit {t}[{p}]@{offset} refused: this writer no longer owns the "
                    "partition (it was revoked or lost; its new owner reads from its own "
                    "start)")


class CommitService:
    """Commit requests of the partition workers, served by the poll thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._owners: dict[Key, int] = {}
        self._generation = 0
        self._deleted: set[Key] = set()
        self._clock = clock
        self.book = Book()

    def committer(self, topic: str, partition: int) -> Callable[[int], None]:
        """The commit of a new owner of the partition (poll thread: at assignment).

        ``commit(offset)`` returns once ``offset`` is committed. Earlier committers of the
        partition are refused from now on.

        Raises (from ``commit``):
            ReplicatorError: the broker refused, this writer no longer owns the partition,
                or the poll loop ended or did not serve the request within
                ``COMMIT_WAIT`` seconds.
        """
        self._generation += 1
        generation = self._generation
        self._owners[(topic, partition)] = generation
        self._deleted.discard((topic, partition))

        def commit(offset: int) -> None:
            done: Future[None] = Future()
            self._requests.put((topic, partition, offset, generation, done))
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

    def retire(self, topic: str, partition: int, *, deleted: bool = False) -> None:
        """The partition's writer no longer owns it (poll thread: revoke, loss);
        ``deleted``: because its topic was deleted (its commits are refused as such).
        """
        key = (topic, partition)
        self._owners.pop(key, None)
        if deleted:
            self._deleted.add(key)
        self.book.retire(key, deleted)

    def _take_requests(self) -> None:
        while True:
            try:
                t, p, o, generation, done = self._requests.get_nowait()
            except queue.Empty:
                return
            if self._owners.get((t, p)) != generation:
                done.set_exception(_not_owner((t, p), o, (t, p) in self._deleted))
                continue
            self.book.add((t, p), o, generation, done)

    def send(self, consumer: Consumer) -> None:
        """Send the queued offsets of current owners in one asynchronous request (poll
        thread only); refuse the others. Outcomes arrive through ``on_commit``.
        """
        self._take_requests()
        if not self.book.waiting:
            return
        due = self.book.due(self._clock(), self._owners)
        if not due:
            return
        try:
            consumer.commit_async([TopicPartition(t, p, o) for (t, p), o in due])
        except ReplicatorError as e:
            now = self._clock()
            for key, o in due:
                self.book.outcome(key, o, e, now, self._owners)

    def on_commit(self, results: Sequence[tuple[TopicPartition, ReplicatorError | None]]
                  ) -> None:
        """The client's report of a commit (poll thread, inside ``fetch``)."""
        now = self._clock()
        for tp, err in results:
            self.book.outcome((tp.topic, tp.partition), tp.offset, err, now, self._owners)

    def serve(self, consumer: Consumer) -> None:
        """Commit every queued or in-flight offset of current owners in one synchronous
        request (poll thread only: releases); refuse the others.
        """
        self._take_requests()
        if not self.book.parts:
            return
        todo = self.book.take_all(self._owners)
        if not todo:
            return
        what = ", ".join(f"{t}[{p}]@{o}" for (t, p), (o, _) in todo.items())
        offsets = [TopicPartition(t, p, o) for (t, p), (o, _) in todo.items()]
        try:
            refused = retry(lambda: consumer.commit(offsets), COMMIT_POLICY,
                            what=f"commit {what}")
        except ReplicatorError as e:
            for _o, waiters in todo.values():
                _resolve(waiters, e)
            return
        for key, (o, waiters) in todo.items():
            err = refused.get(key)
            self.book.synced(key, o, err)
            _resolve(waiters, err)

    def close(self) -> None:
        """Nobody serves commits any more: waiting and later requests fail at once."""
        self._closed.set()
