"""Offset-map translation against a brute-force model of replication histories.

A source partition (records and holes: transaction markers, aborted or compacted-away
records) is replayed in batches into a destination log that also receives transaction
markers and records of its own producers (local writes). Some batches get no map entry
(the map was off, or the batch was not consecutive in the destination); the checkpoint may
be reset (replication starts again, back or forward); the destination topic may be
recreated (a new incarnation, offsets from 0). Whatever ``translate`` calls exact must be:
a consumer starting at the answer reads every replicated record at or after the committed
offset exactly once and no record before it. A history without any of those events
translates every offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.core.offset_map import (
    OffsetMapEntry,
    entries_of,
    live_entries,
    translate,
)

N = 120


@dataclass
class History:
    records: list[bool]
    origin: int
    pos: int = 0
    incarnation: int = 0
    dest: list[int | None] = field(default_factory=list)
    """The destination log: a replicated record's source offset, or ``None`` (a marker or a
    local record)."""
    entries: dict[int, OffsetMapEntry] = field(default_factory=dict)
    """The map topic after compaction: one entry per key (``src_first``)."""
    fresh: bool = True
    clean: bool = True
    reset_pending: bool = False
    """A checkpoint reset, and no entry of the new replay yet: the map still describes the
    earlier replay, which nothing tells apart from a map read just after the checkpoints
    (docs/failover.md says so); translations are checked again once the replay wrote."""
    mapless: bool = False
    """A batch without entries was written into the current destination topic."""
    blind: bool = False
    """A checkpoint reset after such a batch: the map cannot know those copies exist
    (docs/failover.md: the map sees only replays that write it), so nothing is checked."""

    def batch(self, k: int, mapped: bool, interleaved: bool) -> None:
        end = min(N, self.pos + k)
        recs = [o for o in range(self.pos, end) if self.records[o]]
        if not recs:
            self.clean = False     # a batch without records writes no entry: a gap
        elif mapped or self.fresh:
            # A replay's first batch writes the map (a replay that writes none at all,
            # at-least-once or the map off, is outside what the map describes).
            for e in entries_of(recs, len(self.dest), first=self.pos, last=end - 1,
                                from_origin=self.fresh, incarnation=str(self.incarnation)):
                self.entries[e.src_first] = e
            self.dest += [*recs, None]                    # the records, the commit marker
            self.reset_pending = False
        else:
            self.clean, self.mapless = False, True
            half = len(recs) // 2 if interleaved else 0
            self.dest += [*recs[:half], *([None] if interleaved else []), *recs[half:], None]
        self.pos, self.fresh = max(self.pos, end), self.fresh and not recs

    def local(self, k: int) -> None:
        self.dest += [None] * k

    def reset(self, delta: int) -> None:
        self.pos, self.fresh, self.clean = max(0, min(N, self.pos + delta)), True, False
        self.reset_pending = True
        self.blind = self.blind or self.mapless

    def recreate(self) -> None:
        self.incarnation += 1
        self.dest, self.clean, self.mapless, self.blind = [], False, False, False


def exact(h: History, committed: int, offset: int | None) -> bool:
    """A consumer starting at ``offset`` reads each replicated record of source offset
    ``>= committed`` once, and none below it. Copies at or past the replication position
    (left by a replay before a checkpoint reset back) are not wanted there: the current
    replay writes them again, after the offset.
    """
    if offset is None or not 0 <= offset <= len(h.dest):
        return False
    read = [s for s in h.dest[offset:] if s is not None]
    wanted = {s for s in h.dest if s is not None and committed <= s < h.pos}
    return all(s >= committed for s in read) and len(read) == len(set(read)) \
        and set(read) == wanted


OPS = st.one_of(
    st.tuples(st.just("batch"), st.integers(1, 12), st.booleans(), st.booleans()),
    st.tuples(st.just("batch"), st.integers(1, 12), st.just(True), st.just(False)),
    st.tuples(st.just("local"), st.integers(1, 3)),
    st.tuples(st.just("reset"), st.integers(-30, 15)),
    st.tuples(st.just("recreate")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=N, max_size=N), st.integers(0, 5),
       st.lists(OPS, max_size=25), st.booleans())
def test_translation_is_exact_or_unmapped(kinds: list[int], origin: int,
                                          ops: list[tuple[object, ...]],
                                          only_batches: bool) -> None:
    h = History([k >= 2 for k in kinds], origin, pos=origin)
    for op in ops:
        if only_batches and op[0] != "batch":
            continue
        if op[0] == "batch":
            h.batch(int(op[1]), bool(op[2]) or only_batches, bool(op[3]))  # type: ignore[call-overload]
        elif op[0] == "local":
            h.local(int(op[1]))  # type: ignore[call-overload]
        elif op[0] == "reset":
            h.reset(int(op[1]))  # type: ignore[call-overload]
        else:
            h.recreate()
    live = live_entries(h.entries.values(), str(h.incarnation))
    for committed in range(N + 2):
        t = translate(live, committed, h.pos)
        if h.reset_pending or h.blind:
            assert t.offset is not None or t.reason
        elif t.state == "translated":
            assert committed <= h.pos and exact(h, committed, t.offset), (committed, t, h)
        elif t.state == "waiting":
            assert committed > h.pos and exact(h, h.pos, t.offset), (committed, t, h)
        else:
            assert t.offset is None and t.reason
            assert not (h.clean and live), (committed, t, h)
