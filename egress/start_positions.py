"""Where each newly assigned partition is fetched from (``_start_positions``): its
committed offset when that is the live topic's (``own_incarnation``), else where the
bucket's archive of it ends, else the topic's ``start`` (oldest record, end of the log, or
a time), resolved to an offset at once.

``StartPositions`` is a part of ``egress.controller.Egress`` (the attributes and the methods it
names are the controller's), kept apart so that each module stays small.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from egress.commits import of_another_topic
from egress.topic_meta import TopicMetadataPublisher
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import OFFSET_BEGINNING, OFFSET_INVALID, Admin, Consumer, TopicPartition
from replicator.core.keys import PartitionRef
from replicator.core.settings import EgressSettings, Settings

# The controller's logger: these lines keep the logger name they had before this part moved
# out of egress/controller.py (operators filter on it; docs/runbooks.md shows it).
log = logging.getLogger("egress.controller")


def own_incarnation(tp: TopicPartition, live_id: str | None) -> TopicPartition:
    """``tp`` as a commit of the live topic: a commit whose metadata names another topic id
    (``egress.commits.TOPIC_ID``: the topic was deleted and created again, and the commit
    is the earlier topic's, which Kafka may keep or a member may have made after the
    recreate) is no commit at all, so the new topic starts from where the bucket says
    (its oldest record) instead of at the earlier topic's position.
    """
    if tp.offset < 0 or not of_another_topic(tp.metadata, live_id):
        return tp
    log.warning("%s[%d]: the committed offset %d is the earlier topic's (%s; the topic is "
                "%s now): ignored", tp.topic, tp.partition, tp.offset, tp.metadata, live_id)
    return TopicPartition(tp.topic, tp.partition, OFFSET_INVALID)


class StartPositions:
    """The start positions of ``egress.controller.Egress`` (a part of it)."""

    settings: Settings
    config: EgressSettings
    region: str
    _admin: Admin | None
    _meta: TopicMetadataPublisher | None

    def _topic_ids(self, topics: set[str]) -> dict[str, str]:
        """The ids of newly assigned topics, read now so a segment of records read before
        a topic was deleted and created again is named by the id they came from (one the
        read misses is read before the partition's first segment is named instead).
        """
        if self._meta is None:
            return {}
        out: dict[str, str] = {}
        for topic in sorted(topics):
            try:
                tid = self._meta.topic_id(topic)
            except ReplicatorError as e:
                log.warning("%s: topic id not read at assignment (read again before its "
                            "first segment): %s", topic, e)
                continue
            if tid is not None:
                out[topic] = tid
        return out

    def _start_positions(self, consumer: Consumer, committed: Sequence[TopicPartition],
                         topic_ids: Mapping[str, str]
                         ) -> tuple[dict[tuple[str, int], int], set[tuple[str, int]],
                                    set[tuple[str, int]]]:
        """Where each partition is fetched from: its committed offset; without one, where
        its archive ends when the bucket holds its history (the group's offsets expired or
        were deleted, a start commit never landed: ``TopicMetadataPublisher.
        archived_start``), the oldest record of a topic recreated since it was archived,
        else what the topic's ``start`` says (oldest record, end of the log, or the first
        record at or after a time; a partition added to the topic after egress first
        started it always from its oldest record). Also returned: the partitions whose
        start was chosen here from ``latest`` or a time, which the caller commits at once,
        and those resuming from the archive.

        Those starts are resolved to offsets now, never left to the client as "the end":
        a partition that moved to another member, or a process that restarted, before
        the first segment's commit would otherwise start again at the *then* end and
        silently pass every record produced in between.
        """
        start: dict[tuple[str, int], int] = {}
        by_time: list[TopicPartition] = []
        at_end: list[tuple[str, int]] = []
        archived: set[tuple[str, int]] = set()
        for tp in committed:
            key = (tp.topic, tp.partition)
            if tp.offset >= 0:
                start[key] = tp.offset
                continue
            how = self._uncommitted_start(tp.topic, tp.partition, topic_ids.get(tp.topic))
            if isinstance(how, int):
                start[key] = how
                archived.add(key)
            elif how == "earliest":
                start[key] = OFFSET_BEGINNING
            elif how == "latest":
                at_end.append(key)
            else:
                ms = int(how.timestamp() * 1000)
                by_time.append(TopicPartition(tp.topic, tp.partition, ms))
        if by_time:
            self._at_times(consumer, by_time, start, at_end)
        if at_end:
            assert self._admin is not None
            for (topic, partition), end in self._admin.log_ends(at_end, timeout=30).items():
                start[(topic, partition)] = end
                log.warning("%s[%d]: no committed offset; starting at offset %d, the end of "
                            "the log (start): records before are not copied",
                            topic, partition, end)
        return start, {(tp.topic, tp.partition) for tp in by_time} | set(at_end), archived

    def _at_times(self, consumer: Consumer, by_time: Sequence[TopicPartition],
                  start: dict[tuple[str, int], int], at_end: list[tuple[str, int]]) -> None:
        """Resolve time starts into ``start``; a partition with no record at or after its
        time goes to ``at_end`` (the end of its log).
        """
        for tp in consumer.offsets_for_times(by_time, timeout=30):
            when = self.config.topic_settings(tp.topic).start
            if tp.offset < 0:
                at_end.append((tp.topic, tp.partition))
                continue
            start[(tp.topic, tp.partition)] = tp.offset
            log.warning("%s[%d]: no committed offset; starting at offset %d, the first "
                        "record at or after %s (start): records before are not copied",
                        tp.topic, tp.partition, tp.offset, when)

    def _uncommitted_start(self, topic: str, partition: int, topic_id: str | None
                           ) -> int | Literal["earliest", "latest"] | datetime:
        """Where a partition without a commit starts: where its archive ends (an offset),
        else the oldest record of a recreated topic, else ``_start_of``.
        """
        resume = self._archived_start(topic, partition, topic_id)
        if resume is None:
            return self._start_of(topic, partition)
        return resume

    def _archived_start(self, topic: str, partition: int, topic_id: str | None
                        ) -> int | Literal["earliest"] | None:
        """``TopicMetadataPublisher.archived_start``, logged (no publisher: nothing)."""
        if self._meta is None:
            return None
        ref = PartitionRef(self.settings.s3.prefix, self.region, topic, partition)
        resume = self._meta.archived_start(ref, topic_id)
        if resume == "earliest":
            log.warning("%s[%d]: no committed offset, and the topic was deleted and created "
                        "again since it was archived: the new topic is copied from its oldest "
                        "record", topic, partition)
        elif resume is not None:
            log.warning("%s[%d]: no committed offset (the group's offsets expired or were "
                        "deleted, or a start commit never landed), but its history is in the "
                        "bucket: resuming where the archive ends, at offset %d",
                        topic, partition, resume)
        return resume

    def _start_of(self, topic: str, partition: int
                  ) -> Literal["earliest", "latest"] | datetime:
        """The ``start`` that applies to a partition without a commit: the topic's, but
        ``earliest`` for a partition added to the topic after egress first started it
        (``TopicMetadataPublisher.added_later``).
        """
        how = self.config.topic_settings(topic).start
        if how == "earliest" or self._meta is None or \
                not self._meta.added_later(topic, partition):
            return how
        log.warning("%s[%d]: no committed offset, and the partition was added to the topic "
                    "after egress first started it: copied from its oldest record (start = "
                    "%s applies to the partitions the topic had then)", topic, partition, how)
        return "earliest"
