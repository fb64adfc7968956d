"""The topic id of each epoch of one partition writer, and where its segments go.

A partition writer's *epoch* moves on at each reset (the source partition's offsets went
back: the topic was deleted and created again). Each epoch's segments belong to the topic
id read for it: at assignment, when the reset is seen, or (when neither read one) when its
first segment is named. ``EpochIds`` keeps those ids, when each was read (the topic existed
then: its place in the chain), and names a segment's incarnation through the topic
metadata publisher (``egress.topic_meta``), passing the ids read after its epoch's so an
incarnation recorded late still goes before them (docs/architecture.md, "Topic
incarnations").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Protocol, TypeVar

from replicator.core.clock import Clock
from replicator.core.errors import ReplicatorError, RetriableError
from replicator.core.keys import PartitionRef

log = logging.getLogger(__name__)

T = TypeVar("T")


class IncarnationChanged(ReplicatorError):
    """The topic id when a segment is named is not its epoch's."""

    def __init__(self, was: str, now: str) -> None:
        super().__init__(f"topic id is {now}, was {was}")
        self.was = was
        self.now = now


class Incarnations(Protocol):
    """``egress.topic_meta.TopicMetadataPublisher``: topic ids and their key locations."""

    def topic_id(self, topic: str) -> str | None: ...
    def incarnation(self, topic: str, topic_id: str, *, later: Collection[str] = (),
                    seen_at: datetime | None = None) -> str: ...
    def seal(self, ref: PartitionRef, start: int) -> None: ...
    def has_incarnations(self, topic: str) -> bool: ...


class Retry(Protocol):
    """The writer's retry of one step (``PartitionWriter._retry``)."""

    def __call__(self, fn: Callable[[], T], what: str) -> T: ...


class EpochIds:
    """The topic ids of one partition writer's epochs.

    Args:
        topic: the source topic.
        name: the writer's name for log lines.
        incarnations: the publisher (``None``: no ids, every segment at the documented
            key shape).
        wall: when an id is read.
        retry: retries a read or a record.
        topic_id: the id read at assignment for epoch 0 (``None``: read later).
    """

    def __init__(self, topic: str, name: str, incarnations: Incarnations | None, *,
                 wall: Clock, retry: Retry, topic_id: str | None = None) -> None:
        self.topic = topic
        self.name = name
        self.inc = incarnations
        self.wall = wall
        self.retry = retry
        self.ids: dict[int, str | None] = {}
        """The topic id of each epoch, once read (workers; the poll thread at a reset)."""
        self.seen_at: dict[int, datetime] = {}
        """When each epoch's id was read: its topic existed then (creation order)."""
        if topic_id is not None:
            self.record(0, topic_id)

    def get(self, epoch: int) -> str | None:
        """The id of ``epoch`` (``None``: not read yet, or none)."""
        return self.ids.get(epoch)

    def record(self, epoch: int, topic_id: str) -> None:
        """``topic_id`` was read for ``epoch`` now."""
        self.ids[epoch] = topic_id
        self.seen_at.setdefault(epoch, self.wall())

    def later(self, epoch: int) -> set[str]:
        """The ids read for epochs after ``epoch``: later topics'."""
        return {t for e, t in self.ids.items() if e > epoch and t is not None}

    def read_at_reset(self, epoch: int) -> None:
        """The id of a new epoch, read when the reset is seen (poll thread): read only when
        its first segment is named, a topic created once more meanwhile would give this
        epoch's records the later topic's id and location. A failed read is left to the
        naming (WARNING).
        """
        if self.inc is None:
            return
        try:
            tid = self.inc.topic_id(self.topic)
        except ReplicatorError as e:
            log.warning("%s: the topic id after the reset was not read (read when the "
                        "segment is named): %s", self.name, e)
            return
        if tid is not None:
            self.record(epoch, tid)

    def now(self) -> str | None:
        """The topic id now (retried).

        Raises:
            ReplicatorError: the describe failed for good.
        """
        assert self.inc is not None
        inc = self.inc
        return self.retry(lambda: inc.topic_id(self.topic),
                          f"{self.name}: read the topic id again")

    def of(self, epoch: int, later: Collection[str] = ()) -> tuple[str | None, str]:
        """The topic id of an epoch (read once per epoch) and its key location (worker
        thread), recorded in the chain before the ids ``later`` names. Without ids (none
        known to the broker, or not asked): ``(None, "")``, the documented key shape.

        Raises:
            IncarnationChanged: the epoch's id was never read and a later one's was.
            RetriableError: the topic has no id now while one was known (the segment
                waits).
            ReplicatorError: S3 or the describe failed.
        """
        inc = self.inc
        if inc is None:
            return None, ""
        ids = self.ids
        if epoch not in ids and any(e > epoch and t is not None for e, t in ids.items()):
            # Its id was never read (a failed describe at assignment) and a later epoch's
            # was: the id now is the later topic's, never this epoch's.
            now = ids[max(ids)]
            assert now is not None
            raise IncarnationChanged("an unknown id", now)
        if epoch not in ids:
            tid = self.retry(lambda: inc.topic_id(self.topic),
                             f"{self.name}: read the topic id")
            ids[epoch] = tid
            self.seen_at.setdefault(epoch, self.wall())
        topic_id = ids[epoch]
        if topic_id is None and any(t is not None for t in ids.values()):
            # The topic is gone (deleted, not created again yet): its location is unknown,
            # and the documented shape may hold another incarnation's segments.
            del ids[epoch]
            raise RetriableError(f"{self.name}: the source topic has no id now (deleted?); "
                                 "the segment waits for it")
        if topic_id is None:
            if self.retry(lambda: inc.has_incarnations(self.topic),
                          f"{self.name}: read the incarnations"):
                # The documented shape is the first incarnation's: a topic with no id now
                # (deleted, or a describe that gave none) must not write there.
                del ids[epoch]
                raise RetriableError(f"{self.name}: the source topic has no id now while "
                                     "_topic.json lists incarnations; the segment waits")
            return None, ""
        seen = self.seen_at.get(epoch)
        label = self.retry(lambda: inc.incarnation(self.topic, topic_id,
                                                   later=[t for t in later if t != topic_id],
                                                   seen_at=seen),
                           f"{self.name}: record incarnation {topic_id}")
        return topic_id, label
