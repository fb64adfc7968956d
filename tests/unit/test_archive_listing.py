"""The committer's listing between full listings (``archive.listing``): a step lists only the
keys after each folder's last one, and a full listing every ``catalog.full_listing_interval``
finds what that cannot see (a segment published below the newest one of its level, a
compaction output at a lower start, a deletion). A real pyiceberg SQL catalog (SQLite) over
a MemoryObjectStore; the clock is a fake one, no timing is asserted.
"""

from __future__ import annotations

import itertools
import logging
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicator.archive import listing
from replicator.archive.committer import ArchiveCommitter
from replicator.archive.listing import folder_spans, listed_since
from replicator.core.errors import StorageFatalError
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore, ObjectInfo
from tests.unit.test_archive_committer import catalog_settings
from tests.unit.test_compaction_controller import k
from tests.unit.test_compaction_helpers import make_records, write_segment

INTERVAL = timedelta(minutes=5)


@pytest.fixture(autouse=True)
def one_key_per_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LIST of one key: these small topics are listed in full otherwise."""
    monkeypatch.setattr(listing, "KEYS_PER_LIST", 1)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


class CountingStore(MemoryObjectStore):
    """Counts LIST calls and the keys they return."""

    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.lists = 0
        self.listed = 0

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        self.lists += 1
        for info in super().list(prefix, start_after=start_after):
            self.listed += 1
            yield info


def put(store: MemoryObjectStore, key: SegmentKey) -> SegmentKey:
    write_segment(store, key, make_records(key.start, key.end))
    return key


def in_table(committer: ArchiveCommitter) -> list[SegmentKey]:
    table = committer.table("r1", "t", create=False)
    assert table is not None
    return sorted(p.key for path in table.files()
                  if (p := committer.piece_of(table, path)) is not None)


def test_folder_spans_and_what_is_listed_between_them() -> None:
    store = MemoryObjectStore("b")
    for key in ["d/t/0/0/05", "d/t/0/0/08", "d/t/0/0/09", "d/t/0/1/03", "d/t/1/0/02",
                "d/t/_topic.json"]:
        store.put(key, b"")
    prior = [i.key for i in store.list("d/t/") if not i.key.endswith(".json")]
    assert folder_spans(prior) == [("d/t/0/0/05", "d/t/0/0/08", "d/t/0/0/09"),
                                   ("d/t/0/1/03", None, "d/t/0/1/03"),
                                   ("d/t/1/0/02", None, "d/t/1/0/02")]
    for key in ["d/t/0/0/01", "d/t/0/0/07", "d/t/0/0/10", "d/t/0/1/04", "d/t/0/2/00",
                "d/t/10/0/00", "d/t/1/0/01", "d/t/1/0/03"]:
        store.put(key, b"")
    store.delete("d/t/0/0/08")
    got = listed_since(store, "d/t/", prior)
    # Whatever sorts outside each folder's span (before its first key too); what sorts
    # inside one (07, between 05 and 09), and a deletion inside one (08), wait for a full
    # listing.
    assert got is not None
    assert sorted(i.key for i in got) == ["d/t/0/0/01", "d/t/0/0/10", "d/t/0/1/04",
                                          "d/t/0/2/00", "d/t/1/0/01", "d/t/1/0/03",
                                          "d/t/10/0/00", "d/t/_topic.json"]
    # A span's first or last key gone (a lifecycle rule deletes the oldest first): list
    # in full.
    for gone in ["d/t/0/0/05", "d/t/0/0/09", "d/t/1/0/02"]:
        copy = MemoryObjectStore("b")
        for key in [key for key in store.keys() if key != gone]:   # noqa: SIM118
            if key != gone:
                copy.put(key, b"")
        assert listed_since(copy, "d/t/", prior) is None, gone


def test_a_step_lists_only_what_follows_and_a_late_segment_waits_for_a_full_listing(
        tmp_path: Path) -> None:
    store = CountingStore("b")
    clock = Clock()
    cfg = catalog_settings(tmp_path, full_listing_interval="5m")
    committer = ArchiveCommitter(cfg, store, clock=clock)
    for i in range(0, 40, 2):
        put(store, k(0, 10 * i, 10 * i + 9))
    committer.sync("r1", "t")
    put(store, k(0, 400, 409))
    store.lists = store.listed = 0
    assert committer.sync("r1", "t").added == 1
    # The folder's first key, its last two and the new one, not the 21 listed before.
    assert store.listed <= 4
    late = put(store, k(0, 10, 19))   # below the newest one of its folder
    lost = k(0, 20, 29)
    store.delete(lost.to_key())
    clock.now += INTERVAL - timedelta(seconds=1)
    assert committer.sync("r1", "t").committed == 0
    assert late not in in_table(committer) and lost in in_table(committer)
    clock.now += timedelta(seconds=1)
    r = committer.sync("r1", "t")
    assert (r.added, r.removed_gone) == (1, 1)
    assert late in in_table(committer) and lost not in in_table(committer)
    assert not ArchiveCommitter(cfg, store).sync("r1", "t").committed


def twenty_segments_committed(tmp_path: Path, store: MemoryObjectStore,
                              clock: Clock) -> ArchiveCommitter:
    """A committer (a 5 min full listing) whose table lists 20 segments of one folder."""
    committer = ArchiveCommitter(catalog_settings(tmp_path, full_listing_interval="5m"),
                                 store, clock=clock)
    for i in range(0, 40, 2):
        put(store, k(0, 10 * i, 10 * i + 9))
    committer.sync("r1", "t")
    return committer


def test_a_clock_stepped_back_lists_in_full_at_once(tmp_path: Path) -> None:
    """The wall clock stepped back (an NTP correction, a VM resumed) after a full listing:
    the next step lists in full, not only once the interval has passed again."""
    store = MemoryObjectStore("b")
    clock = Clock()
    committer = twenty_segments_committed(tmp_path, store, clock)
    late = put(store, k(0, 10, 19))   # below the newest one of its folder
    clock.now -= timedelta(minutes=10)
    assert committer.sync("r1", "t").added == 1
    assert late in in_table(committer)


class NoStartAfter(MemoryObjectStore):
    """A store that refuses to list from a key (S3 directory buckets have no StartAfter)."""

    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.refused = 0

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        if start_after is not None:
            self.refused += 1
            raise StorageFatalError("list: InvalidArgument: StartAfter is not supported")
        return super().list(prefix)


def test_a_store_that_cannot_list_from_a_key_is_listed_in_full(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = NoStartAfter("b")
    clock = Clock()
    committer = twenty_segments_committed(tmp_path, store, clock)
    for i in range(3):   # each step adds its segment, none fails
        clock.now += timedelta(seconds=30)
        newest = put(store, k(0, 400 + 10 * i, 409 + 10 * i))
        with caplog.at_level(logging.WARNING):
            assert committer.sync("r1", "t").added == 1
        assert newest in in_table(committer)
    assert store.refused == 1   # tried once, then in full
    assert sum("StartAfter" in r.getMessage() for r in caplog.records) == 1


def test_zero_interval_lists_in_full_at_every_step(tmp_path: Path) -> None:
    store = MemoryObjectStore("b")
    committer = ArchiveCommitter(catalog_settings(tmp_path, full_listing_interval="0s"),
                                 store, clock=Clock())
    put(store, k(0, 100, 109))
    committer.sync("r1", "t")
    late = put(store, k(0, 0, 9))
    assert committer.sync("r1", "t").added == 1
    assert late in in_table(committer)


_OPS = st.lists(st.tuples(st.sampled_from(["next", "late", "compact", "lose", "tick"]),
                          st.integers(0, 1), st.integers(0, 10**6)), min_size=3, max_size=10)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_OPS)
def test_a_segment_landing_in_any_order_is_in_the_table_within_one_full_listing(
        ops: list[tuple[str, int, int]]) -> None:
    """Whatever lands or leaves the bucket (the next segment, a late one below the newest,
    a compaction output at level 1 over any run, at a start lower than the level's newest,
    a deletion), between full listings the table never lists an offset twice nor loses one
    the bucket still holds, and after the first step past ``full_listing_interval`` it is
    what a committer that knows nothing makes of the bucket.
    """
    with tempfile.TemporaryDirectory(prefix="archive-listing-") as name:
        replay(Path(name), ops)


def offsets(pieces: Any) -> dict[int, set[int]]:
    out: dict[int, set[int]] = defaultdict(set)
    for partition, lo, hi in pieces:
        out[partition].update(range(lo, hi + 1))
    return out


def replay(tmp: Path, ops: list[tuple[str, int, int]]) -> None:
    store = MemoryObjectStore("b")
    clock = Clock()
    cfg = catalog_settings(tmp, snapshot_retention="0s", full_listing_interval="5m")
    committer = ArchiveCommitter(cfg, store, clock=clock)
    ends = [0, 0]
    gaps: list[list[int]] = [[], []]
    before: dict[int, set[int]] = {}
    for op, p, n in [*ops, ("tick", 0, 0)]:
        keys = sorted((key for key in map(SegmentKey.try_parse, store.keys())
                       if key is not None and key.partition == p), key=lambda x: x.start)
        key = None
        if op == "next" or (op in ("compact", "lose") and not keys):
            key = k(0, ends[p] + 10, ends[p] + 19, partition=p)   # a gap of 10 left before
            gaps[p].append(ends[p])
        elif op == "late" and gaps[p]:
            start = gaps[p].pop(n % len(gaps[p]))
            key = k(0, start, start + 9, partition=p)
        elif op == "compact":   # an output over a run of segments (inputs still there)
            run = keys[n % len(keys):][:3]
            key = k(1, run[0].start, max(x.end for x in run), partition=p)
        elif op == "lose":   # a lifecycle rule or an operator deletes one
            store.delete(keys[n % len(keys)].to_key())
        elif op == "tick":
            clock.now += INTERVAL
        if key is not None:
            put(store, key)
            ends[p] = max(ends[p], key.end + 1)
        committer.sync("r1", "t")
        before = check(committer, store, before)
        if op == "tick":
            assert not ArchiveCommitter(cfg, store).sync("r1", "t").committed


def check(committer: ArchiveCommitter, store: MemoryObjectStore,
          before: dict[int, set[int]]) -> dict[int, set[int]]:
    """No offset listed twice, none listed ``before`` lost while the bucket holds it; the
    offsets listed now.
    """
    table = committer.table("r1", "t", create=False)
    assert table is not None
    pieces = [(pc.key.partition, pc.lo, pc.hi) for path in table.files()
              if (pc := committer.piece_of(table, path)) is not None]
    per: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for partition, lo, hi in pieces:
        per[partition].append((lo, hi))
    for spans in per.values():
        spans.sort()
        assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), spans
    now = offsets(pieces)
    bucket = offsets((x.partition, x.start, x.end) for x in map(
        SegmentKey.try_parse, store.keys()) if x is not None)
    for partition, had in before.items():
        assert had & bucket[partition] <= now[partition]
    return now


def test_a_topic_whose_full_listing_takes_as_few_requests_is_listed_in_full(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing, "KEYS_PER_LIST", 1000)
    store = MemoryObjectStore("b")
    for key in ["d/t/0/0/05", "d/t/0/0/07", "d/t/0/0/09", "d/t/1/0/02", "d/t/1/0/03"]:
        store.put(key, b"")
    assert listed_since(store, "d/t/", store.keys()) is None   # 1 request, not 3
    monkeypatch.setattr(listing, "KEYS_PER_LIST", 1)
    assert listed_since(store, "d/t/", store.keys()) == []
