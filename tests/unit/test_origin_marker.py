"""The origin marker (docs/architecture.md, "Origin marker"): ingress appends it to replayed
records, egress leaves out records whose marker names a region in ``skip_origins``; skipped
records are holes in position space, so segments still touch.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from egress.commits import CommitService
from egress.flow import FlowLimits
from egress.origin import OriginFilter, origin_filter, skipped_origin
from egress.poll_loop import PollLoop
from egress.rotation import CloseReason
from egress.segment import SegmentOutcome
from formats.records import Record, records_to_batch
from ingress.origin import origin_marker
from ingress.rows import batch_rows
from replicator.core.kafka import Fetched, Message
from replicator.core.keys import SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.settings import load_settings
from tests.unit.egress.fakes import FakeMessage, Harness
from tests.unit.test_settings import errors_of, with_

H = "replicator.origin"


def rec(o: int, *headers: tuple[str, bytes | None]) -> Record:
    return Record(o, 1_700_000_000_000 + o, f"k{o}".encode(), b"v", tuple(headers))


# --- settings -----------------------------------------------------------------------


INGRESS: dict[str, Any] = {"sqs_queue": "q", "sources": [{"region": "b", "topic": "t"}]}


def test_defaults_mark_nothing_and_skip_nothing() -> None:
    s = load_settings(data=with_(ingress=INGRESS, egress={"topics": {"t": {}}}), environ={})
    assert s.ingress is not None and s.egress is not None
    assert (s.ingress.mark_origin, s.ingress.origin_header) == (False, H)
    assert (s.egress.skip_origins, s.egress.origin_header) == ([], H)
    assert origin_marker(s.ingress, "b") is None
    assert origin_filter(s.egress, _metrics(), "a") is None


def test_bad_origin_settings_name_their_key() -> None:
    errs = errors_of(with_(egress={"topics": {"t": {}}, "skip_origins": ["ok", "no/slash"],
                                   "origin_header": ""}))
    assert set(errs) == {"egress.skip_origins", "egress.origin_header"}
    errs = errors_of(with_(ingress={**INGRESS, "mark_origin": "maybe", "origin_header": ""}))
    assert set(errs) == {"ingress.mark_origin", "ingress.origin_header"}


# --- ingress: the marker ------------------------------------------------------------


def test_marker_is_appended_after_the_records_own_headers() -> None:
    s = load_settings(data=with_(ingress={**INGRESS, "mark_origin": True,
                                          "origin_header": "x-from"}), environ={})
    assert s.ingress is not None
    marker = origin_marker(s.ingress, "eu-west-1")
    assert marker == ("x-from", b"eu-west-1")
    recs = [rec(0), rec(1, ("a", b"1"), ("a", None), ("x-from", b"other")), rec(2),
            rec(3, ("b", b""))]
    batch = records_to_batch(recs)
    rows = batch_rows(batch, None, marker)
    assert rows is not None
    assert rows.headers == [[marker], [("a", b"1"), ("a", None), ("x-from", b"other"), marker],
                            [marker], [("b", b""), marker]]
    # Everything else is the record as it was; slices and the skip still apply.
    plain = batch_rows(batch, None)
    assert plain is not None
    assert (rows.offsets, rows.keys, rows.values, rows.timestamps) == \
        (plain.offsets, plain.keys, plain.values, plain.timestamps)
    assert plain.headers == [None, [("a", b"1"), ("a", None), ("x-from", b"other")], None,
                             [("b", b"")]]
    part = batch_rows(batch.slice(1, 3), 1, marker)
    assert part is not None and part.offsets == [2, 3]
    assert part.headers == [[marker], [("b", b""), marker]]
    bare = batch_rows(records_to_batch([rec(5), rec(6)]), None, marker)
    assert bare is not None and bare.headers == [[marker], [marker]]


# --- egress: the filter --------------------------------------------------------------


def _metrics() -> Any:
    from egress.metrics import EgressMetrics

    return EgressMetrics(Metrics())


def test_skipped_origin_looks_at_every_origin_header_and_nothing_else() -> None:
    skip = {b"b"}
    assert skipped_origin([(H, b"b")], H, skip) == b"b"
    assert skipped_origin([(H, b"c")], H, skip) is None
    assert skipped_origin([("other", b"b")], H, skip) is None
    assert skipped_origin([(H, None)], H, skip) is None
    assert skipped_origin([(H, b"c"), (H, b"b")], H, skip) == b"b"
    assert skipped_origin([(H.upper(), b"b")], H, skip) is None


def test_filter_keeps_order_counts_by_origin_and_returns_the_run_when_nothing_skips() -> None:
    m = _metrics()
    f = OriginFilter(H, ["b", "c"], m, "a")
    run: list[Message] = [FakeMessage(r) for r in (
        rec(0), rec(1, (H, b"b")), rec(2, (H, b"d")), rec(3, ("x", b"1"), (H, b"c")),
        rec(4, (H, b"b")), rec(5, ("x", b"b")))]
    kept = f.keep("t", run)
    assert [msg.offset() for msg in kept] == [0, 2, 5]
    assert m.registry.value("replicator_egress_origin_skipped_total",
                            {"region": "a", "topic": "t", "origin": "b"}) == 2
    assert m.registry.value("replicator_egress_origin_skipped_total",
                            {"region": "a", "topic": "t", "origin": "c"}) == 1
    plain: list[Message] = [FakeMessage(rec(o)) for o in range(3)]
    assert f.keep("t", plain) is plain
    others: list[Message] = [FakeMessage(rec(0, (H, b"d")))]
    assert f.keep("t", others) is others


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def skipping_loop(h: Harness) -> PollLoop:
    from tests.unit.egress.test_poll_loop import FakeConsumer

    loop = PollLoop(FakeConsumer(), {("t", 0): h.writer},  # type: ignore[arg-type]
                    CommitService(), queue.SimpleQueue[SegmentOutcome](), h.m, "r1",
                    FlowLimits.for_budget(10**9), lambda: h.now, lambda _now: None,
                    lambda _t, _p: Future())
    loop.skip = OriginFilter(H, ["b"], h.m, "r1")
    return loop


FROM_B = (H, b"b")


def test_skipped_records_are_holes_and_segments_still_touch(h: Harness) -> None:
    loop = skipping_loop(h)
    from_b = FROM_B

    def fetch(*recs: Record) -> None:
        loop._dispatch(Fetched(runs={("t", 0): [FakeMessage(r) for r in recs]}), h.now)

    fetch(rec(0), rec(1), rec(2, from_b), rec(3), rec(4, from_b), rec(5, from_b))
    h.writer.close(CloseReason.AGE)
    h.settle()
    fetch(rec(6, from_b))            # a run of nothing but skipped records: no segment
    assert h.writer.segment is None
    fetch(rec(7), rec(8, ("other", b"b")), rec(9, from_b))
    h.writer.close(CloseReason.AGE)
    h.settle()
    keys = [SegmentKey.parse(k) for k in h.final_keys()]
    assert [(k.start, k.end) for k in keys] == [(0, 3), (4, 8)]
    # Each commit goes past the skipped records after the segment; its metadata keeps
    # where the next segment starts.
    assert h.commits == [6, 10]
    assert h.next_segments == {6: 4, 10: 9}
    assert h.m.registry.value("replicator_egress_origin_skipped_total",
                              {"region": "r1", "topic": "t", "origin": "b"}) == 5


def test_a_partition_of_nothing_but_skipped_records_commits_past_them(h: Harness) -> None:
    # Active-active: the recent records of a partition all came from the other region. No
    # segment opens, yet the commit must move past them (or a restart reads them again,
    # and once retention deletes them reports them as lost), with the next segment's start
    # kept in the commit's metadata so the segments still touch.
    loop = skipping_loop(h)

    def fetch(*recs: Record) -> None:
        loop._dispatch(Fetched(runs={("t", 0): [FakeMessage(r) for r in recs]}), h.now)

    fetch(rec(0), rec(1))
    h.writer.close(CloseReason.AGE)
    h.settle()
    assert h.commits == [2]
    fetch(*[rec(o, FROM_B) for o in range(2, 50)])
    loop._tick(h.now)
    h.settle()
    assert h.commits == [2, 50] and h.next_segments == {50: 2}
    fetch(*[rec(o, FROM_B) for o in range(50, 60)])
    loop._tick(h.now + 1)                       # within SKIP_COMMIT_INTERVAL: not yet
    h.settle()
    assert h.commits == [2, 50]
    h.now += 10
    loop._tick(h.now)
    h.settle()
    assert h.commits == [2, 50, 60] and h.next_segments[60] == 2
    # A restart from that commit: fetched from 60, the next segment named from 2.
    from egress.commits import next_segment_start
    from egress.partition_writer import PartitionWriter

    w = PartitionWriter(h.writer.ref, h.limits, next_segment_start(60, "next-segment-start=2"),
                        ctx=h.ctx, metrics=h.m.for_partition("r1", "t", 0), commit=h._commit,
                        position=60)
    w.append([FakeMessage(rec(60)), FakeMessage(rec(61))], h.now)
    w.close(CloseReason.AGE)
    assert w.queue.wait_idle(10)
    keys = sorted((k.start, k.end) for k in map(SegmentKey.parse, h.final_keys()))
    assert keys == [(0, 1), (2, 61)]              # touching: no gap for ingress
