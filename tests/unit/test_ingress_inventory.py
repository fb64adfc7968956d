"""A worker's segment listing starts at its resume position and keeps only what replay
still needs; a gap right after the position is checked with a complete listing first."""

from __future__ import annotations

from collections.abc import Iterator

from ingress.inventory import SegmentInventory
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.storage import MemoryObjectStore, ObjectInfo

REF = PartitionRef("data", "us-east-1", "t", 3)


class RecordingStore(MemoryObjectStore):
    def __init__(self) -> None:
        super().__init__("b")
        self.listed: list[int] = []       # objects returned per listing
        self.after: list[str | None] = []

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        out = list(super().list(prefix, start_after=start_after))
        self.listed.append(len(out))
        self.after.append(start_after)
        return iter(out)


def seg(level: int, start: int, end: int) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "t", 3, level, start, end)


def store_with(*segs: SegmentKey) -> RecordingStore:
    s = RecordingStore()
    for k in segs:
        s.put(k.to_key(), b"x")
    return s


def test_the_listing_starts_at_the_checkpoints_segment_and_keeps_what_is_needed() -> None:
    history = [seg(0, i * 100, i * 100 + 99) for i in range(50)]
    compacted = seg(1, 0, 2999)
    store = store_with(*history, compacted)
    position = 4049                            # inside 4000-4099, the checkpoint's segment
    inv = SegmentInventory(store, REF, "w", horizon=lambda: (position, None))
    inv.anchor = 4000
    inv.reload()
    assert store.after == [REF.starting_from(0, 4000)]
    assert store.listed == [10 + 1]            # level 0 from 4000-4099 on, and level 1
    assert inv.known == {s for s in history if s.start >= 4000}   # 0-2999 is replayed
    assert inv.partial


def test_a_later_listing_starts_at_the_known_segment_covering_the_next_position() -> None:
    store = store_with(*(seg(0, i * 100, i * 100 + 99) for i in range(10)))
    position = 250
    inv = SegmentInventory(store, REF, "w", horizon=lambda: (position, None))
    inv.reload(full=True)
    assert store.after == [None] and not inv.partial
    position = 649
    inv.reload()
    assert store.after[-1] == REF.starting_from(0, 600)
    assert {s.start for s in inv.known} == {600, 700, 800, 900}


def test_a_higher_level_segment_starting_below_the_position_is_found() -> None:
    store = store_with(seg(0, 0, 99), seg(2, 0, 999), seg(0, 1000, 1099))
    inv = SegmentInventory(store, REF, "w", horizon=lambda: (500, None))
    inv.reload()
    assert seg(2, 0, 999) in inv.known and seg(0, 0, 99) not in inv.known


def test_without_a_position_everything_is_listed() -> None:
    store = store_with(*(seg(0, i * 10, i * 10 + 9) for i in range(5)))
    inv = SegmentInventory(store, REF, "w")
    inv.reload()
    assert store.after == [None] and len(inv.known) == 5 and not inv.partial


def test_below_the_origin_segments_are_kept_to_be_reported() -> None:
    store = store_with(seg(0, 0, 49), seg(0, 100, 199), seg(0, 200, 299))
    inv = SegmentInventory(store, REF, "w", horizon=lambda: (199, 100))
    inv.reload(full=True)
    assert inv.known == {seg(0, 0, 49), seg(0, 200, 299)}


def test_a_worker_in_an_earlier_incarnation_lists_only_the_later_ones_it_can_enter() -> None:
    # The topic was recreated twice (IdB, IdC), each with segments here. A worker still in
    # the first incarnation lists IdB only once the end of the first one is recorded and
    # reached, and IdC not before it is in IdB; before it replayed anything, every one.
    from ingress.incarnations import IncarnationTracker
    from replicator.core.wire import Incarnation, TopicMetadata

    class Counted(RecordingStore):
        def __init__(self) -> None:
            super().__init__()
            self.prefixes: list[str] = []

        def list(self, prefix: str, *, start_after: str | None = None
                 ) -> Iterator[ObjectInfo]:
            self.prefixes.append(prefix)
            return super().list(prefix, start_after=start_after)

    store = Counted()
    for s in (seg(0, 0, 99), *(
            SegmentKey("data", "us-east-1", "t", 3, 0, i * 10, i * 10 + 9, label)
            for label in ("IdB", "IdC") for i in range(20))):
        store.put(s.to_key(), b"x")

    def chain(sealed: bool) -> None:
        b = Incarnation("IdB", "IdB", {3: 99} if sealed else {}, {3: 0} if sealed else {})
        store.put("data/us-east-1/t/_topic.json", TopicMetadata(
            4, incarnations=(Incarnation("IdA", ""), b, Incarnation("IdC", "IdC"))).encode())

    clock = [0.0]
    tracker = IncarnationTracker(store, REF, "w", object(), monotonic=lambda: clock[0])
    position: list[int | None] = [None]
    inv = SegmentInventory(store, REF, "w", horizon=lambda: (position[0], None),
                           locations=tracker.locations, current=lambda: tracker.label)

    def listed_locations() -> set[str]:
        store.prefixes.clear()
        clock[0] += 10                                 # the chain is read again
        inv.reload(full=True)
        return {p.split("_incarnations/")[1].split("/")[0] if "_incarnations/" in p else ""
                for p in store.prefixes}

    chain(sealed=False)
    assert listed_locations() == {"", "IdB", "IdC"}
    position[0] = 50
    assert listed_locations() == {""}                 # IdB's start is not recorded yet
    chain(sealed=True)
    assert listed_locations() == {""}                 # recorded, not reached
    position[0] = 99
    assert listed_locations() == {"", "IdB"}
    # IdC's segments listed before anything was replayed stay known (not listed since).
    assert {s.incarnation for s in inv.known} == {"IdB", "IdC"}


def test_a_later_incarnations_segment_learned_from_an_event_survives_a_reload() -> None:
    # The reload does not list IdB (the worker cannot move into it yet): what an event
    # announced of it stays known, so the worker still reads the chain again for it.
    from ingress.events import SegmentEvent
    later = SegmentKey("data", "us-east-1", "t", 3, 0, 0, 9, "IdB")
    store = store_with(seg(0, 0, 99), later)
    inv = SegmentInventory(store, REF, "w", horizon=lambda: (50, None),
                           locations=lambda p: ("", []))
    inv.apply([SegmentEvent("created", later)])
    inv.reload(full=True)
    assert inv.known == {seg(0, 0, 99), later}
    inv.apply([SegmentEvent("removed", later)])
    inv.reload(full=True)
    assert inv.known == {seg(0, 0, 99)}
