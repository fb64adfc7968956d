"""A topic deleted and created again while egress's fetch went on into the new log (no
reset): the dropped segment costs only the earlier topic's records past the read position,
up to its last known high watermark (``egress.recreate_loss``; docs/architecture.md,
"Topic incarnations"). Never a gap reported as a loss, never a loss unreported.
"""

from __future__ import annotations

import logging

import pytest

from egress.partition_writer import PartitionWriter
from egress.recreate_loss import RecreateLoss, recreate_loss, source_end
from egress.rotation import CloseReason
from replicator.core.kafka import OFFSET_BEGINNING, Fetched
from replicator.core.keys import PartitionRef
from tests.unit.egress.fakes import FakeMessage, Harness, SourceAdmin, messages, records
from tests.unit.egress.test_incarnation_ids import HOLD, keys, lost, writer_with
from tests.unit.egress.test_poll_loop import PositionConsumer, loop_for

OLD = "data/r1/t/0/0/00000000000000000000-00000000000000000019"


def assigned(admin: SourceAdmin) -> Harness:
    """A writer assigned while the topic is ``IdA``, its first 20 records archived with the
    high watermark of their fetch (``high``) known before the segment is named."""
    h = writer_with(admin)
    h.writer = PartitionWriter(PartitionRef("data", "r1", "t", 0), h.limits, None, ctx=h.ctx,
                               metrics=h.m.for_partition("r1", "t", 0), commit=h._commit,
                               topic_id="IdA")
    h.writer.hold_seconds = HOLD
    return h


def archive_first(h: Harness, high: int | None, position: int = 20) -> None:
    h.writer.append(messages(records(range(20))), now=0.0)
    if high is not None:
        h.writer.note_source_end(high, position)
    h.writer.close(CloseReason.AGE)
    h.settle()
    assert keys(h) == [OLD]


def fetch_on_into_the_new_topic(h: Harness, admin: SourceAdmin, high: int | None,
                                caplog: pytest.LogCaptureFixture, first: int = 20) -> None:
    before = keys(h)
    admin.id = "IdB"                    # deleted and created again with 30 records
    h.writer.append(messages(records(range(first, 30), size=9)), now=0.0)
    if high is not None:
        h.writer.note_source_end(high, 30)   # the new topic's: after the last id read
    h.writer.close(CloseReason.AGE)
    with caplog.at_level(logging.WARNING):
        h.settle()
    assert keys(h) == before            # dropped, not archived as IdA's
    assert h.writer.rewind_offset() == OFFSET_BEGINNING


def either(h: Harness) -> float:
    return float(h.writer.metrics.unattributed._value.get())


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


def test_the_earlier_topic_read_to_its_end_loses_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = SourceAdmin()
    h = assigned(admin)
    try:
        archive_first(h, 20)
        fetch_on_into_the_new_topic(h, admin, 30, caplog)
        assert lost(h) == 0
        assert errors(caplog) == []
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
                  and "recreated" in r.getMessage()]
        assert len(warned) == 1 and "IdA" in warned[0] and "IdB" in warned[0]
        assert "the new topic is read from its oldest record" in warned[0]
        # Fetched after IdA's id was last read: either topic's, never claimed lost.
        assert "offsets 20..29 were fetched after topic IdA's id was last read" in warned[0]
        assert either(h) == 10
        # The new topic read again from its oldest record: every record of both archived.
        assert h.writer.rewind() == OFFSET_BEGINNING
        h.writer.append(messages(records(range(30), size=9)), now=0.0)
        h.writer.close(CloseReason.AGE)
        h.settle()
    finally:
        h.close()
    assert keys(h) == [
        OLD, "data/r1/t/_incarnations/IdB/0/0/00000000000000000000-00000000000000000029"]


def test_the_earlier_topics_records_past_the_read_position_are_lost_exactly(
        caplog: pytest.LogCaptureFixture) -> None:
    # The fetch of 0-19 said the log reached 25: 20-24 were never fetched.
    admin = SourceAdmin()
    h = assigned(admin)
    try:
        archive_first(h, 25)
        fetch_on_into_the_new_topic(h, admin, 30, caplog)
        assert lost(h) == 5                 # H - p, not the 10 records of the new topic
        (error,) = errors(caplog)
        assert "records 20..24 (5)" in error and "IdA" in error and "IdB" in error
        assert "upper bound" not in error
        assert "offsets 25..29 were fetched after" in error and either(h) == 5
    finally:
        h.close()


