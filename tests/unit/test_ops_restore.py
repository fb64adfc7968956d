"""``replicator/ops/restore.py`` without a broker: listing and planning on the in-memory
store, record times of segments without footer times, the batch cut."""

from __future__ import annotations

import io

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore
from replicator.ops.restore import RestoreRequest, _cut, make_plan, segment_times
from replicator.ops.restore_plan import RestoreRange


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


def test_request_names_its_checkpoints_and_producer() -> None:
    r = request(RestoreRange())
    assert r.checkpoint_key(3) == "restore:us-east-1:orders:3:orders.restored"
    assert r.transactional_id == "replicator-restore:us-east-1:orders:orders.restored"


def test_cli_option_parsing_and_bad_input_exit_2(tmp_path: object) -> None:
    import click
    import pytest
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
