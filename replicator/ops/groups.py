"""``replicator groups show|sync``: source consumer groups translated into the destination.

Inputs, all in the destination region (docs/failover.md):

* the groups' committed source offsets, exported by egress next to the data
  (``{prefix}/{region}/{topic}/_groups/{group}.json``);
* the offset map ingress wrote with the records (``replicator.core.offset_map``);
* how far each source partition is replicated (the ingress checkpoints);
* the destination cluster's groups: members and committed offsets.

``plan_group`` decides, per partition, what to commit (pure); ``sync`` commits it:

* never for a group with members in the destination (a live consumer is never disturbed:
  ``skipped: active``);
* never backwards (a destination commit at or past the translation is kept);
* never past the replicated data: a group ahead of replication moves as far as the data
  (``waiting for data``) and follows as replication catches up; a group whose offset is past
  the source's last record (a transactional source's final commit marker: last record + 2)
  is at the replicated end once that record is replicated (the export's
  ``no_records_from``), so it is ``synced`` there, not waiting for ever;
* never for a destination topic fed by several sources (aggregation: one destination
  offset cannot stand for several sources' positions) or a partition the map does not
  cover (``unmapped``, with the reason);
* never for a destination topic with producers of its own (active-active: ``[ingress]
  mark_origin``): the map places the replicated records, not the local ones between them,
  so the translation is not exact (``not exact: local writes``), whatever the destination
  group's offset;
* only through the offset-map entries of the destination topic's current incarnation and
  newest replay (``live_entries``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from replicator.core.errors import KeyFormatError, ReplicatorError
from replicator.core.kafka import read_to_end
from replicator.core.keys import (
    group_exports_prefix,
    incarnation_label,
    parse_group_export_key,
)
from replicator.core.metrics import Metrics, build_info
from replicator.core.offset_map import (
    MapPartition,
    OffsetMapEntry,
    Translation,
    live_entries,
    of_source,
    parse_map_key,
    translate,
)
from replicator.core.settings import IngressSettings, IngressSourceSettings, KafkaSettings
from replicator.core.storage import ObjectStore
from replicator.core.wire import Checkpoint, GroupExport, TopicMetadata, checkpoint_key
from replicator.ops.checkpoints import configured_sources

log = logging.getLogger(__name__)

SYNCED = "synced"
TO_SYNC = "to sync"
WAITING = "waiting for data"
ACTIVE = "skipped: active"
AHEAD = "kept: destination ahead"
UNMAPPED = "unmapped"
AGGREGATED = "skipped: several sources"
LOCAL_WRITES = "not exact: local writes"
REFUSED = "refused"
"""``after_sync``: the broker refused the group's commit (the row keeps the error)."""


class GroupsAdmin(Protocol):
    """The destination cluster's group administration (the Kafka seam's ``Admin``)."""

    def group_members(self, group: str) -> int: ...

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]: ...

    def alter_group_offsets(self, group: str,
                            offsets: Mapping[tuple[str, int], int]) -> None: ...

    def topic_id(self, topic: str) -> str | None: ...


@dataclass(frozen=True)
class GroupRow:
    """One group and source partition."""

    group: str
    region: str
    topic: str
    partition: int
    destination_topic: str
    source_committed: int
    translated: int | None
    replicated_to: int | None
    destination_committed: int | None
    state: str
    commit: int | None = None
    """What ``sync`` commits (``None``: nothing)."""
    reason: str = ""
    """Why the row is not exact (``unmapped``, ``not exact: local writes``, ``refused``)."""

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "region": self.region, "topic": self.topic,
                "partition": self.partition, "destination_topic": self.destination_topic,
                "source_committed": self.source_committed, "translated": self.translated,
                "replicated_to": self.replicated_to,
                "destination_committed": self.destination_committed, "state": self.state,
                "reason": self.reason}


def read_exports(store: ObjectStore, prefix: str, ingress: IngressSettings
                 ) -> list[GroupExport]:
    """Every exported group of the configured sources found in the bucket (unreadable
    objects raise: an operator should see them).
    """
    out = []
    for src in configured_sources(ingress, prefix, store):
        for info in store.list(group_exports_prefix(prefix, src.region, src.name)):
            if parse_group_export_key(info.key) is not None:
                out.append(GroupExport.parse(store.get(info.key), where=info.key))
    return out


