"""Source consumer-group offsets exported to S3, so a failover can translate them.

Every ``[egress.group_export] interval`` egress reads the committed offsets of the source
cluster's consumer groups (those ``include``/``exclude`` select; never egress's own group)
and writes, for each replicated topic a group committed offsets for, one object
``{prefix}/{region}/{topic}/_groups/{group}.json`` (``replicator.core.wire.GroupExport``;
docs/failover.md). The objects travel to the destination region with the segments, through
the same bucket replication or ``replicator sync``.

* An object is written only when the group's offsets for that topic, or the topic's id,
  changed (PUTs cost), checked against what this process wrote, or on its first round
  against what the bucket holds: a topic deleted and created again whose group commits the
  same offsets gets an export naming the new id (the earlier one's stays for no other).
* With several egress members, the member that owns partition 0 of a topic writes that
  topic's objects: each topic has one writer, and a rebalance at worst makes two members
  write the same offsets once.
* A group whose offsets are gone from the source (expired, deleted) keeps its last object:
  what it had consumed is still what a failover needs.
* A group at rest past the source's last record (a transactional source: its consumers
  commit past the final commit marker, last record + 2) gets ``no_records_from``: the
  position after the last record, when this member read every position up to the group's
  offset and found no record there (``PollLoop.tails``). The destination then knows the
  group is at the end of the records (``replicator groups``: ``synced``, not ``waiting for
  data`` for ever). Only the partitions this member consumes are known.

``plan_exports`` is the pure decision; ``GroupExporter`` does the I/O on an egress pool
thread, never on the poll thread.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from egress.metrics import EgressMetrics
from replicator.core.errors import ObjectNotFound, ReplicatorError
from replicator.core.keys import group_export_key
from replicator.core.settings import GroupExportSettings
from replicator.core.storage import ObjectStore
from replicator.core.wire import GroupExport

log = logging.getLogger(__name__)

GroupOffsets = Mapping[tuple[str, int], int]
"""A group's committed offsets: ``(topic, partition) -> offset``."""


class GroupAdmin(Protocol):
    """The part of the Kafka seam's ``Admin`` the export needs."""

    def list_groups(self) -> list[str]: ...

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]: ...


@dataclass(frozen=True)
class GroupFilter:
    """Which group ids are exported: whole-id matches of ``include`` minus ``exclude``,
    never one of ``never`` (egress's own group).
    """

    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]
    never: frozenset[str]

    @classmethod
    def of(cls, include: Sequence[str], exclude: Sequence[str],
           never: Collection[str] = ()) -> GroupFilter:
        """Compile the patterns (validated by the settings)."""
        return cls(tuple(map(re.compile, include)), tuple(map(re.compile, exclude)),
                   frozenset(never))

    def wants(self, group: str) -> bool:
        """True if ``group``'s offsets are exported."""
        return (group not in self.never
                and any(p.fullmatch(group) for p in self.include)
                and not any(p.fullmatch(group) for p in self.exclude))


def plan_exports(offsets: Mapping[str, GroupOffsets], topics: Collection[str]
                 ) -> dict[tuple[str, str], dict[int, int]]:
    """``(topic, group) -> {partition: offset}`` for every group that committed offsets for
    one of ``topics``; other topics' commits are left out.
    """
    out: dict[tuple[str, str], dict[int, int]] = {}
    for group, committed in offsets.items():
        for (topic, partition), offset in committed.items():
            if topic in topics:
                out.setdefault((topic, group), {})[partition] = offset
    return out


