"""The incarnation chain is in the order the topics were created, not the order their
segments were named: two recreates in a row (X, then Y, then Z) can name a Z segment
before a Y one (docs/architecture.md, "Topic incarnations").
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from egress.incarnation_chain import encode, insert, merge
from replicator.core.keys import PartitionRef
from replicator.core.storage import ObjectInfo
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.egress.fakes import RecordingStore, SourceAdmin
from tests.unit.egress.test_incarnation_orders import TOPIC_JSON, publisher

T0 = datetime(2026, 1, 1, tzinfo=UTC)
X = Incarnation("X", "")
Z = Incarnation("Z", "Z", {1: 9}, {1: 0}, created_at=T0 + timedelta(seconds=20))


def ids(chain: tuple[Incarnation, ...]) -> list[str]:
    return [i.topic_id for i in chain]


def test_a_topic_recorded_after_a_later_one_goes_before_it() -> None:
    y = Incarnation("Y", "Y", created_at=T0 + timedelta(seconds=30))
    chain, at = insert((X, Z), y, later=["Z"])
    assert (ids(chain), at) == (["X", "Y", "Z"], 1)
    # Z's recorded ends were X's: they are Y's now, and Z follows a Y without segments
    # of those partitions (none of Y could be named before Y was listed).
    # Y's first positions are its own seals' (none of its segments is named yet).
    assert chain[1].previous_ends == {1: 9} and chain[1].first_positions == {}
    assert chain[2].previous_ends == {1: None} and chain[2].first_positions == {1: 0}
    # What its writer read after it stays in the entry (a merge places it by that).
    assert chain[1].later == ("Z",)
    assert Incarnation.from_json(chain[1].to_json(), "t") == chain[1]


def test_first_seen_times_order_topics_without_a_hint() -> None:
    early = Incarnation("Y", "Y", created_at=T0 + timedelta(seconds=10))
    assert ids(insert((X, Z), early)[0]) == ["X", "Y", "Z"]
    late = Incarnation("W", "W", created_at=T0 + timedelta(seconds=30))
    assert ids(insert((X, Z), late)[0]) == ["X", "Z", "W"]
    same = Incarnation("W", "W", created_at=Z.created_at)
    assert ids(insert((X, Z), same)[0]) == ["X", "Z", "W"]       # a tie: appended
    # The first entry owns the documented shape: nothing goes before it.
    assert ids(insert((Incarnation("X", "", created_at=T0 + timedelta(seconds=50)),), early)
               [0]) == ["X", "Y"]


def test_merge_places_an_inserted_entry_and_keeps_the_inserters_ends() -> None:
    pinned = (X, Z)
    inserted, _ = insert(pinned, Incarnation("Y", "Y"), later=["Z"])
    merged = merge(pinned, inserted)
    assert merged == inserted
    # The ends pinned records for Z were X's: never kept once Y precedes Z.
    assert merged[2].previous_ends == {1: None}
    # A writer of the old view (X, Z) adding a seal of Z after the insert was pinned:
    # its ends are X's, not Y's, and are not taken.
    stale = (X, Incarnation("Z", "Z", {0: 7}, {0: 0}))
    assert merge(merged, stale)[2].previous_ends == {1: None}


def test_the_publisher_records_an_earlier_topic_before_a_later_one() -> None:
    store = RecordingStore()
    admin = SourceAdmin(tid="X", partitions=2)
    pub = publisher(admin, store)
    pub.incarnation("t", "Z", seen_at=T0 + timedelta(seconds=20))
    pub.seal(PartitionRef("data", "r1", "t", 1, "Z"), 0)
    # Y was read (at an assignment) before Z existed; its segment is named now.
    assert pub.incarnation("t", "Y", seen_at=T0 + timedelta(seconds=10)) == "Y"
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert [(i.topic_id, i.previous_ends) for i in meta.incarnations] == [
        ("X", {}), ("Y", {1: None}), ("Z", {1: None})]
    # Partition 0's first segments of Y then Z: each seals its predecessor's end.
    pub.seal(PartitionRef("data", "r1", "t", 0, "Y"), 0)
    pub.seal(PartitionRef("data", "r1", "t", 0, "Z"), 0)
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert [i.previous_ends for i in meta.incarnations] == [{}, {1: None, 0: None},
                                                            {1: None, 0: None}]
    pub2 = publisher(admin, store)       # another member: the same order from the bucket
    assert pub2.incarnation("t", "Z") == "Z"
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert ids(meta.incarnations) == ["X", "Y", "Z"]


def test_a_seal_dropped_by_a_merge_with_a_late_incarnation_is_written_again() -> None:
    # Member A seals Z in partition 1 against (X, Z) while member B inserts Y before Z:
    # the merge keeps B's ends for Z (against Y) and drops A's (against X). A's next
    # metadata check finds its seal missing and seals again against (X, Y, Z).
    store = RecordingStore()
    admin = SourceAdmin(tid="X", partitions=2)
    a = publisher(admin, store)
    write_x = PartitionRef("data", "r1", "t", 1)
    store.put(write_x.segments_prefix(0) + "00000000000000000000-00000000000000000009",
              b"not read")
    a.incarnation("t", "Z", seen_at=T0 + timedelta(seconds=20))
    a.seal(PartitionRef("data", "r1", "t", 1, "Z"), 0)
    # What the race leaves: Y inserted, Z's and Y's ends of partition 1 not recorded.
    lost = (X, Incarnation("Y", "Y", created_at=T0 + timedelta(seconds=10)),
            Incarnation("Z", "Z", {}, {1: 0}, created_at=T0 + timedelta(seconds=20)))
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    store.put(TOPIC_JSON, TopicMetadata(2, {}, "t", "r1", T0, meta.first_positions,
                                        lost).encode())
    store.put("data/r1/t/_incarnations.json", encode(lost))
    a._pinned.clear()
    admin.id = "Z"
    a.check()
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert [(i.topic_id, i.previous_ends) for i in meta.incarnations] == [
        ("X", {}), ("Y", {1: 9}), ("Z", {1: None})]


def test_ids_one_process_read_in_turn_are_ordered_whatever_its_clock() -> None:
    store = RecordingStore()
    admin = SourceAdmin(tid="X", partitions=2)
    pub = publisher(admin, store)          # its clock never moves
    admin.id = "Y"
    assert pub.topic_id("t") == "Y"        # a reset read it
    admin.id = "Z"
    assert pub.topic_id("t") == "Z"        # the metadata check, or another partition
    pub.incarnation("t", "Z")
    pub.incarnation("t", "Y")              # no hint from the writer
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert ids(meta.incarnations) == ["X", "Y", "Z"]


def test_a_merge_places_an_entry_by_what_its_writer_read_then_by_first_seen_times() -> None:
    # Member M1 pinned (X, Z); member M2 pins (X, Y) against the chain it read before.
    by_reads = Incarnation("Y", "Y", later=("Z",))
    assert ids(merge((X, Z), (X, by_reads))) == ["X", "Y", "Z"]
    assert merge((X, Z), (X, by_reads))[1].later == ("Z",)
    by_clock = Incarnation("Y", "Y", created_at=T0 + timedelta(seconds=10))
    assert ids(merge((X, Z), (X, by_clock))) == ["X", "Y", "Z"]
    # What a writer read beats the clocks: Z's writer read Y after Z.
    z_first = dataclasses.replace(Z, later=("Y",))
    assert ids(merge((X, z_first), (X, by_clock))) == ["X", "Z", "Y"]
    # A later recreate's entry goes after an entry whose writer read it later.
    w = Incarnation("W", "W", created_at=T0)
    assert ids(insert((X, dataclasses.replace(by_reads, later=("W", "Z")), Z), w)[0]) \
        == ["X", "Y", "W", "Z"]


class RacingStore(RecordingStore):
    """Runs ``hook`` (once) when member M2 is about to write ``_incarnations.json``."""

    hook: Any = None

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        if key.endswith("_incarnations.json") and self.hook is not None \
                and threading.current_thread().name == "M2":
            h, self.hook = self.hook, None
            h()
        return super().put(key, data, **kw)


@pytest.mark.parametrize("clocks", [True, False], ids=["clocks", "reads-only"])
def test_two_members_recording_two_recreates_at_once_keep_creation_order(clocks: bool
                                                                           ) -> None:
    # M2 names Y's segment (it read Y, then Z); M1 pins Z between M2's read of the chain
    # and M2's conditional put of it: M2's put is refused and merged with (X, Z).
    store = RacingStore()
    admin = SourceAdmin(tid="X", partitions=2)
    m1, m2 = publisher(admin, store), publisher(admin, store)
    m1.incarnation("t", "X")
    m2.incarnation("t", "X")
    seen_y = T0 + timedelta(seconds=10) if clocks else None
    seen_z = T0 + timedelta(seconds=20) if clocks else None
    store.hook = lambda: m1.incarnation("t", "Z", seen_at=seen_z)
    t = threading.Thread(target=lambda: m2.incarnation(
        "t", "Y", later=() if clocks else ["Z"], seen_at=seen_y), name="M2")
    t.start()
    t.join()
    assert store.hook is None, "the race did not happen"
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert ids(meta.incarnations) == ["X", "Y", "Z"]
    m1.seal(PartitionRef("data", "r1", "t", 0, "Z"), 0)
    m2.seal(PartitionRef("data", "r1", "t", 1, "Y"), 0)
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert ids(meta.incarnations) == ["X", "Y", "Z"]
    assert [i.previous_ends for i in meta.incarnations] == [
        {}, {0: None, 1: None}, {0: None}]


def test_an_inserted_incarnations_first_position_is_its_first_segments() -> None:
    # Y inserted before Z (which sealed partition 0): its end there is known, its first
    # position only once its own first segment (from 500: records expired before egress
    # read them) is sealed. Ingress would otherwise wait below 500 until it declared
    # records that never existed lost.
    store = RecordingStore()
    admin = SourceAdmin(tid="X", partitions=1)
    m1 = publisher(admin, store)
    m1.incarnation("t", "Z", seen_at=T0 + timedelta(seconds=20))
    m1.seal(PartitionRef("data", "r1", "t", 0, "Z"), 0)
    m2 = publisher(admin, store)
    m2.incarnation("t", "Y", later=["Z"], seen_at=T0 + timedelta(seconds=10))
    y0 = PartitionRef("data", "r1", "t", 0, "Y")
    m2.seal(y0, 500)
    y = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json").incarnation("Y")
    assert y is not None and y.first_positions == {0: 500}
    # Once a segment of it is in the bucket, a member assigned the partition later does
    # not move its first position to where it resumed.
    store.put(y0.segments_prefix(0) + "00000000000000000500-00000000000000000509",
              b"not read")
    publisher(admin, store).seal(y0, 510)
    y = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json").incarnation("Y")
    assert y is not None and y.first_positions == {0: 500}
