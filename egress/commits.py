"""Step 4 of the durability method: offset commits, served on the poll thread.

A worker that made a segment durable asks to commit ``end + 1`` and waits for the result
(``committer``). The poll thread serves every queued request in one synchronous commit
(``serve``): a synchronous commit issued from another thread waits for the poll thread's
next ``fetch`` anyway, and commits must interleave correctly with rebalances, which run on
the poll thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta

from replicator.core.errors import KafkaRetriableError, ReplicatorError
from replicator.core.kafka import Consumer, TopicPartition
from replicator.core.retry import RetryPolicy, retry

COMMIT_POLICY = RetryPolicy(attempts=3, initial=timedelta(milliseconds=100))
COMMIT_WAIT = 120.0
"""Seconds a worker waits for the poll thread to serve its commit (far above a poll turn)."""

_Request = tuple[str, int, int, "Future[None]"]


class CommitService:
    """Commit requests of the partition workers, served by the poll thread."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._closed = threading.Event()

    def committer(self, topic: str, partition: int) -> Callable[[int], None]:
        """A partition's commit: ``commit(offset)`` returns once ``offset`` is committed.

        Raises (from ``commit``):
            ReplicatorError: the broker refused, or the poll loop ended or did not serve
                the request within ``COMMIT_WAIT`` seconds.
        """
        def commit(offset: int) -> None:
            done: Future[None] = Future()
            self._requests.put((topic, partition, offset, done))
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

    def serve(self, consumer: Consumer) -> None:
        """Commit every queued offset in one synchronous request (poll thread only)."""
        requests: list[_Request] = []
        while True:
            try:
                requests.append(self._requests.get_nowait())
            except queue.Empty:
                break
        if not requests:
            return
        what = ", ".join(f"{t}[{p}]@{o}" for t, p, o, _ in requests)
        offsets = [TopicPartition(t, p, o) for t, p, o, _ in requests]
        try:
            refused = retry(lambda: consumer.commit(offsets), COMMIT_POLICY,
                            what=f"commit {what}")
        except ReplicatorError as e:
            for *_, done in requests:
                done.set_exception(e)
            return
        for t, p, _o, done in requests:
            err = refused.get((t, p))
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(err)

    def close(self) -> None:
        """Nobody serves commits any more: waiting and later requests fail at once."""
        self._closed.set()
