"""What ``replicator groups sync`` commits: exact, forward only, never for a live group,
never past the replicated data, never for a destination fed by several sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from replicator.core.errors import KafkaRetriableError
from replicator.core.metrics import Metrics
from replicator.core.offset_map import entries_of, translate
from replicator.core.settings import IngressSettings
from replicator.core.wire import Checkpoint, GroupExport, checkpoint_key
from replicator.ops.groups import (
    ACTIVE,
    AGGREGATED,
    AHEAD,
    LOCAL_WRITES,
    REFUSED,
    SYNCED,
    TO_SYNC,
    UNMAPPED,
    WAITING,
    GroupMetrics,
    GroupRow,
    after_sync,
    plan,
    plan_group,
    prunable,
    sync,
)

NOW = datetime(2026, 11, 23, tzinfo=UTC)
# Source offsets 0..99 of orders[0] with a marker after each 10 (offsets 10, 21, ...): the
# records sit at destination offsets 0.. in batches of 10, each followed by a marker.
SRC = [o for o in range(110) if o % 11 != 10][:100]
ENTRIES = {("eu", "orders", 0, "orders"): [
    e for b in range(10) for e in entries_of(SRC[b * 10:(b + 1) * 10], b * 11)]}


class FakeAdmin:
    def __init__(self, members: int = 0, committed: dict[tuple[str, int], int] | None = None
                 ) -> None:
        self.members = members
        self.committed = dict(committed or {})
        self.altered: list[tuple[str, dict[tuple[str, int], int]]] = []
        self.refuse: set[str] = set()

    def group_members(self, group: str) -> int:
        return self.members

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return dict(self.committed)

    def alter_group_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        if group in self.refuse:
            raise KafkaRetriableError(f"alter offsets of group {group!r}: "
                                      "UNKNOWN_MEMBER_ID (the group has members)")
        self.altered.append((group, dict(offsets)))
        self.committed.update(offsets)

    def topic_id(self, topic: str) -> str | None:
        return "id-1"


def export(offsets: dict[int, int], topic: str = "orders", region: str = "eu"
           ) -> GroupExport:
    return GroupExport("app", topic, region, offsets, NOW)


def rows_for(committed: int, *, replicated: int | None = 200, members: int = 0,
             current: int | None = None, aggregated: bool = False) -> list[GroupRow]:
    return plan_group(export({0: committed}), "orders", members=members,
                      destination_committed={} if current is None else {("orders", 0): current},
                      entries=ENTRIES, replicated={} if replicated is None else {0: replicated},
                      aggregated=aggregated)


def test_a_group_resumes_at_the_record_after_what_it_consumed() -> None:
    # Committed 23: the next source record is offset 23 = SRC[21], the second record of
    # the third batch, which sits at destination 2 * 11 + 1.
    [row] = rows_for(23)
    assert SRC.index(23) == 21
    assert (row.translated, row.state, row.commit) == (23, TO_SYNC, 23)
    # Committed 21 (a marker in the source): the next record is 22 = SRC[20], the first
    # of the third batch, at destination 22 (after the second batch's marker at 21).
    [row] = rows_for(21)
    assert row.translated in (21, 22)     # the marker or the record after it: same reads


def test_states() -> None:
    assert rows_for(50, members=1)[0].state == ACTIVE
    assert rows_for(50, members=1)[0].commit is None
    assert rows_for(50, current=10_000)[0].state == AHEAD
    assert rows_for(50, current=10_000)[0].commit is None
    assert rows_for(50, aggregated=True)[0].state == AGGREGATED
    waiting = rows_for(80, replicated=40)[0]
    assert waiting.state == WAITING and waiting.commit == rows_for(40)[0].commit
    synced = rows_for(50)[0]
    assert rows_for(50, current=synced.translated)[0].state == SYNCED
    assert rows_for(50, current=synced.translated)[0].commit is None
    assert plan_group(export({0: 5}), "orders", members=0, destination_committed={},
                      entries={}, replicated={0: 100}, aggregated=False)[0].state == UNMAPPED


def test_plan_and_sync_commit_forward_once_per_group() -> None:
    ingress = IngressSettings.model_validate({
        "group_id": "ing", "sqs_queue": "q",
        "sources": [{"region": "eu", "topic": "orders", "destination_topic": "orders"},
                    {"region": "eu", "topic": "mix", "destination_topic": "all"},
                    {"region": "us", "topic": "mix", "destination_topic": "all"}]})
    cps = {checkpoint_key("eu", "orders", 0, "orders"): Checkpoint(99, "seg", NOW)}
    admin = FakeAdmin()
    rows = plan([export({0: 50}), export({0: 3}, topic="mix"), export({0: 1}, "other")],
                ingress.sources, admin, ENTRIES, cps)
    assert [(r.topic, r.state) for r in rows] == [("mix", AGGREGATED), ("orders", TO_SYNC)]
    assert sync(rows, admin) == {"app": 1}
    assert admin.altered == [("app", {("orders", 0): rows[1].translated})]
    again = plan([export({0: 50})], ingress.sources, admin, ENTRIES, cps)
    assert again[0].state == SYNCED and sync(again, admin) == {}


def test_metrics_count_partitions_not_synced_and_their_lag() -> None:
    m = GroupMetrics(Metrics())
    rows = [GroupRow("a", "eu", "orders", 0, "orders", 50, 52, 100, 52, SYNCED),
            GroupRow("a", "eu", "orders", 1, "orders", 80, 40, 40, 40, WAITING),
            GroupRow("b", "eu", "orders", 0, "orders", 9, 9, 100, None, ACTIVE)]
    m.observe(rows)
    assert m.registry.value("groups_not_synced", {"group": "a"}) == 1
    # Group b consumes in the destination: counted as active, not as "not synced".
    assert m.registry.value("groups_not_synced", {"group": "b"}) == 0
    assert m.registry.value("groups_active_in_destination", {"group": "b"}) == 1
    lag = {"group": "a", "region": "eu", "topic": "orders"}
    assert m.registry.value("groups_translation_lag", {**lag, "partition": "0"}) == 0
    assert m.registry.value("groups_translation_lag", {**lag, "partition": "1"}) == 40


def test_prunable_entries_are_below_every_group_and_never_the_newest() -> None:
    part = ("eu", "orders", 0, "orders")
    entries = {part: ENTRIES[part], ("eu", "orders", 1, "orders"): ENTRIES[part]}
    # Groups at 23 and 50 on partition 0: entries ending below 23 go (the first two
    # batches end at 9 and 20); partition 1 has no group: everything stays.
    gone = prunable(entries, [export({0: 50}), GroupExport("b", "orders", "eu", {0: 23}, NOW)])
    assert gone == [(part, 0), (part, 11)]
    # Translation of what the groups need is unchanged without them.
    kept = [e for e in ENTRIES[part] if (part, e.src_first) not in gone]
    for c in (23, 50, 200):
        assert translate(kept, c, 110) == translate(ENTRIES[part], c, 110)
    # A group past everything: the newest entry stays (it gives the replicated end).
    assert (part, ENTRIES[part][-1].src_first) not in prunable(entries, [export({0: 10**6})])


def test_after_sync_is_what_a_new_plan_would_say() -> None:
    admin = FakeAdmin()
    for committed, replicated in ((50, 200), (80, 40)):
        rows = rows_for(committed, replicated=replicated)
        sync(rows, admin)
        replanned = plan_group(export({0: committed}), "orders", members=0,
                               destination_committed=admin.committed, entries=ENTRIES,
                               replicated={0: replicated}, aggregated=False)
        assert after_sync(rows) == replanned


def test_active_active_is_never_synced_for_a_guess() -> None:
    # The destination topic has producers of its own: the translation cannot account for
    # the local records, so the row says so and nothing is committed, even when the
    # destination group already stands at the translated offset.
    exact = rows_for(50)[0]
    for current in (None, exact.translated):
        [row] = plan_group(export({0: 50}), "orders", members=0,
                           destination_committed={} if current is None
                           else {("orders", 0): current},
                           entries=ENTRIES, replicated={0: 200}, aggregated=False,
                           local_writes=True)
        assert (row.state, row.commit) == (LOCAL_WRITES, None)
        assert "producers of its own" in row.reason


def test_sync_goes_on_past_a_refused_group_and_reports_each() -> None:
    admin = FakeAdmin()
    admin.refuse = {"a"}
    rows = [replace(r, group=g) for g in ("a", "b", "c") for r in rows_for(50)]
    done = sync(rows, admin)
    assert isinstance(done["a"], KafkaRetriableError) and done["b"] == done["c"] == 1
    assert [g for g, _ in admin.altered] == ["b", "c"]
    after = after_sync(rows, done)
    assert [(r.group, r.state) for r in after] == [("a", REFUSED), ("b", SYNCED),
                                                   ("c", SYNCED)]
    assert "UNKNOWN_MEMBER_ID" in after[0].reason


def test_plan_uses_only_the_destination_topics_current_entries() -> None:
    ingress = IngressSettings.model_validate({
        "group_id": "ing", "sqs_queue": "q",
        "sources": [{"region": "eu", "topic": "orders", "destination_topic": "orders"}]})
    cps = {checkpoint_key("eu", "orders", 0, "orders"): Checkpoint(99, "seg", NOW)}
    part = ("eu", "orders", 0, "orders")
    stale = entries_of(list(range(100)), 1000, from_origin=True, incarnation="id-0")
    current = entries_of(list(range(100)), 0, from_origin=True, incarnation="id-1")
    [row] = plan([export({0: 50})], ingress.sources, FakeAdmin(), {part: [*stale, *current]},
                 cps)
    assert (row.translated, row.state) == (50, TO_SYNC)
    [row] = plan([export({0: 50})], ingress.sources, FakeAdmin(), {part: stale}, cps)
    assert (row.state, row.commit) == (UNMAPPED, None) and row.reason


def test_a_gap_in_the_map_is_unmapped_with_its_reason() -> None:
    part = ("eu", "orders", 0, "orders")
    gap = {part: [*entries_of(list(range(100)), 0, from_origin=True),
                  *entries_of(list(range(200, 300)), 201)]}
    [row] = plan_group(export({0: 150}), "orders", members=0, destination_committed={},
                       entries=gap, replicated={0: 300}, aggregated=False)
    assert (row.state, row.commit) == (UNMAPPED, None) and "100..199" in row.reason


def test_a_group_at_rest_past_the_final_commit_marker_is_synced_at_the_replicated_end(
        ) -> None:
    # The source's last record is SRC[-1], a commit marker follows: a consumer that read
    # everything commits last + 2. Replication is at last + 1 (the checkpoint at last).
    last = SRC[-1]
    at_rest = GroupExport("app", "orders", "eu", {0: last + 2}, NOW,
                          no_records_from={0: last + 1})

    def row(e: GroupExport, current: int | None = None) -> GroupRow:
        [r] = plan_group(e, "orders", members=0,
                         destination_committed={} if current is None
                         else {("orders", 0): current},
                         entries=ENTRIES, replicated={0: last + 1}, aggregated=False)
        return r

    end = ENTRIES[("eu", "orders", 0, "orders")][-1].dest_next
    r = row(at_rest)
    assert (r.translated, r.state, r.commit) == (end, TO_SYNC, end)
    assert row(at_rest, end).state == SYNCED
    # Without the export's evidence (or before the last record is replicated) it waits.
    assert row(export({0: last + 2}), end).state == WAITING
    early = GroupExport("app", "orders", "eu", {0: last + 2}, NOW, no_records_from={0: 200})
    assert row(early, end).state == WAITING


def test_offsets_of_one_source_incarnation_never_use_anothers_map() -> None:
    # The source topic was deleted and created again: offsets restart at 0. The old one's
    # records 0-99 sit at destination 0-99, the new one's 0-49 at 100-149.
    from replicator.core.wire import Incarnation, TopicMetadata
    ingress = IngressSettings.model_validate({
        "group_id": "ing", "sqs_queue": "q",
        "sources": [{"region": "eu", "topic": "orders", "destination_topic": "orders"}]})
    part = ("eu", "orders", 0, "orders")
    old = entries_of(list(range(100)), 0, from_origin=True, incarnation="id-1")
    new = entries_of(list(range(50)), 100, from_origin=True, incarnation="id-1",
                     source_incarnation="B")
    meta = TopicMetadata(1, incarnations=(Incarnation("A", ""), Incarnation("B", "B")))

    def run(exp: GroupExport, cp: Checkpoint) -> GroupRow:
        [row] = plan([exp], ingress.sources, FakeAdmin(), {part: [*old, *new]},
                     {checkpoint_key("eu", "orders", 0, "orders"): cp},
                     source_meta=lambda r, t: meta)
        return row

    in_new = Checkpoint(49, "seg", NOW, incarnation="B")
    row = run(replace(export({0: 30}), topic_id="B"), in_new)
    assert (row.translated, row.state) == (130, TO_SYNC)          # not 30: the old record
    row = run(replace(export({0: 30}), topic_id="A"), in_new)     # an old export
    assert (row.state, row.commit) == (UNMAPPED, None) and "incarnation first" in row.reason
    row = run(export({0: 30}), in_new)                            # no topic id
    assert (row.state, row.commit) == (UNMAPPED, None) and "unknown" in row.reason
    # Replication still in the old one: the new offsets wait, never translated there.
    row = run(replace(export({0: 30}), topic_id="B"), Checkpoint(80, "seg", NOW))
    assert (row.state, row.commit) == (UNMAPPED, None)
    row = run(replace(export({0: 30}), topic_id="A"), Checkpoint(80, "seg", NOW))
    assert (row.translated, row.state) == (30, TO_SYNC)


def test_prune_never_weighs_one_incarnations_entries_against_anothers_commits() -> None:
    from datetime import UTC, datetime

    from replicator.core.offset_map import OffsetMapEntry, live_entries, of_source, translate
    from replicator.core.wire import GroupExport
    from replicator.ops.groups import prunable
    part = ("r1", "t", 0, "t")
    first = [OffsetMapEntry(0, 99, 0, 100, from_origin=True),
             OffsetMapEntry(100, 999, 100, 900), OffsetMapEntry(1000, 1999, 1000, 1000)]
    later = [OffsetMapEntry(0, 149, 2000, 150, from_origin=True, source_incarnation="IdB"),
             OffsetMapEntry(150, 299, 2150, 150, source_incarnation="IdB")]
    visible = {e.src_first: e for e in first + later}   # compacted: IdB's 0 replaced
    entries = {part: sorted(visible.values())}
    export = GroupExport("g", "t", "r1", {0: 300}, datetime(2026, 1, 1, tzinfo=UTC),
                         topic_id="IdB")
    gone = prunable(entries, [export])
    left = [e for e in entries[part] if (part, e.src_first) not in gone]
    assert translate(live_entries(of_source(left, "IdB"), None), 300, 300).offset == 2300
    assert (part, 0) in gone and (part, 150) not in gone   # IdB's below 300, newest kept
    assert (part, 100) not in gone and (part, 1000) not in gone   # the first's untouched