def read_offset_map(kafka: KafkaSettings, topic: str, *, timeout: float = 60.0
                    ) -> dict[MapPartition, list[OffsetMapEntry]]:
    """The offset-map topic read to its end (read_committed; a tombstone removes its key).

    Raises:
        TopicError: the topic does not exist.
        ValueError: an entry cannot be parsed (naming its key).
    """
    latest: dict[str, bytes | None] = {}
    for msg in read_to_end(kafka, topic, timeout=timeout, what="offset-map topic"):
        raw = msg.key()
        if raw is not None:
            latest[raw.decode("utf-8", "replace")] = msg.value()
    pairs = []
    for name, value in latest.items():
        parsed = parse_map_key(name)
        if parsed is not None and value is not None:
            pairs.append((parsed[0], OffsetMapEntry.decode(value, where=f"{topic} {name}")))
    return map_by_partition(pairs)


def map_by_partition(entries: Iterable[tuple[MapPartition, OffsetMapEntry]]
                     ) -> dict[MapPartition, list[OffsetMapEntry]]:
    """The map's entries grouped per partition and sorted."""
    out: dict[MapPartition, list[OffsetMapEntry]] = defaultdict(list)
    for part, entry in entries:
        out[part].append(entry)
    for v in out.values():
        v.sort()
    return dict(out)


def plan_group(export: GroupExport, destination: str, *, members: int,
               destination_committed: Mapping[tuple[str, int], int],
               entries: Mapping[MapPartition, Sequence[OffsetMapEntry]],
               replicated: Mapping[int, int], aggregated: bool,
               local_writes: bool = False, unmapped: Mapping[int, str] | None = None
               ) -> list[GroupRow]:
    """The rows of one exported group for one source (see the module docstring).

    Args:
        export: the group's exported source offsets for the source topic.
        destination: the source's destination topic.
        members: the group's members in the destination cluster now.
        destination_committed: the group's committed offsets in the destination.
        entries: the offset map's live entries (``live_entries``), per partition.
        replicated: per partition, the next source position ingress replays.
        aggregated: the destination topic has several sources.
        local_writes: the destination topic has producers of its own (active-active).
        unmapped: partitions that cannot be translated, with the reason (the group's
            offsets belong to another incarnation of the source topic than the one
            replicated now).
    """
    rows = []
    for p, committed in sorted(export.offsets.items()):
        part = (export.region, export.topic, p, destination)
        done = replicated.get(p)
        current = destination_committed.get((destination, p))
        why = (unmapped or {}).get(p)
        t = translate(entries.get(part, ()), committed, done) if why is None \
            else Translation(None, "unmapped", why)
        empty_from = export.no_records_from.get(p)
        if t.state == "waiting" and done is not None and empty_from is not None \
                and empty_from <= done:
            # At rest past the last record (a transactional source's final commit marker):
            # every record below the group's offset is replicated, so the replicated end
            # is exactly where it resumes.
            t = translate(entries.get(part, ()), done, done)
        commit = None
        reason = ""
        if aggregated:
            state = AGGREGATED
        elif t.offset is None:
            state, reason = UNMAPPED, t.reason
        elif local_writes:
            state = LOCAL_WRITES
            reason = (f"{destination} has producers of its own ([ingress] mark_origin: "
                      "active-active): the map places the replicated records, not the local "
                      "ones between them, which the group may or may not have read")
        elif members:
            state = ACTIVE
        elif current is not None and current >= t.offset:
            state = (WAITING if t.state == "waiting" else SYNCED) if current == t.offset \
                else AHEAD
        else:
            state = WAITING if t.state == "waiting" else TO_SYNC
            commit = t.offset
        rows.append(GroupRow(export.group, export.region, export.topic, p, destination,
                             committed, t.offset, done, current, state, commit, reason))
    return rows


