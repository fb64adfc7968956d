"""``replicator topics`` against the real stack: an egress config (a table and a pattern)
and an ingress config (a pattern into ``{topic}.copy``) after they replicated two topics."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from egress.controller import Egress
from replicator.cli.main import main
from replicator.core.kafka import Admin, Producer
from replicator.core.settings import load_settings
from replicator.ops.verify import verify_topics
from tests.conftest import RECENT_MS, unique_name
from tests.integration.pipeline import (
    DEST_REGION,
    SOURCE_REGION,
    Pipeline,
    running_egress,
    running_ingress,
    wait_for,
)

PARTITIONS = 2


def _common(pipe: Pipeline, region: str, brokers: str) -> str:
    return f'''region = "{region}"
[s3]
bucket = "{pipe.bucket}"
endpoint_url = "{pipe.moto}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "{brokers}"
[kafka.config]
"session.timeout.ms" = 6000
"heartbeat.interval.ms" = 500
"topic.metadata.refresh.interval.ms" = 1000
[metrics]
port = 0
'''


def _run(*args: str) -> Any:
    res = CliRunner().invoke(main, ["topics", *args])
    assert res.exit_code == 0, res.output
    return res.output


def _json(*args: str) -> Any:
    out = _run(*args, "--output", "json")
    return json.loads(out[out.index("{"):])   # after any log lines


def test_topics_shows_both_sides_of_a_replication(pipe: Pipeline, tmp_path: Path) -> None:
    base = unique_name("tcli")
    named, matched, missing = f"{base}.a", f"{base}.sensor.b", f"{base}.never"
    egress_cfg, ingress_cfg = tmp_path / "egress.toml", tmp_path / "ingress.toml"
    egress_cfg.write_text(_common(pipe, SOURCE_REGION, pipe.source_brokers) + f'''
[egress]
group_id = "{pipe.egress_group}"
topic_metadata_interval = "1s"
shutdown_timeout = "10s"
max_bytes_per_second = "64MiB"
select = {{ include = ["{re.escape(base).replace(chr(92), chr(92) * 2)}\\\\.sensor\\\\..*"] }}
topic_defaults = {{ max_segment_messages = 20, max_segment_age = "500ms" }}
[egress.topics."{named}"]
[egress.topics."{missing}"]
''')
    ingress_cfg.write_text(_common(pipe, DEST_REGION, pipe.dest_brokers) + f'''
[ingress]
group_id = "{pipe.ingress_group}"
sqs_queue = "{pipe.queue}"
segment_events_topic = "{pipe.events_topic}"
checkpoint_topic = "{pipe.checkpoint_topic}"
sqs_wait_time = "1s"
topic_check_interval = "1s"
max_bytes_per_second = "2MiB"
[[ingress.sources]]
region = "{SOURCE_REGION}"
topic = "{named}"
[[ingress.sources]]
region = "{SOURCE_REGION}"
topic_pattern = "{re.escape(base).replace(chr(92), chr(92) * 2)}\\\\..*"
destination_topic = "{{topic}}.copy"
first_segment_delay = "2s"
''')
    admin = Admin(pipe.source_kafka)
    p = Producer(pipe.source_kafka)
    for t, n in ((named, 30), (matched, 50)):
        assert admin.create_topic(t, PARTITIONS)
        for i in range(n):
            p.produce(t, value=f"{t}-{i}".encode(), partition=i % PARTITIONS,
                      timestamp=RECENT_MS + i)
    p.flush(30)
    with running_egress(Egress(load_settings(egress_cfg, environ={}), store=pipe.store)), \
            running_ingress(load_settings(ingress_cfg, environ={})):
        for src, dst in ((named, named), (matched, f"{matched}.copy")):
            wait_for(lambda src=src, dst=dst: verify_topics(  # type: ignore[misc]
                pipe.source_kafka, src, pipe.dest_kafka, dst).ok, 45, f"{dst} replicated")
        wait_for(lambda: _json("--config", str(ingress_cfg))
                 ["ingress"][1]["lag"] == 0, 20, "the checkpoints at the segments' ends")

    eg = _json("--config", str(egress_cfg))
    assert eg["region"] == SOURCE_REGION
    assert eg["max_bytes_per_second"] == {"egress": 64 * 1024**2}
    rows = {r["topic"]: r for r in eg["egress"]}
    assert set(rows) == {named, matched, missing}
    assert rows[missing]["state"] == "missing" and rows[missing]["partitions"] is None
    for t, n in ((named, 30), (matched, 50)):
        assert rows[t]["partitions"] == PARTITIONS
        assert rows[t]["state"] == "replicating" and rows[t]["lag"] == 0
        assert sum(rows[t]["committed"].values()) == n

    ing_out = _json("--config", str(ingress_cfg))
    assert ing_out["max_bytes_per_second"] == {"ingress": 2 * 1024**2}
    ing = ing_out["ingress"]
    got = {(r["topic"], r["destination"], r["found_by"].split(" ")[0], r["partitions"],
            r["checkpointed_partitions"], r["lag"], r["state"]) for r in ing}
    assert got == {(named, named, "topic", 2, 2, 0, "replicating"),
                   (matched, f"{matched}.copy", "topic_pattern", 2, 2, 0, "replicating")}

    table = _run("--config", str(ingress_cfg))
    assert f"{matched}.copy" in table and "replicating" in table
    assert "produces into the destination: 2.0 MiB/s per process" in table
    table = _run("--config", str(egress_cfg))
    assert missing in table and "missing" in table
    assert "reads from the source: 64.0 MiB/s per process" in table
