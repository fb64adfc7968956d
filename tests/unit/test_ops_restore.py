"""``replicator/ops/restore.py`` without a broker: listing and planning on the in-memory
store, record times of segments without footer times, the batch cut."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Checkpoint, parse_checkpoint_key
from replicator.ops.restore import _cut, make_plan, segment_times
from replicator.ops.restore_plan import ArchivedSegment, PartitionPlan, Plan, RestoreRange, Step
from replicator.ops.restore_request import RestoreMark, RestoreRequest, overlap_refusals, overlaps


def key(start: int, end: int, level: int = 0) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "orders", 0, level, start, end)


def recs(start: int, n: int, t0: int) -> list[Record]:
    return [Record(start + i, t0 + i, b"k", b"v") for i in range(n)]


def publish(store: MemoryObjectStore, k: SegmentKey, t0: int) -> None:
    upload = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    upload.write_batch(records_to_batch(recs(k.start, k.span, t0)))
    publish_segment(store, upload.finish(SegmentMetadata.for_key(k, k.span)).key, k)


def put_without_times(store: MemoryObjectStore, k: SegmentKey, t0: int) -> None:
    """A segment as written before footers had record times (a bare writer)."""
    stream = io.BytesIO()
    w = get_format("arrow").open_writer(stream, WriterOptions())
    w.write_batch(records_to_batch(recs(k.start, k.span, t0)))
    w.finish(SegmentMetadata.for_key(k, k.span))
    store.put(k.to_key(), stream.getvalue())


def request(rng: RestoreRange) -> RestoreRequest:
    return RestoreRequest("us-east-1", "orders", "orders.restored", "cp", rng)


def test_time_bounds_read_footers_and_scan_segments_without_times() -> None:
    store = MemoryObjectStore("b")
    publish(store, key(0, 9), 1000)
    put_without_times(store, key(10, 19), 2000)
    publish(store, key(20, 29), 3000)
    assert segment_times(store, key(0, 9)) == ((1000, 1009), False)
    assert segment_times(store, key(10, 19)) == ((2000, 2009), True)
    notes: list[str] = []
    p = make_plan(store, "data", request(RestoreRange(from_time=2005)), note=notes.append)
    assert [s.segment.key.start for s in p.steps] == [10, 20]
    assert len(notes) == 1 and "read 1 segment(s) to find their record times" in notes[0]
    assert str(key(10, 19)) in notes[0]
    # Without time bounds nothing is read beyond the listing.
    notes.clear()
    p = make_plan(store, "data", request(RestoreRange(from_offset=5)), note=notes.append)
    assert [(s.first, s.last) for s in p.steps] == [(5, 9), (10, 19), (20, 29)]
    assert notes == []


def test_cut_keeps_the_offset_window_and_the_time_bounds() -> None:
    batch = records_to_batch(recs(100, 10, 5000))
    assert _cut(batch, 200, 300, RestoreRange()) is None
    kept, dropped = _cut(batch, 103, 106, RestoreRange()) or (None, -1)
    assert kept is not None and kept.column("offset").to_pylist() == [103, 104, 105, 106]
    assert dropped == 0
    kept, dropped = _cut(batch, 100, 109, RestoreRange(from_time=5002, to_time=5004)) \
        or (None, -1)
    assert kept is not None and kept.column("offset").to_pylist() == [102, 103, 104]
    assert dropped == 7


MONDAY = RestoreRange(from_time=1_700_006_400_000, to_time=1_700_092_799_999)
TUESDAY = RestoreRange(from_time=1_700_092_800_000, to_time=1_700_179_199_999)


def test_checkpoint_keys_name_the_whole_request() -> None:
    r = request(RestoreRange(from_offset=120, to_offset=287))
    assert r.checkpoint_key(3) == "restore:us-east-1:orders:3:orders.restored:120..287:.."
    # Monday's and Tuesday's windows into one topic are two restores, not one.
    monday, tuesday = request(MONDAY), request(TUESDAY)
    assert monday.checkpoint_key(0) == \
        "restore:us-east-1:orders:0:orders.restored:..:1700006400000..1700092799999"
    assert monday.checkpoint_key(0) != tuesday.checkpoint_key(0)
    assert monday.checkpoint_key(0).startswith(monday.checkpoint_prefix(0))
    assert tuesday.checkpoint_key(0).startswith(monday.checkpoint_prefix(0))
    # Never read as an ingress checkpoint (those have three or four parts).
    assert parse_checkpoint_key(monday.checkpoint_key(0)) is None
    assert parse_checkpoint_key(r.checkpoint_key(3)) is None


bounds = st.one_of(st.none(), st.integers(0, 5))
ranges = st.builds(lambda a, b, c, d: RestoreRange(*sorted_pair(a, b), *sorted_pair(c, d)),
                   bounds, bounds, bounds, bounds)


def sorted_pair(a: int | None, b: int | None) -> tuple[int | None, int | None]:
    return (min(a, b), max(a, b)) if a is not None and b is not None else (a, b)


@given(ranges, ranges, st.integers(0, 3), st.integers(0, 3),
       st.sampled_from(["t", "u"]), st.sampled_from(["t", "u"]))
def test_one_checkpoint_key_per_request(r1: RestoreRange, r2: RestoreRange, p1: int, p2: int,
                                        to1: str, to2: str) -> None:
    """Property: two requests share a partition's checkpoint key exactly when they restore
    the same source partition, with the same offset and time bounds, into the same topic;
    and a key always starts with its partition's prefix (no prefix matches another's)."""
    a = RestoreRequest("us-east-1", "orders", to1, "cp", r1)
    b = RestoreRequest("us-east-1", "orders", to2, "cp", r2)
    same = (r1, p1, to1) == (r2, p2, to2)
    assert (a.checkpoint_key(p1) == b.checkpoint_key(p2)) == same
    assert a.checkpoint_key(p1).startswith(a.checkpoint_prefix(p1))
    assert a.checkpoint_key(p1).startswith(b.checkpoint_prefix(p2)) == \
        ((p1, to1) == (p2, to2))


def test_one_writer_per_target_partition() -> None:
    """Disjoint --partitions of one restore (or another range) use distinct transactional
    ids, so they run side by side; the same target partition is one id, so a second
    writer fences the first before it reads the checkpoints."""
    r = request(RestoreRange())
    assert r.transactional_id(0) == "replicator-restore:orders.restored:0"
    assert r.transactional_id(0) != r.transactional_id(1)
    assert request(MONDAY).transactional_id(1) == request(TUESDAY).transactional_id(1)


times = st.one_of(st.none(), st.tuples(st.integers(0, 10**13), st.integers(0, 10**13)))


@given(ranges, st.integers(0, 10**6), st.integers(0, 10**6), times)
def test_a_restore_mark_round_trips(rng: RestoreRange, origin: int, offset: int,
                                    span: tuple[int, int] | None) -> None:
    mark = RestoreMark(rng, origin, offset, "seg", span, datetime(2026, 11, 25, tzinfo=UTC))
    assert RestoreMark.decode(mark.encode()) == mark
    # The value is a checkpoint too: tools that list checkpoints read it as one.
    cp = Checkpoint.decode(mark.encode())
    assert (cp.offset, cp.origin) == (offset, origin)


def test_a_checkpoint_without_the_restore_object_is_refused() -> None:
    cp = Checkpoint(5, "", datetime(2026, 11, 25, tzinfo=UTC), origin=0)
    with pytest.raises(ValueError, match="not a restore checkpoint"):
        RestoreMark.decode(cp.encode())


def window(o1: int | None, o2: int | None, t1: int | None, t2: int | None) -> RestoreRange:
    return RestoreRange(*sorted_pair(o1, o2), *sorted_pair(t1, t2))


opt = st.one_of(st.none(), st.integers(0, 20))


@given(st.lists(st.integers(0, 20), min_size=1, max_size=20), opt, opt, opt, opt, opt, opt,
       opt, opt, st.integers(0, 20))
def test_overlap_is_found_whenever_a_record_would_be_restored_twice(
        ts: list[int], a1: int | None, a2: int | None, at1: int | None, at2: int | None,
        b1: int | None, b2: int | None, bt1: int | None, bt2: int | None, cut: int) -> None:
    """Property, against a brute-force model: restore A reached position ``cut`` of its
    range; a request B sharing a record with what A restored is an overlap. Disjoint time
    windows, or disjoint positions, never are (Monday then Tuesday restores both)."""
    n = len(ts)
    a, b = window(a1, a2, at1, at2), window(b1, b2, bt1, bt2)

    def positions(r: RestoreRange) -> tuple[int, int]:
        return (r.from_offset if r.from_offset is not None else 0,
                r.to_offset if r.to_offset is not None else n - 1)

    (fa, la), (fb, lb) = positions(a), positions(b)
    reached = min(la, fa - 1 + cut)
    done = [o for o in range(fa, reached + 1) if o < n and a.keeps_time(ts[o])]
    span = (min(ts[o] for o in done), max(ts[o] for o in done)) if done else None
    mark = RestoreMark(a, fa, reached, "", span, datetime(2026, 11, 25, tzinfo=UTC))
    wanted = {o for o in range(fb, lb + 1) if o < n and b.keeps_time(ts[o])}
    found = overlaps(mark, b, fb, lb)
    if wanted & set(done):
        assert found
    disjoint_times = (a.to_time is not None and b.from_time is not None
                      and a.to_time < b.from_time) or \
        (b.to_time is not None and a.from_time is not None and b.to_time < a.from_time)
    if disjoint_times or la < fb or lb < fa or not done:
        assert not found


def test_overlap_refusals_name_the_other_restore_and_spare_the_own_key() -> None:
    done = {0: {request(MONDAY).checkpoint_key(0): RestoreMark(
        MONDAY, 0, 499, "", (1_700_006_400_000, 1_700_092_700_000),
        datetime(2026, 11, 25, tzinfo=UTC))}}
    p = make_plan_over(0, 999)
    assert overlap_refusals(request(TUESDAY), p, done) == []
    assert overlap_refusals(request(MONDAY), p, done) == []  # its own: a resume
    noon = RestoreRange(from_time=1_700_049_600_000, to_time=1_700_135_999_999)
    [refusal] = overlap_refusals(request(noon), p, done)
    assert refusal.startswith("us-east-1/orders[0]: another restore into orders.restored "
                              f"({request(MONDAY).checkpoint_key(0)}) already restored "
                              "positions 0-499")
    assert "--force" in refusal
    forced = RestoreRequest("us-east-1", "orders", "orders.restored", "cp", noon, force=True)
    assert overlap_refusals(forced, p, done) == []


def make_plan_over(first: int, last: int) -> Plan:
    seg = ArchivedSegment(key(first, last), 100)
    return Plan(RestoreRange(), (PartitionPlan(0, first, last, (Step(seg, first, last),)),))


def test_cli_option_parsing_and_bad_input_exit_2(tmp_path: object) -> None:
    import click
    from click.testing import CliRunner

    from replicator.cli.main import main
    from replicator.cli.restore import parse_partitions, parse_rate, parse_time

    assert parse_partitions("0,3-5, 2") == (0, 2, 3, 4, 5)
    assert parse_time("1700000000000", "--from-time") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20Z", "--from-time") == 1_700_000_000_000
    assert parse_rate("50MB/s") == parse_rate("50MB") > 0
    with pytest.raises(click.BadParameter, match="'5-3' is not a partition"):
        parse_partitions("1,5-3")
    with pytest.raises(click.BadParameter, match="with a zone"):
        parse_time("2023-11-14T22:13:20", "--to-time")
    base = ["restore", "--config", "nonexistent.toml", "--source-region", "us-east-1",
            "--topic", "t", "--to-topic", "u"]
    runner = CliRunner()
    for extra, says in ((["--partitions", "x"], "--partitions"),
                        (["--from-time", "yesterday"], "--from-time"),
                        (["--from-offset", "9", "--to-offset", "3"], "9 is after"),
                        (["--rate", "fast"], "--rate")):
        res = runner.invoke(main, base + extra)
        assert res.exit_code == 2, (extra, res.output)
        assert says in res.output


def test_cat_json_marks_bytes_that_are_not_text() -> None:
    from replicator.ops.segments import bytes_json, record_json

    assert bytes_json(None) is None and bytes_json(b"") == ""
    assert bytes_json("é".encode()) == "é"
    assert bytes_json(b"\xff") == {"base64": "/w=="}
    r = Record(7, 1000, None, b"\x00\xff", (("a", None), ("a", b"x")), 2)
    assert record_json(r) == {"offset": 7, "timestamp": 1000, "timestamp_type": 2, "key": None,
                              "value": {"base64": "AP8="}, "headers": [["a", None], ["a", "x"]]}


def test_resuming_checks_the_checkpoint_against_the_archive_as_it_is_now() -> None:
    """An open --from-offset is the archive's first position at each run: when that moved
    past what the restore reached, the positions in between are refused (or, with
    --allow-gaps, skipped loudly), never passed over."""
    from replicator.core.settings import KafkaSettings
    from replicator.ops.pace import Progress
    from replicator.ops.restore import Restorer
    from replicator.ops.restore_request import RestoreError

    def restorer(allow_gaps: bool) -> Restorer:
        req = RestoreRequest("us-east-1", "orders", "orders.restored", "cp", RestoreRange(),
                             allow_gaps=allow_gaps)
        return Restorer(KafkaSettings(brokers="127.0.0.1:1"), MemoryObjectStore("b"), "data",
                        req, progress=Progress(0, 0, 0.0))

    def mark(origin: int, offset: int) -> RestoreMark:
        return RestoreMark(RestoreRange(), origin, offset, "", (1, 2),
                           datetime(2026, 11, 25, tzinfo=UTC))

    assert restorer(False)._resume(0, 50, mark(0, 99), "here") == 99
    with pytest.raises(RestoreError, match="positions 100-199 are no longer in the archive"):
        restorer(False)._resume(0, 200, mark(0, 99), "here")
    r = restorer(True)
    assert r._resume(0, 200, mark(0, 99), "here") == 99
    assert r.progress is not None and r.progress.gaps == [(0, 100, 199)]
    with pytest.raises(RestoreError, match="this restore started at offset 10"):
        restorer(False)._resume(0, 0, mark(10, 99), "here")


def test_a_restore_reads_one_incarnation_never_two_merged() -> None:
    # The topic was deleted and created again: positions 0-9 exist in both incarnations.
    from dataclasses import replace as dc_replace

    from replicator.core.wire import Incarnation, TopicMetadata
    from replicator.ops.incarnations import choose
    from replicator.ops.restore import list_archive
    from replicator.ops.restore_request import key_incarnation
    from replicator.ops.segments import summarize
    store = MemoryObjectStore("b")
    publish(store, key(0, 9), 1_000)
    later = dc_replace(key(0, 9), incarnation="IdB")
    publish(store, later, 5_000)
    store.put("data/us-east-1/orders/_topic.json", TopicMetadata(
        1, incarnations=(Incarnation("IdA", ""), Incarnation("IdB", "IdB"))).encode())
    live = choose(store, "data", "us-east-1", "orders", None)
    assert (live.label, live.topic_id) == ("IdB", "IdB") and "IdB" in live.describe()
    assert choose(store, "data", "us-east-1", "orders", "IdA").label == ""
    with pytest.raises(ValueError, match="IdA, IdB"):
        choose(store, "data", "us-east-1", "orders", "IdC")
    assert [s.key for s in list_archive(store, "data", "us-east-1", "orders")] == [key(0, 9)]
    assert [s.key for s in list_archive(store, "data", "us-east-1", "orders", "IdB")] == \
        [later]
    req = RestoreRequest("us-east-1", "orders", "orders.restored", "cp", incarnation="IdB")
    p = make_plan(store, "data", req)
    assert [s.segment.key for pp in p.partitions for s in pp.steps] == [later]
    # Restores of the same positions of two incarnations are two restores, not an overlap.
    assert req.checkpoint_key(0).endswith("@IdB") and key_incarnation(req.checkpoint_key(0)) \
        == "IdB"
    assert key_incarnation(request(RestoreRange()).checkpoint_key(0)) == ""
    done = {0: {request(RestoreRange()).checkpoint_key(0): RestoreMark(
        RestoreRange(), 0, 9, "", (1_000, 1_009), datetime(2026, 11, 25, tzinfo=UTC))}}
    assert overlap_refusals(req, p, done) == []
    # segments ls: one summary per incarnation, each named.
    names = [(s.name, s.levels[0].count) for s in summarize(store.list("data/"))]
    assert names == [("orders", 1), ("orders@IdB", 1)]


def test_the_snapshot_restored_is_part_of_the_checkpoint_key() -> None:
    from dataclasses import replace

    from replicator.ops.restore_request import key_incarnation
    r = request(RestoreRange(from_offset=1, to_offset=9))
    a, b = replace(r, snapshot=11), replace(r, snapshot=12)
    assert a.checkpoint_key(0) == "restore:us-east-1:orders:0:orders.restored:1..9:..#11"
    assert len({r.checkpoint_key(0), a.checkpoint_key(0), b.checkpoint_key(0)}) == 3
    inc = replace(a, incarnation="IdB")
    assert inc.checkpoint_key(0).endswith("#11@IdB") and key_incarnation(
        inc.checkpoint_key(0)) == "IdB"
    assert key_incarnation(a.checkpoint_key(0)) == ""


def test_a_resumed_restore_never_switches_incarnation_under_a_recreate() -> None:
    # A restore of the live topic (the first incarnation) was interrupted after position 499;
    # the topic was then deleted and created again, and the same command is run to resume.
    from dataclasses import replace

    from replicator.ops.restore_request import incarnation_refusals
    started = request(RestoreRange())
    done = {0: {started.checkpoint_key(0): RestoreMark(
        RestoreRange(), 0, 499, "", (1_000, 1_499), datetime(2026, 11, 25, tzinfo=UTC))}}
    p = make_plan_over(0, 999)
    ids = (("", "IdA"), ("IdB", "IdB"))
    rerun = replace(started, incarnation="IdB", incarnation_named=False, topic_ids=ids)
    [refusal] = incarnation_refusals(rerun, p, done)
    assert "started on incarnation IdA" in refusal and "live incarnation is now IdB" in refusal
    assert "--incarnation IdA to resume" in refusal and started.checkpoint_key(0) in refusal
    # --force accepts duplicates, not another topic's records.
    assert incarnation_refusals(replace(rerun, force=True), p, done) == [refusal]
    # Named: the operator chose (IdA resumes its own key, IdB is another restore).
    assert incarnation_refusals(replace(rerun, incarnation_named=True), p, done) == []
    resume = replace(started, incarnation="", incarnation_named=True, topic_ids=ids)
    assert incarnation_refusals(resume, p, done) == []
    # Its own checkpoint found (resumed on the live one before): no switch.
    own = {0: {**done[0], rerun.checkpoint_key(0): done[0][started.checkpoint_key(0)]}}
    assert incarnation_refusals(rerun, p, own) == []
    # Another range of the earlier incarnation is another restore, not this one.
    other = replace(rerun, range=RestoreRange(from_offset=5))
    assert incarnation_refusals(other, p, done) == []
    # A later recreate again: started on IdB, now IdC.
    on_b = replace(started, incarnation="IdB")
    done_b = {0: {on_b.checkpoint_key(0): done[0][started.checkpoint_key(0)]}}
    now_c = replace(started, incarnation="IdC", incarnation_named=False,
                    topic_ids=(*ids, ("IdC", "IdC")))
    [refusal] = incarnation_refusals(now_c, p, done_b)
    assert "started on incarnation IdB" in refusal and "now IdC" in refusal


def test_the_cli_tells_restore_whether_the_incarnation_was_named() -> None:
    from replicator.core.wire import Incarnation, TopicMetadata
    from replicator.ops.incarnations import choose
    store = MemoryObjectStore("b")
    store.put("data/us-east-1/orders/_topic.json", TopicMetadata(
        1, incarnations=(Incarnation("IdA", ""), Incarnation("IdB", "IdB"))).encode())
    live = choose(store, "data", "us-east-1", "orders", None)
    assert not live.named and live.topic_ids == (("", "IdA"), ("IdB", "IdB"))
    assert choose(store, "data", "us-east-1", "orders", "IdA").named


def test_the_restorer_refuses_the_switch_before_producing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from replicator.core.settings import KafkaSettings
    from replicator.ops.restore import Restorer
    from replicator.ops.restore_request import RestoreRefused
    started = request(RestoreRange())
    marks = {0: {started.checkpoint_key(0): RestoreMark(
        RestoreRange(), 0, 499, "", (1_000, 1_499), datetime(2026, 11, 25, tzinfo=UTC))}}
    rerun = RestoreRequest("us-east-1", "orders", "orders.restored", "cp", RestoreRange(),
                           incarnation="IdB", incarnation_named=False)
    r = Restorer(KafkaSettings(brokers="127.0.0.1:1"), MemoryObjectStore("b"), "data", rerun)
    monkeypatch.setattr(r, "prepare_topics", lambda plan_: None)
    monkeypatch.setattr(r, "load_marks", lambda parts: marks)
    monkeypatch.setattr(r, "start_producer", lambda part: pytest.fail("produced"))
    with pytest.raises(RestoreRefused, match="started on incarnation the first one"):
        r.run(make_plan_over(0, 999))


def test_a_restore_of_an_earlier_incarnation_never_takes_the_live_topics_configs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The topic had 4 partitions, then was recreated with 2 and other configs: _topic.json
    # holds the live topic's. A target created for the earlier incarnation gets its own
    # partition count and none of the live topic's configs.
    import replicator.ops.restore as restore_mod
    from replicator.core.settings import KafkaSettings
    from replicator.core.wire import Incarnation, TopicMetadata
    from replicator.ops.restore import Restorer
    from replicator.ops.restore_target import source_shape

    meta = TopicMetadata(2, {"max.message.bytes": "5000000", "compression.type": "zstd"},
                         "orders", "us-east-1", incarnations=(
                             Incarnation("IdA", "", partitions=4),
                             Incarnation("IdB", "IdB", partitions=2)))
    earlier, live = source_shape(meta, ""), source_shape(meta, "IdB")
    assert (earlier.partitions, earlier.configs, earlier.configs_known) == (4, {}, False)
    assert (live.partitions, live.configs_known) == (2, True)
    assert live.configs == {"compression.type": "zstd", "max.message.bytes": "5000000"}
    plain = TopicMetadata(3, {"compression.type": "lz4"})
    assert source_shape(plain, "") == source_shape(plain, "x")
    assert source_shape(plain, "").configs == {"compression.type": "lz4"}

    created: list[tuple[str, int, dict[str, str]]] = []

    class FakeAdmin:
        def __init__(self, kafka: object) -> None:
            return

        def list_topics(self) -> list[str]:
            return [t for t, _, _ in created]

        def partition_count(self, topic: str) -> int | None:
            return next((n for t, n, _ in created if t == topic), None)

        def create_topic(self, topic: str, n: int, configs: dict[str, str]) -> bool:
            created.append((topic, n, configs))
            return True

        def effective_topic_config(self, topic: str) -> dict[str, str]:
            return {}

    store = MemoryObjectStore("b")
    store.put("data/us-east-1/orders/_topic.json", meta.encode())
    monkeypatch.setattr(restore_mod, "Admin", FakeAdmin)
    monkeypatch.setattr(restore_mod, "ensure_compacted_topic", lambda *a, **k: None)
    notes: list[str] = []
    r = Restorer(KafkaSettings(brokers="127.0.0.1:1"), store, "data",
                 RestoreRequest("us-east-1", "orders", "orders.restored", "cp",
                                RestoreRange()), note=notes.append)
    monkeypatch.setattr(r, "check_target", lambda *a: None)
    r.prepare_topics(make_plan_over(0, 999))
    [(topic, n, configs)] = created
    assert (topic, n) == ("orders.restored", 4)
    assert "compression.type" not in configs and "max.message.bytes" not in configs
    assert "not recorded" in notes[0]


def test_the_restore_command_run_again_after_a_recreate_exits_2_naming_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The command as typed the first time (no --incarnation), run again after the topic
    # was recreated: the restore it started on IdA is refused, not continued on IdB.
    from dataclasses import replace as dc_replace

    from click.testing import CliRunner

    import replicator.cli.restore as cli_restore
    from replicator.cli.main import main
    from replicator.core.settings import load_settings
    from replicator.core.wire import Incarnation, TopicMetadata
    from replicator.ops.restore_request import RestoreRefused, incarnation_refusals
    store = MemoryObjectStore("b")
    publish(store, key(0, 9), 1_000)
    publish(store, dc_replace(key(0, 9), incarnation="IdB"), 5_000)
    store.put("data/us-east-1/orders/_topic.json", TopicMetadata(
        1, incarnations=(Incarnation("IdA", ""), Incarnation("IdB", "IdB"))).encode())
    settings = load_settings(data={"region": "eu-west-1", "s3": {"bucket": "b"},
                                   "kafka": {"brokers": "x:1"}}, environ={})
    started = RestoreRequest("us-east-1", "orders", "orders.restored",
                             "replicator.checkpoint", RestoreRange())
    marks = {0: {started.checkpoint_key(0): RestoreMark(
        RestoreRange(), 0, 4, "", (1_000, 1_004), datetime(2026, 11, 25, tzinfo=UTC))}}
    seen: list[RestoreRequest] = []

    class Interrupted:
        def __init__(self, kafka: object, store_: object, prefix: str,
                     request: RestoreRequest, **kw: object) -> None:
            seen.append(request)

        def run(self, plan_: Plan) -> None:
            reasons = incarnation_refusals(seen[-1], plan_, marks)
            if reasons:
                raise RestoreRefused(reasons)

        def close(self) -> None:
            return

    monkeypatch.setattr(cli_restore, "settings_store", lambda config, bucket: (settings, store))
    monkeypatch.setattr(cli_restore, "Restorer", Interrupted)
    base = ["restore", "--config", "x.toml", "--source-region", "us-east-1", "--topic",
            "orders", "--to-topic", "orders.restored", "--no-progress"]
    res = CliRunner().invoke(main, base)
    assert res.exit_code == 2, res.output
    assert "started on incarnation IdA" in res.output and "now IdB" in res.output
    assert seen[-1].incarnation == "IdB" and not seen[-1].incarnation_named
    res = CliRunner().invoke(main, [*base, "--incarnation", "IdA"])
    assert res.exit_code == 0, res.output
    assert seen[-1].incarnation == "" and seen[-1].incarnation_named
