"""``replicator segments ls|inspect|cat``, ``sync`` and ``verify`` against moto and Tansu."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.cli.main import main
from replicator.core import s3
from replicator.core.kafka import Producer
from replicator.core.keys import SegmentKey
from replicator.core.settings import KafkaSettings
from replicator.devstack import aws
from tests.conftest import RECENT_MS, unique_name


def make_bucket(endpoint: str, region: str = "us-east-1") -> tuple[str, s3.S3ObjectStore]:
    bucket = unique_name("bkt")
    client = s3.make_s3_client(endpoint_url=endpoint, region=region, access_key_id="test",
                               secret_access_key="test")
    aws.create_bucket(client, bucket, region)
    return bucket, s3.S3ObjectStore(client, bucket)


def write_segment(store: s3.S3ObjectStore, key: SegmentKey) -> None:
    fmt = get_format("parquet")
    records = [Record(o, RECENT_MS + o, f"k{o}".encode(), None if o % 5 == 0 else
                      f"value {o}".encode(), (("h", b"x"),)) for o in range(key.start,
                                                                              key.end + 1)]
    up = SegmentUpload(store, fmt, "temp", WriterOptions())
    up.write_batch(records_to_batch(records))
    up.finish(SegmentMetadata.for_key(key, len(records)))
    publish_segment(store, up.temp_key, key, None)


def config(tmp_path: Path, endpoint: str, bucket: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f'''region = "us-east-1"
[s3]
bucket = "{bucket}"
endpoint_url = "{endpoint}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "127.0.0.1:1"
''')
    return path


def test_segments_ls_reports_levels_and_gaps(moto_endpoint: str, tmp_path: Path) -> None:
    bucket, store = make_bucket(moto_endpoint)
    for start, end in ((0, 9), (10, 19), (30, 39)):
        write_segment(store, SegmentKey("data", "us-east-1", "t.x", 0, 0, start, end))
    write_segment(store, SegmentKey("data", "us-east-1", "t.x", 0, 1, 0, 19))
    store.put("temp/partial", b"not a segment")
    cfg = config(tmp_path, moto_endpoint, bucket)

    res = CliRunner().invoke(main, ["segments", "ls", "--config", str(cfg), "--output", "json"])
    assert res.exit_code == 0, res.output
    [part] = json.loads(res.output)
    assert part["gaps"] == [{"start": 20, "end": 29}]
    assert [(lv["level"], lv["count"], lv["first"], lv["last"]) for lv in part["levels"]] == \
        [(0, 3, 0, 39), (1, 1, 0, 19)]

    table = CliRunner().invoke(main, ["segments", "ls", "--config", str(cfg)])
    assert table.exit_code == 0
    assert "GAP      us-east-1/t.x[0] positions 20-29 (10) have no segment" in table.output


def test_segments_inspect_shows_footer_and_records(moto_endpoint: str, tmp_path: Path) -> None:
    bucket, store = make_bucket(moto_endpoint)
    key = SegmentKey("data", "us-east-1", "t", 3, 0, 100, 149)
    write_segment(store, key)
    cfg = config(tmp_path, moto_endpoint, bucket)
    res = CliRunner().invoke(main, ["segments", "inspect", key.to_key(), "--config", str(cfg),
                                    "--output", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["records"] == 50
    assert data["format"] == "parquet"  # from the object's bytes
    assert data["footer"]["start_offset"] == "100" and data["footer"]["end_offset"] == "149"
    assert data["first"]["offset"] == 100 and data["last"]["offset"] == 149
    assert data["first"]["value_bytes"] is None  # offset 100 is a tombstone

    missing = CliRunner().invoke(main, ["segments", "inspect", key.to_key().replace("149",
                                 "150"), "--config", str(cfg)])
    assert missing.exit_code == 1
    assert "does not exist" in missing.output

    bad = CliRunner().invoke(main, ["segments", "inspect", "temp/abc", "--config", str(cfg)])
    assert bad.exit_code == 2
    assert "not a segment key" in bad.output


def test_segments_cat_prints_records_as_json_lines(moto_endpoint: str, tmp_path: Path) -> None:
    bucket, store = make_bucket(moto_endpoint)
    level0 = [SegmentKey("data", "us-east-1", "t", 0, 0, a, a + 9) for a in (0, 10, 20)]
    for k in level0:
        write_segment(store, k)
    write_segment(store, SegmentKey("data", "us-east-1", "t", 0, 1, 0, 19))
    odd = SegmentKey("data", "us-east-1", "odd", 0, 0, 0, 1)
    up = SegmentUpload(store, get_format("arrow"), "temp", WriterOptions())
    up.write_batch(records_to_batch([Record(0, RECENT_MS, None, b"\xff\x00", (("h", None),)),
                                     Record(1, RECENT_MS, b"", b"", ())]))
    publish_segment(store, up.finish(SegmentMetadata.for_key(odd, 2)).key, odd)
    cfg = config(tmp_path, moto_endpoint, bucket)

    res = CliRunner().invoke(main, ["segments", "cat", "--config", str(cfg), odd.to_key()])
    assert res.exit_code == 0, res.output
    assert [json.loads(line) for line in res.output.splitlines()] == [
        {"offset": 0, "timestamp": RECENT_MS, "timestamp_type": 1, "key": None,
         "value": {"base64": "/wA="}, "headers": [["h", None]]},
        {"offset": 1, "timestamp": RECENT_MS, "timestamp_type": 1, "key": "", "value": "",
         "headers": []}]

    # A partition from an offset: level 1 then level 0, each record once.
    res = CliRunner().invoke(main, ["segments", "cat", "--config", str(cfg), "--region",
                                    "us-east-1", "--topic", "t", "--partition", "0",
                                    "--from-offset", "5", "--limit", "20"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.output.splitlines()]
    assert [r["offset"] for r in lines] == list(range(5, 25))
    assert lines[0]["key"] == "k5" and lines[0]["value"] is None  # offset 5: a tombstone
    assert lines[1]["value"] == "value 6" and lines[1]["headers"] == [["h", "x"]]


def test_sync_copies_segments_once_and_never_temp(moto_endpoint: str, tmp_path: Path) -> None:
    src_bucket, src = make_bucket(moto_endpoint)
    dst_bucket, dst = make_bucket(moto_endpoint, "us-west-1")
    for start in (0, 10):
        write_segment(src, SegmentKey("data", "us-east-1", "t", 0, 0, start, start + 9))
    src.put("temp/abc", b"partial")
    cfg = config(tmp_path, moto_endpoint, src_bucket)
    args = ["sync", "--from-bucket", src_bucket, "--to-bucket", dst_bucket, "--config",
            str(cfg), "--output", "json"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["copied"] == 2
    assert [o.key for o in dst.list("")] == [o.key for o in src.list("data/")]
    second = CliRunner().invoke(main, args)
    assert json.loads(second.output)["copied"] == 0


def produce(brokers: str, topic: str, values: list[bytes | None]) -> None:
    p = Producer(KafkaSettings(brokers=brokers))
    for i, v in enumerate(values):
        p.produce(topic, v, b"k%d" % i, partition=0, timestamp=RECENT_MS + i)
    assert p.flush(10) == 0


def test_verify_passes_equal_topics_and_fails_different(source_brokers: str) -> None:
    from replicator.core.kafka import Admin

    a, b, c = unique_name("va"), unique_name("vb"), unique_name("vc")
    admin = Admin(KafkaSettings(brokers=source_brokers))
    for t in (a, b, c):
        admin.create_topic(t, 1)
    values: list[bytes | None] = [b"x", None, b"", b"y"]
    produce(source_brokers, a, values)
    produce(source_brokers, b, values)
    produce(source_brokers, c, [b"x", b"", b"", b"y", b"y"])
    ok = CliRunner().invoke(main, ["verify", "--source", a, "--destination", b,
                                   "--source-brokers", source_brokers, "--timeout", "10"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.rstrip().endswith("PASS")
    bad = CliRunner().invoke(main, ["verify", "--source", a, "--destination", c,
                                    "--source-brokers", source_brokers, "--timeout", "10",
                                    "--output", "json"])
    assert bad.exit_code == 1
    report = json.loads(bad.output)
    assert report["totals"]["lost"] == 1 and report["totals"]["duplicated"] == 2