def test_an_unknown_end_reports_the_fetched_records_as_an_upper_bound(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = SourceAdmin()
    h = assigned(admin)
    try:
        archive_first(h, None)
        fetch_on_into_the_new_topic(h, admin, None, caplog)
        assert lost(h) == 10
        (error,) = errors(caplog)
        assert "records 20..29 (10, an upper bound" in error
        assert either(h) == 0                # all counted lost already
    finally:
        h.close()


def test_a_watermark_fetched_after_the_last_id_read_never_bounds_the_earlier_topic(
        caplog: pytest.LogCaptureFixture) -> None:
    # The new topic's high watermark (30, noted before the naming that finds IdB) is not
    # the earlier topic's: the bound stays the one known when IdA was last read (25).
    admin = SourceAdmin()
    h = assigned(admin)
    try:
        archive_first(h, 25)
        fetch_on_into_the_new_topic(h, admin, 40, caplog)
        assert lost(h) == 5
    finally:
        h.close()


def test_a_commit_marker_after_the_last_record_is_no_record() -> None:
    # A transactional source: records 0-19, the commit marker at 20, high watermark 21;
    # the consumer's position is past the marker.
    assert source_end(21, 21, 20) == 20
    assert source_end(21, 20, 20) == 21    # not handed everything yet: 20 may be a record
    assert source_end(21, None, 20) == 21
    assert source_end(-1001, 21, 20) is None


def test_a_run_dropped_while_rewinding_never_lowers_the_known_end(
        caplog: pytest.LogCaptureFixture) -> None:
    # 0-9 archived; 10-19 fail their copy; 20-29 fetched meanwhile are dropped (the
    # consumer read to the high watermark 30, the writer's position stayed at 20): the
    # earlier topic reached 30, not 20.
    admin = SourceAdmin()
    h = assigned(admin)
    try:
        h.writer.append(messages(records(range(10))), now=0.0)
        h.writer.note_source_end(10, 10)
        h.writer.close(CloseReason.AGE)
        h.settle()
        h.store.fail["copy"] = 3
        h.writer.append(messages(records(range(10, 20))), now=0.0)
        h.writer.note_source_end(20, 20)
        h.writer.close(CloseReason.AGE)
        h.settle()
        h.store.fail.pop("copy")
        assert h.writer.failed is not None
        h.writer.append(messages(records(range(20, 30))), now=0.0)     # dropped
        h.writer.note_source_end(30, 30)
        assert h.writer.rewind() == 10
        h.writer.append(messages(records(range(10, 20))), now=0.0)     # IdA's again
        h.writer.close(CloseReason.AGE)
        h.settle()                   # named: IdA read, the known end is 30
        fetch_on_into_the_new_topic(h, admin, 40, caplog, first=20)
        assert lost(h) == 10         # IdA's 20-29, fetched once and dropped, are gone
    finally:
        h.close()


def test_the_loss_is_the_range_between_the_read_position_and_the_known_end() -> None:
    assert recreate_loss(20, 20, 29, 10) is None
    assert recreate_loss(20, 15, 29, 10) is None
    assert recreate_loss(20, 25, 29, 10) == RecreateLoss(20, 24, 5, exact=True)
    assert recreate_loss(20, 50, 29, 10) == RecreateLoss(20, 49, 30, exact=True)
    assert recreate_loss(20, None, 29, 10) == RecreateLoss(20, 29, 10, exact=False)


class Source(PositionConsumer):
    """Fetches prepared runs; each fetch response says the high watermark ``high``."""

    def __init__(self) -> None:
        super().__init__(0)
        self.runs: list[tuple[list[FakeMessage], int]] = []

    def fetch(self, max_messages: int, timeout: float) -> Fetched:
        if not self.runs:
            return Fetched()
        run, high = self.runs.pop(0)
        self.highs[("t", 0)] = high
        self.at = run[-1].offset() + 1
        return Fetched(runs={("t", 0): run})  # type: ignore[dict-item]


@pytest.mark.parametrize(("high", "lost_records"), [
    (20, 0),     # the fetch of 0-19 reached the log's end
    (21, 0),     # a transactional source: a commit marker at 20, the position past it
    (25, 5),     # 20-24 were in the earlier topic, never fetched
])
def test_the_poll_loop_gives_each_fetchs_high_watermark_to_its_writer(
        high: int, lost_records: int, caplog: pytest.LogCaptureFixture) -> None:
    admin = SourceAdmin()
    h = assigned(admin)
    source = Source()
    loop = loop_for(h, source)
    try:
        source.runs.append((messages(records(range(20))), high))
        loop.turn()
        if high == 21:
            source.at = 21                   # the consumer read on past the marker
            loop._note_source_end(h.writer)  # the next (empty) fetch's
        h.writer.close(CloseReason.AGE)
        h.settle()
        assert keys(h) == [OLD]
        admin.id = "IdB"
        source.runs.append((messages(records(range(20, 30), size=9)), 30))
        loop.turn()
        h.writer.close(CloseReason.AGE)
        h.settle()
        assert keys(h) == [OLD]
        assert lost(h) == lost_records
    finally:
        h.close()


def test_records_of_the_earlier_topic_fetched_after_the_last_id_read_are_never_silent(
        caplog: pytest.LogCaptureFixture) -> None:
    # IdA's 20-24 fetched after the last id read (the naming of 0-19), then IdA deleted and
    # IdB created with 30 records before the segment is named: 20-29 may be either topic's.
    # Not claimed lost (the usual case is the one above, a gap), not passed over either.
    admin = SourceAdmin()
    h = assigned(admin)
    try:
        archive_first(h, 20)
        h.writer.append(messages(records(range(20, 25))), now=0.0)   # IdA's 20-24
        h.writer.note_source_end(25, 25)
        fetch_on_into_the_new_topic(h, admin, 30, caplog, first=25)   # IdB's 25-29
        assert lost(h) == 0 and errors(caplog) == []
        assert either(h) == 10
        assert any("offsets 20..29 were fetched after topic IdA's id was last read"
                   in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    finally:
        h.close()


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "a documented limit (docs/architecture.md, 'Topic incarnations'): records the earlier "
    "topic received after the last id read (the previous segment's naming), fetched into "
    "the open segment, then deleted with the topic before that segment is named, cannot "
    "be told from the new topic's: the last known end is the one before that id read, so "
    "they are reported as either topic's (egress_recreate_unattributed_positions_total), "
    "not counted lost. Telling them apart needs the topic id with each fetch"))