class GroupExporter:
    """Reads the selected groups' offsets and writes the changed exports.

    Args:
        admin: the source cluster's group administration.
        store: this region's bucket.
        prefix: the data key prefix (``[s3] prefix``).
        region: this (the source) region.
        settings: ``[egress.group_export]``.
        own_group: egress's consumer group, never exported.
        metrics: egress's metrics.
        wall: the wall clock of ``exported_at``.
        tails: per partition this member consumes, ``(next offset, consumer position)``:
            no position between them holds a record it copies (``PollLoop.tails``).
        topic_ids: a source topic's id now (``TopicMetadataPublisher.topic_id``), written
            with the offsets; read before and after them, and a topic whose id changed
            between (deleted and created again) waits for the next round.
    """

    def __init__(self, admin: GroupAdmin, store: ObjectStore, *, prefix: str, region: str,
                 settings: GroupExportSettings, own_group: str, metrics: EgressMetrics,
                 wall: Callable[[], datetime],
                 tails: Callable[[], Mapping[tuple[str, int], tuple[int, int]]] = dict,
                 topic_ids: Callable[[str], str | None] | None = None) -> None:
        self.admin = admin
        self.store = store
        self.prefix = prefix
        self.region = region
        self.settings = settings
        self.filter = GroupFilter.of(settings.include, settings.exclude, (own_group,))
        self.m = metrics
        self.wall = wall
        self.tails = tails
        self.topic_ids = topic_ids
        self._written: dict[tuple[str, str],
                            tuple[dict[int, int], dict[int, int], str | None]] = {}
        """What the bucket holds per (topic, group), as far as this process knows: offsets,
        ``no_records_from`` and the topic id they were read for."""

    def _ids(self, topics: Collection[str]) -> dict[str, str | None]:
        """Each topic's id now (``None`` without ids); a topic whose id cannot be read is
        left out (its groups wait for the next round).
        """
        if self.topic_ids is None:
            return dict.fromkeys(topics)
        out: dict[str, str | None] = {}
        for t in topics:
            try:
                out[t] = self.topic_ids(t)
            except ReplicatorError as e:
                log.warning("group export: the id of %s could not be read, trying again in "
                            "%s: %s", t, self.settings.interval, e)
        return out

    def export(self, topics: Collection[str]) -> int:
        """One round for ``topics`` (those this member writes); returns objects written.

        Failures are logged and counted, never raised: the next round tries again.
        """
        if not topics:
            return 0
        try:
            groups = [g for g in self.admin.list_groups() if self.filter.wants(g)]
        except ReplicatorError as e:
            log.warning("group export: listing the source's consumer groups failed, trying "
                        "again in %s: %s", self.settings.interval, e)
            self.m.group_export_failures.labels(self.region).inc()
            return 0
        ids_before = self._ids(topics)
        offsets: dict[str, GroupOffsets] = {}
        for group in groups:
            try:
                offsets[group] = self.admin.group_offsets(group)
            except ReplicatorError as e:
                log.warning("group export: offsets of group %r could not be read, trying "
                            "again in %s: %s", group, self.settings.interval, e)
                self.m.group_export_failures.labels(self.region).inc()
        ids = self._ids(topics)
        plan = {k: v for k, v in plan_exports(offsets, topics).items()
                if ids.get(k[0], "?") == ids_before.get(k[0], "!")}
        self.m.groups_exported.labels(self.region).set(len({g for _, g in plan}))
        tails = self.tails()
        written = 0
        for (topic, group), committed in sorted(plan.items()):
            known = self._known(topic, group, ids[topic])
            empty = at_rest(topic, committed, tails, known)
            if known == (committed, empty):
                continue
            body = GroupExport(group, topic, self.region, committed, self.wall(), empty,
                               ids[topic])
            key = group_export_key(self.prefix, self.region, topic, group)
            try:
                self.store.put(key, body.encode())
            except ReplicatorError as e:
                log.warning("group export: writing %s failed, trying again in %s: %s", key,
                            self.settings.interval, e)
                self.m.group_export_failures.labels(self.region).inc()
                continue
            self._written[(topic, group)] = (committed, empty, ids[topic])
            self.m.group_exports.labels(self.region, topic).inc()
            written += 1
            log.debug("exported %s's offsets of %s: %s", group, topic, committed)
        return written

    def _known(self, topic: str, group: str, topic_id: str | None
               ) -> tuple[dict[int, int], dict[int, int]] | None:
        """What the bucket holds for the topic with id ``topic_id`` (first look: read the
        object); ``None``: nothing readable, or an export of another incarnation of the
        topic (its offsets and ``no_records_from`` are not this one's).
        """
        cached = self._written.get((topic, group))
        if cached is None:
            key = group_export_key(self.prefix, self.region, topic, group)
            try:
                export = GroupExport.parse(self.store.get(key), where=key)
            except ObjectNotFound:
                return None
            except (ReplicatorError, ValueError) as e:
                log.warning("group export: %s is unreadable, writing it again: %s", key, e)
                return None
            cached = (export.offsets, export.no_records_from, export.topic_id)
            self._written[(topic, group)] = cached
        offsets, no_records_from, exported_id = cached
        return (offsets, no_records_from) if exported_id == topic_id else None


def at_rest(topic: str, committed: Mapping[int, int],
            tails: Mapping[tuple[str, int], tuple[int, int]],
            known: tuple[dict[int, int], dict[int, int]] | None) -> dict[int, int]:
    """``no_records_from`` of a group's export: per partition whose committed offset lies
    past the last record, in a run of positions egress read and found without records, the
    first position of that run. What an earlier export said for the same offset stays (a
    fact about the log, true for good, even after this member lost the partition).
    """
    out: dict[int, int] = {}
    if known is not None:
        out = {p: n for p, n in known[1].items()
               if p in committed and known[0].get(p) == committed[p]}
    for p, offset in committed.items():
        tail = tails.get((topic, p))
        if tail is not None and tail[0] < offset <= tail[1]:
            out[p] = tail[0]
    return out
