"""Where a source partition's segment history begins, from the source's ``_topic.json``.

An egress that records first positions writes ``first_positions`` in ``_topic.json``
(docs/architecture.md, "Topic metadata") before the partition's first segment. A replay
without a checkpoint then starts at exactly that position: a first segment that reaches
the destination bucket after later ones (S3 replication keeps no order) is waited for like
any gap, and ``lost_segment_timeout`` is the only way to give up.

``FirstPosition.get`` returns:

* ``NOT_RECORDED``: the file has no ``first_positions`` (an older egress) or the source is
  configured ``start = "earliest-available"``: the ``first_segment_delay`` behaviour;
* ``PENDING``: the map is there but this partition's entry is not yet, or there is no
  ``_topic.json`` at all (``absent``: egress writes it before any segment, so it is still
  replicating: segments copied by the low-RPO mirror or replicated out of order can
  arrive first). Wait; the file is read again every ``RECHECK`` seconds while waiting;
  the worker gives up, ``give_up``, once the partition's segments have waited
  ``first_segment_delay`` (``lost_segment_timeout`` while the file is absent or older
  than the partition's first segment: ``ingress.start_point``);
* the position (an int): never changes once known.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Final, Literal

from ingress.topic_meta_cache import TopicMetaCache
from replicator.core.keys import PartitionRef
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import read_topic_meta

NOT_RECORDED: Final = "not-recorded"
PENDING: Final = "pending"
RECHECK = 2.0
"""Seconds between reads of ``_topic.json`` while a partition's entry is pending."""

Known = int | Literal["not-recorded", "pending"]


class FirstPosition:
    """The first position of one source partition, read lazily and cached once known."""

    def __init__(self, store: ObjectStore, ref: PartitionRef, *, enabled: bool,
                 monotonic: Callable[[], float] = time.monotonic,
                 cache: TopicMetaCache | None = None) -> None:
        self.store = store
        self._cache = cache
        """The process's workers share one read per ``RECHECK`` (``None``: read alone)."""
        self.ref = ref
        self.enabled = enabled
        self._monotonic = monotonic
        self._known: Known | None = None
        self._read_at = float("-inf")
        self.written_at: datetime | None = None
        """``updated_at`` of the ``_topic.json`` read last (``None``: none, or not said)."""
        self.absent = False
        """The last read found no ``_topic.json`` (the entry is ``PENDING``)."""

    def get(self) -> Known:
        """What is known now (reads ``_topic.json`` at most every ``RECHECK`` s).

        Raises:
            ReplicatorError: the file cannot be read or parsed (the session retries).
        """
        if not self.enabled:
            return NOT_RECORDED
        if self._known is not None and self._known != PENDING:
            return self._known
        now = self._monotonic()
        if self._known == PENDING and now - self._read_at < RECHECK:
            return PENDING
        self._read_at = now
        ref = self.ref
        meta = read_topic_meta(self.store, ref.prefix, ref.region, ref.topic) \
            if self._cache is None else self._cache.read(ref.prefix, ref.region, ref.topic)
        self.written_at = None if meta is None else meta.updated_at
        self.absent = meta is None
        known: Known
        if meta is None:
            known = PENDING
        elif meta.first_positions is None:
            known = NOT_RECORDED
        else:
            known = meta.first_positions.get(ref.partition, PENDING)
        self._known = known
        return known

    def give_up(self) -> None:
        """The entry is not coming (``ReplayWorker._first_position_overdue``): from now on
        the partition is replayed as if egress recorded no first positions.
        """
        self._known = NOT_RECORDED

    def seconds_to_recheck(self) -> float:
        """How long a pending wait lasts before the next read."""
        return max(0.0, RECHECK - (self._monotonic() - self._read_at))
