"""The offset map translates a committed source offset exactly: to the destination offset
of the first replicated record at or after it, holes of every kind included.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.core.offset_map import (
    MAX_HOLES,
    OffsetMapEntry,
    entries_of,
    live_entries,
    map_key,
    parse_map_key,
    translate,
)


def _replicate(offsets: list[int], cuts: list[int], markers: list[int]
               ) -> tuple[list[OffsetMapEntry], dict[int, int], int]:
    """Replay ``offsets`` in batches cut at ``cuts``, each batch followed by ``markers``
    destination positions (transaction markers); returns entries, source -> destination
    offset of every record, and the destination offset after the end.
    """
    entries: list[OffsetMapEntry] = []
    where: dict[int, int] = {}
    dest = 0
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(offsets))), len(offsets)]
    position = 0
    for (a, b), gap in zip(itertools.pairwise(bounds), markers * len(bounds),
                           strict=False):
        batch = offsets[a:b]
        last = batch[-1] if b == len(offsets) else offsets[b] - 1
        entries += entries_of(batch, dest, first=position, last=last)
        for i, o in enumerate(batch):
            where[o] = dest + i
        dest += len(batch) + gap
        position = last + 1
    return entries, where, dest


def _resumes_exactly(where: dict[int, int], committed: int, offset: int | None,
                     end: int) -> bool:
    """A consumer starting at ``offset`` reads exactly the records of source offset
    ``>= committed``: every earlier record lies below it, every later one at or above it
    (what lies between is transaction markers, which consumers skip).
    """
    if offset is None:
        return False
    before = [d for o, d in where.items() if o < committed]
    after = [d for o, d in where.items() if o >= committed]
    return max(before, default=-1) < offset <= min(after, default=end)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=300), st.lists(st.integers(0, 300)),
       st.lists(st.integers(0, 2), min_size=1, max_size=5), st.integers(0, 3))
def test_translation_is_exact(steps: list[int], cuts: list[int], markers: list[int],
                              lead: int) -> None:
    offsets, o = [], lead
    for s in steps:
        offsets.append(o)
        o += s
    entries, where, _ = _replicate(offsets, cuts, markers)
    assert entries == sorted(entries)
    replicated = offsets[-1] + 1
    last_next = entries[-1].dest_next
    for committed in range(0, offsets[-1] + 2):
        t = translate(entries, committed, replicated)
        assert t.state == "translated"
        assert _resumes_exactly(where, committed, t.offset, last_next), (committed, t)


def test_a_group_ahead_of_replication_waits_at_the_replicated_end() -> None:
    entries, where, _ = _replicate(list(range(0, 100)), [50], [1])
    t = translate(entries, 80, replicated=60)
    assert t.state == "waiting" and t.offset == where[60]
    assert translate(entries, 200, replicated=100).offset == entries[-1].dest_next
    assert translate(entries, 200, replicated=100).state == "waiting"


def test_offsets_before_the_map_are_unmapped() -> None:
    entries = entries_of([10, 11, 12], 0, first=10)
    assert translate(entries, 9, 13).state == "unmapped"
    assert translate([], 5, 13).state == "unmapped"
    assert translate(entries, 10, 13).offset == 0


def test_many_holes_split_an_entry_and_stay_exact() -> None:
    offsets = list(range(0, 1000, 3))          # a compacted source: two holes per record
    entries = entries_of(offsets, 500)
    assert len(entries) > 1 and all(len(e.holes) <= MAX_HOLES + 2 for e in entries)
    assert sum(e.count for e in entries) == len(offsets)
    for committed in random.Random(1).sample(range(1000), 200):
        expected = 500 + sum(1 for o in offsets if o < committed)
        assert translate(entries, committed, 1000).offset == expected


def test_entry_codec_and_keys() -> None:
    e = entries_of([5, 6, 9, 10], 40, first=3, last=12)[0]
    assert e == OffsetMapEntry(3, 12, 40, 4, ((3, 4), (7, 8), (11, 12)))
    assert OffsetMapEntry.decode(e.encode(), where="k") == e
    doc = json.loads(e.encode())
    doc["count"] = 5
    with pytest.raises(ValueError, match="k: inconsistent"):
        OffsetMapEntry.decode(json.dumps(doc).encode(), where="k")
    with pytest.raises(ValueError, match="tombstone"):
        OffsetMapEntry.decode(None, where="k")
    key = map_key("eu", "orders", 3, "orders.copy", 3)
    assert key == "eu:orders:3:orders.copy:00000000000000000003"
    assert parse_map_key(key) == (("eu", "orders", 3, "orders.copy"), 3)
    assert parse_map_key("eu:orders:3:orders.copy") is None
    assert sorted([map_key("r", "t", 0, "d", 10), map_key("r", "t", 0, "d", 9)])[0] \
        .endswith("9")


def test_below_the_map_only_a_first_entry_translates() -> None:
    first = entries_of([121, 125], 0, first=121, from_origin=True)
    assert first[0].from_origin and OffsetMapEntry.decode(first[0].encode(), where="k") \
        == first[0]
    # Nothing below the partition's origin was replicated: the group starts at the first
    # replicated record.
    assert translate(first, 50, 126) == translate(first, 121, 126)
    assert translate(first, 50, 126).state == "translated"
    later = entries_of([121, 125], 0, first=121)
    assert translate(later, 50, 126).state == "unmapped"


def test_an_offset_inside_a_gap_between_entries_is_unmapped() -> None:
    # Source 100-199 has no entry (replicated while the map was off, say): the gap may
    # hold records, so 150 cannot resume at 201 (150-199 would be skipped).
    entries = [*entries_of(list(range(100)), 0, from_origin=True),
               *entries_of(list(range(200, 300)), 201)]
    t = translate(entries, 150, 300)
    assert (t.offset, t.state) == (None, "unmapped") and "100..199" in t.reason
    # Right after an entry and at the next entry's first record it is exact.
    assert (translate(entries, 100, 300).offset, translate(entries, 100, 300).state) \
        == (100, "translated")
    assert translate(entries, 200, 300).offset == 201
    # Positions replayed after the last entry without one: unmapped as well.
    assert translate(entries, 320, 350).state == "unmapped"


def test_a_recreated_destination_and_a_new_replay_never_use_stale_entries() -> None:
    old = entries_of(list(range(100)), 0, from_origin=True, incarnation="A")
    # The destination topic recreated (id B), replication going on from 100.
    new = entries_of(list(range(100, 150)), 0, first=100, incarnation="B")
    live = live_entries([*old, *new], "B")
    assert live == new
    assert translate(live, 120, 150).offset == 20
    assert translate(live, 50, 150).state == "unmapped"      # only in the old topic
    assert live_entries([*old, *new], None) == []               # the topic is missing
    # A checkpoint reset: the same topic replays from 40 again (the new copies at 100+):
    # 40 and above resume in the new copy, below it the records exist twice: unmapped.
    again = entries_of(list(range(40, 120)), 101, first=40, from_origin=True,
                       incarnation="A")
    live = live_entries([*old, *again], "A")
    assert [e.src_first for e in live] == [40] and not live[0].from_origin
    assert translate(live, 60, 120).offset == 121
    assert translate(live, 10, 120).state == "unmapped"
    # Entries written before the map recorded incarnations are used while none has one.
    legacy = entries_of(list(range(10)), 0, from_origin=True)
    assert live_entries(legacy, "A") == legacy
    assert OffsetMapEntry.decode(old[0].encode(), where="k").incarnation == "A"


def test_a_replay_started_again_from_its_origin_drops_the_earlier_entries() -> None:
    # 0-8 replayed with the map, 9-11 without (the map off), then the checkpoint deleted:
    # the replay starts again at 11 (its first entry from_origin). Record 11 is in the
    # destination twice, and nothing in the map overlaps: the from_origin entry written
    # after others is what says replication started again.
    old = entries_of(list(range(9)), 0, from_origin=True, incarnation="A")
    again = entries_of(list(range(11, 21)), 14, first=11, from_origin=True, incarnation="A")
    live = live_entries([*old, *again], "A")
    assert [e.src_first for e in live] == [11] and not live[0].from_origin
    assert translate(live, 0, 21).state == "unmapped"     # 0 would read record 11 twice
    assert translate(live, 15, 21).offset == 18