def plan(exports: Sequence[GroupExport], sources: Sequence[IngressSourceSettings],
         admin: GroupsAdmin, entries: Mapping[MapPartition, Sequence[OffsetMapEntry]],
         checkpoints: Mapping[str, Checkpoint], *, local_writes: bool = False,
         source_meta: Callable[[str, str], TopicMetadata | None] | None = None
         ) -> list[GroupRow]:
    """Rows for every exported group of ``sources`` (named, and those ``topic_pattern``
    entries select now: ``configured_sources``).

    ``checkpoints`` must be read before ``entries``: the map then covers at least what the
    checkpoints say is replicated (a map read first could end below them). ``local_writes``:
    the destination topics have producers of their own (``[ingress] mark_origin``).
    ``source_meta``: a source's ``_topic.json`` (``(region, topic)``), which names the
    incarnations of a topic deleted and created again; offsets are translated only through
    the entries of their own incarnation, and only while replication is in it.
    """
    by_source = {(s.region, s.name): s.destination for s in sources}
    fan_in: dict[str, int] = defaultdict(int)
    for destination in by_source.values():
        fan_in[destination] += 1
    rows: list[GroupRow] = []
    incarnations: dict[str, str | None] = {}
    live: dict[tuple[MapPartition, str], list[OffsetMapEntry]] = {}

    def live_of(part: MapPartition, source_label: str) -> list[OffsetMapEntry]:
        if part[3] not in incarnations:
            incarnations[part[3]] = admin.topic_id(part[3])
        if (part, source_label) not in live:
            live[(part, source_label)] = live_entries(
                of_source(entries.get(part, ()), source_label), incarnations[part[3]])
        return live[(part, source_label)]

    members: dict[str, int] = {}
    committed: dict[str, dict[tuple[str, int], int]] = {}
    for export in sorted(exports, key=lambda e: (e.group, e.region, e.topic)):
        dest = by_source.get((export.region, export.topic))
        if dest is None:
            continue
        if export.group not in members:
            members[export.group] = admin.group_members(export.group)
            committed[export.group] = admin.group_offsets(export.group)
        label = export_incarnation(export, None if source_meta is None
                                   else source_meta(export.region, export.topic))
        replicated, unmapped, mine = _inputs(export, dest, label, checkpoints, live_of)
        rows += plan_group(export, dest, members=members[export.group],
                           destination_committed=committed[export.group], entries=mine,
                           replicated=replicated, aggregated=fan_in[dest] > 1,
                           local_writes=local_writes, unmapped=unmapped)
    return rows


def _inputs(export: GroupExport, dest: str, label: str | None,
            checkpoints: Mapping[str, Checkpoint],
            live_of: Callable[[MapPartition, str], list[OffsetMapEntry]]
            ) -> tuple[dict[int, int], dict[int, str], dict[MapPartition, list[OffsetMapEntry]]]:
    """Per partition of ``export``: the replicated position, why it cannot be translated
    (another incarnation), and the live entries of its own incarnation.
    """
    replicated: dict[int, int] = {}
    unmapped: dict[int, str] = {}
    mine: dict[MapPartition, list[OffsetMapEntry]] = {}
    for p in export.offsets:
        cp = checkpoints.get(checkpoint_key(export.region, export.topic, p, dest))
        if cp is not None:
            replicated[p] = cp.offset + 1
        why = other_incarnation(label, "" if cp is None else cp.incarnation)
        if why is not None:
            unmapped[p] = why
        else:
            assert label is not None
            part = (export.region, export.topic, p, dest)
            mine[part] = live_of(part, label)
    return replicated, unmapped, mine


def other_incarnation(label: str | None, replaying: str) -> str | None:
    """Why a partition's offsets of source incarnation ``label`` cannot be translated while
    replication is in ``replaying`` (``None``: they can).
    """
    if label is None:
        return ("the source topic was deleted and created again, and the exported offsets "
                "name no topic id (or one _topic.json does not list): which incarnation "
                "they belong to is unknown")
    if label != replaying:
        return (f"the group's offsets belong to the source topic's incarnation "
                f"{label or 'first'}, replication is in {replaying or 'first'} (the topic "
                "was deleted and created again): never translated through another "
                "incarnation's map")
    return None


def export_incarnation(export: GroupExport, meta: TopicMetadata | None) -> str | None:
    """The label of the source incarnation an export's offsets belong to: ``""`` (the
    first) while the source has one incarnation; the one its topic id names otherwise
    (``None``: unknown).
    """
    incs = () if meta is None else meta.incarnations
    if not incs:
        return ""           # no topic id ever recorded: one incarnation as far as known
    if export.topic_id is not None:
        inc = meta.incarnation(export.topic_id) if meta is not None else None
        return None if inc is None else inc.label
    return "" if len(incs) == 1 else None


def prunable(entries: Mapping[MapPartition, Sequence[OffsetMapEntry]],
             exports: Sequence[GroupExport]) -> list[tuple[MapPartition, int]]:
    """Map entries no exported group can need: of each source incarnation of a partition
    some exported group of that incarnation has committed, those that end before the
    lowest of those commits, except that incarnation's newest entry (``(partition,
    src_first)`` pairs, for tombstones). An incarnation's offsets say nothing about
    another's (a recreated topic starts at 0 again), so entries are never weighed against
    another incarnation's commits. Partitions, or incarnations, no group committed keep
    everything: a group may still be exported for them.
    """
    commits: dict[tuple[str, str, int], list[tuple[str | None, int]]] = defaultdict(list)
    for e in exports:
        for p, offset in e.offsets.items():
            commits[(e.region, e.topic, p)].append((e.topic_id, offset))
    out = []
    for part, items in entries.items():
        found = commits.get(part[:3])
        if not found:
            continue
        by_label: dict[str, list[OffsetMapEntry]] = defaultdict(list)
        for entry in items:
            by_label[entry.source_incarnation].append(entry)
        for label, group in by_label.items():
            lows = [o for tid, o in found if _export_label(tid, set(by_label)) == label]
            if not lows:
                continue
            low = min(lows)
            ordered = sorted(group)
            out += [(part, e.src_first) for e in ordered[:-1] if e.src_last < low]
    return sorted(out)