def test_records_of_the_earlier_topic_fetched_after_the_last_id_read(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = SourceAdmin()
    h = assigned(admin)
    try:
        archive_first(h, 20)
        h.writer.append(messages(records(range(20, 25))), now=0.0)   # IdA's 20-24
        h.writer.note_source_end(25, 25)
        fetch_on_into_the_new_topic(h, admin, 30, caplog, first=25)   # IdB's 25-29
        assert lost(h) == 5
    finally:
        h.close()


def resumed_at_the_end(admin: SourceAdmin) -> Harness:
    """A writer assigned at the end of ``IdA`` (its commit at 20, all archived before)."""
    h = writer_with(admin)
    h.writer = PartitionWriter(PartitionRef("data", "r1", "t", 0), h.limits, 20, ctx=h.ctx,
                               metrics=h.m.for_partition("r1", "t", 0), commit=h._commit,
                               topic_id="IdA")
    h.writer.hold_seconds = HOLD
    return h


def test_an_idle_partitions_watermark_is_the_earlier_topics_end(
        caplog: pytest.LogCaptureFixture) -> None:
    # Restarted at the end of IdA: no record, so no segment names (no id read) before the
    # recreate; the idle fetches said the log ends at 20.
    admin = SourceAdmin()
    h = resumed_at_the_end(admin)
    loop = loop_for(h, Source())
    try:
        source = loop.consumer
        assert isinstance(source, Source)
        source.highs[("t", 0)], source.at = 20, -1001
        # The idle partition's tick: nothing handed out since the assignment, so the
        # client's position is unknown; the writer reads from 20.
        loop._update_gauges([h.writer])
        fetch_on_into_the_new_topic(h, admin, 30, caplog)
        assert lost(h) == 0 and errors(caplog) == []
        assert either(h) == 10
    finally:
        h.close()


def test_a_fetch_response_not_handed_out_yet_is_not_idle(
        caplog: pytest.LogCaptureFixture) -> None:
    # The tick comes after the client received IdB's 20-29 (its watermark 30) and before
    # the poll hands them out: the consumer's position is still 20. Not IdA's end.
    admin = SourceAdmin()
    h = resumed_at_the_end(admin)
    try:
        h.writer.note_source_end(20, 20)         # idle at IdA's end
        admin.id = "IdB"
        h.writer.note_source_end(30, None)       # the tick, before the run
        fetch_on_into_the_new_topic(h, admin, 30, caplog)
        assert lost(h) == 0 and errors(caplog) == []
        assert either(h) == 10
    finally:
        h.close()


def test_a_watermark_after_a_run_since_the_last_id_read_is_not_idle(
        caplog: pytest.LogCaptureFixture) -> None:
    # IdB's 20-29 fetched (no id read since), then an empty fetch at 30 says 30: the new
    # topic's end, never IdA's.
    admin = SourceAdmin()
    h = resumed_at_the_end(admin)
    try:
        h.writer.note_source_end(20, 20)
        admin.id = "IdB"
        h.writer.append(messages(records(range(20, 30), size=9)), now=0.0)
        h.writer.note_source_end(30, 30)
        h.writer.note_source_end(30, 30)         # idle, but after an unread run
        h.writer.close(CloseReason.AGE)
        with caplog.at_level(logging.WARNING):
            h.settle()
        assert lost(h) == 0 and either(h) == 10
    finally:
        h.close()
