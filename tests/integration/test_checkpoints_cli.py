"""``replicator checkpoints show`` reads the real checkpoint topic and bucket."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from replicator.cli.main import main
from replicator.core import s3
from replicator.core.kafka import Admin, Producer
from replicator.core.keys import SegmentKey
from replicator.core.settings import KafkaSettings
from replicator.devstack import aws
from tests.conftest import unique_name


def test_checkpoints_show_latest_valid_per_partition(moto_endpoint: str, dest_brokers: str,
                                                     tmp_path: Path) -> None:
    topic, cp_topic, bucket = unique_name("src"), unique_name("cp"), unique_name("bkt")
    kafka = KafkaSettings(brokers=dest_brokers)
    Admin(kafka).create_topic(cp_topic, 1, {"cleanup.policy": "compact"})
    p = Producer(kafka)
    for key, value in (
        (f"us-east-1:{topic}:0", b'{"offset": 5, "segment": "a", "updated_at": '
                                 b'"2026-11-21T00:00:00Z"}'),
        (f"us-east-1:{topic}:0", b'{"offset": 9, "segment": "b", "updated_at": '
                                 b'"2026-11-21T00:00:01Z"}'),
        (f"us-east-1:{topic}:0", b"not json"),  # ignored (logged), never wins
        (f"us-east-1:{topic}:1", b'{"offset": 3, "segment": "c", "updated_at": '
                                 b'"2026-11-21T00:00:02Z"}'),
    ):
        p.produce(cp_topic, value, key.encode())
    assert p.flush(10) == 0
    client = s3.make_s3_client(endpoint_url=moto_endpoint, region="us-west-1",
                               access_key_id="test", secret_access_key="test")
    aws.create_bucket(client, bucket, "us-west-1")
    store = s3.S3ObjectStore(client, bucket)
    store.put(SegmentKey("data", "us-east-1", topic, 0, 0, 0, 19).to_key(), b"x")
    cfg = tmp_path / "ingress.toml"
    cfg.write_text(f'''region = "us-west-1"
[s3]
bucket = "{bucket}"
endpoint_url = "{moto_endpoint}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "{dest_brokers}"
[ingress]
sqs_queue = "q"
checkpoint_topic = "{cp_topic}"
[[ingress.sources]]
region = "us-east-1"
topic = "{topic}"
''')
    res = CliRunner().invoke(main, ["checkpoints", "show", "--config", str(cfg), "--output",
                                    "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output[res.output.index("["):])
    assert [(r["partition"], r["checkpoint"], r["latest_segment_end"], r["lag"])
            for r in rows] == [(0, 9, 19, 10), (1, 3, None, None)]
    assert [r["segment"] for r in rows] == ["b", "c"]
    table = CliRunner().invoke(main, ["checkpoints", "show", "--config", str(cfg)])
    assert table.exit_code == 0, table.output
    # (The invalid record above is reported on stderr first, which CliRunner mixes in.)
    header = next(line for line in table.output.splitlines()
                  if line.startswith("source")).split()
    assert header[-3:] == ["lost", "origin", "segment"]