def _export_label(topic_id: str | None, labels: set[str]) -> str | None:
    """The map label an export's ``topic_id`` stands for among ``labels`` (pure): a later
    incarnation's label is its id; an export without an id (an earlier release), or any
    export while the map holds only the first one's entries, is the first one's
    (``""``); any other id is unknown here
    (``None``: it prunes nothing: the first incarnation's id is not in the map, and a
    newer incarnation's entries may not be written yet).
    """
    if topic_id is None or labels == {""}:
        return ""
    try:
        label = incarnation_label(topic_id)
    except KeyFormatError:
        return None
    return label if label in labels and label != "" else None


def sync(rows: Sequence[GroupRow], admin: GroupsAdmin) -> dict[str, int | ReplicatorError]:
    """Commit what ``rows`` say, one request per group; returns, per group with something
    to commit, how many partitions were committed or the error that refused it (a group
    that gained members meanwhile, say). A refused group never stops the others.
    """
    per_group: dict[str, dict[tuple[str, int], int]] = defaultdict(dict)
    for r in rows:
        if r.commit is not None:
            per_group[r.group][(r.destination_topic, r.partition)] = r.commit
    out: dict[str, int | ReplicatorError] = {}
    for group, offsets in sorted(per_group.items()):
        try:
            admin.alter_group_offsets(group, offsets)
        except ReplicatorError as e:
            log.warning("groups sync: the commit of group %r was refused: %s", group, e)
            out[group] = e
            continue
        out[group] = len(offsets)
    return out


def after_sync(rows: Sequence[GroupRow], done: Mapping[str, int | ReplicatorError] | None = None
               ) -> list[GroupRow]:
    """``rows`` once ``sync`` committed them: each committed partition now stands at its
    commit (``to sync`` becomes ``synced``; ``waiting for data`` stays, as far as the data),
    so no second read of the stores is needed to report the result. A group whose commit
    was refused (``done``) shows ``refused`` with the error.
    """
    out = []
    for r in rows:
        err = (done or {}).get(r.group)
        if r.commit is None:
            out.append(r)
        elif isinstance(err, ReplicatorError):
            out.append(replace(r, commit=None, state=REFUSED, reason=str(err)))
        else:
            out.append(replace(r, destination_committed=r.commit, commit=None,
                               state=SYNCED if r.state == TO_SYNC else r.state))
    return out


class GroupMetrics:
    """What ``groups sync --every`` exports after each round (docs/metrics.md)."""

    def __init__(self, metrics: Metrics) -> None:
        self.registry = metrics
        self.not_synced = metrics.gauge(
            "groups_not_synced", "Partitions of an exported group whose destination offset "
            "is not at its translation (waiting for data, unmapped, several sources), after "
            "the last sync round; partitions the group consumes in the destination are "
            "counted in groups_active_in_destination instead.", ("group",))
        self.active = metrics.gauge(
            "groups_active_in_destination", "Partitions of an exported group that the "
            "group consumes in the destination too (members there), so sync leaves them "
            "alone: a group id used in both regions ([egress.group_export] exclude).",
            ("group",))
        self.lag = metrics.gauge(
            "groups_translation_lag", "Source positions a group has committed beyond what "
            "its destination offset stands for (0 when synced).",
            ("group", "region", "topic", "partition"))
        self.rounds = metrics.counter(
            "groups_sync_rounds_total", "Sync rounds, by outcome (ok, failed).", ("outcome",))
        self.build_info = build_info(metrics, "groups_sync")

    def observe(self, rows: Sequence[GroupRow]) -> None:
        """Set the gauges from the rows of a plan made after the round's commits."""
        behind: dict[str, int] = defaultdict(int)
        active: dict[str, int] = defaultdict(int)
        for r in rows:
            behind[r.group] += r.state not in (SYNCED, ACTIVE)
            active[r.group] += r.state == ACTIVE
            covered = r.source_committed if r.state == SYNCED else (
                r.replicated_to if r.state == WAITING and r.replicated_to is not None else 0)
            self.lag.labels(r.group, r.region, r.topic, str(r.partition)).set(
                max(0, r.source_committed - covered))
        for group, n in behind.items():
            self.not_synced.labels(group).set(n)
            self.active.labels(group).set(active[group])
