"""Bad input never crashes ingress, never loops, never passes silently, never stops others.

What the other tests already cover (not repeated here, see RELIABILITY.md):
garbage bytes at a valid segment key (``test_ingress.py::test_late_lost_corrupt_and_too_few_
partitions``, partition 2), malformed/foreign S3 event bodies as pure parsing and relay logic
(``tests/unit/test_ingress_events.py``, ``tests/unit/test_ingress_relay.py``), unknown keys,
bad durations and missing sections in configs (``tests/integration/test_cli_config.py``,
``tests/unit/test_settings.py``).

Here, end to end on the embedded broker and moto: malformed and foreign events on the real
SQS queue and garbage on the segment-events topic, a segment whose footer disagrees with
its key, a checkpoint record that is not JSON, and configs with wrong types through the CLIs.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from formats.base import SegmentMetadata, WriterOptions
from formats.records import records_to_batch
from formats.segment_io import SegmentUpload, publish_segment
from replicator.core.kafka import Admin, Producer
from replicator.core.sqs import SqsQueue
from replicator.core.wire import Checkpoint
from tests.integration.test_ingress import (
    FMT,
    SOURCE_REGION,
    Env,
    env,
    expected_rows,
    read_topic,
    rich_record,
    running,
    wait_for,
)

__all__ = ["env"]  # the fixture, shared with test_ingress.py

LABELS = {"region": SOURCE_REGION}


def lbl(env: Env, partition: int) -> dict[str, str]:
    return {**LABELS, "topic": env.source, "partition": str(partition)}


def send(env: Env, body: str) -> None:
    env.sqs.send_message(QueueUrl=SqsQueue(env.sqs, env.queue).url, MessageBody=body)


def s3_record(bucket: str, key: str, name: str = "ObjectCreated:Put") -> dict[str, object]:
    return {"eventName": name, "eventTime": "2026-01-01T00:00:00Z",
            "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": 1}}}


def queue_depth(env: Env) -> tuple[int, int]:
    attrs = env.sqs.get_queue_attributes(
        QueueUrl=SqsQueue(env.sqs, env.queue).url,
        AttributeNames=["ApproximateNumberOfMessages",
                        "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return (int(attrs["ApproximateNumberOfMessages"]),
            int(attrs["ApproximateNumberOfMessagesNotVisible"]))


def test_bad_events_are_logged_counted_and_dropped_while_segments_flow(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.write_meta(2)
    good_key = env.segment_key(0, 0, 99).to_key()
    bad_bodies = {
        "not_json": "{this is not json",
        "bad_shape": json.dumps({"Records": "not a list"}),
        "bad_record": json.dumps({"Records": [{"eventName": "ObjectCreated:Put"}]}),
    }
    for body in bad_bodies.values():
        send(env, body)
    # Valid S3 records that are not ours: counted as ignored, never replayed.
    send(env, json.dumps({"Records": [
        s3_record("someone-elses-bucket", good_key),
        s3_record(env.bucket, "other-prefix/" + good_key),
        s3_record(env.bucket, f"data/{SOURCE_REGION}/{env.source}/0/0/not-a-segment"),
        s3_record(env.bucket, f"data/{SOURCE_REGION}/unconfigured.topic/0/0/"
                              f"{0:020d}-{9:020d}"),
    ]}))
    exp0 = env.write(env.segment_key(0, 0, 99))
    exp1 = env.write(env.segment_key(1, 0, 49))
    settings = env.settings()
    with caplog.at_level(logging.INFO), running(settings) as ing:
        # Garbage on the segment-events topic itself (another writer, a bad tool).
        producer = Producer(settings.kafka)
        producer.produce(settings.ingress.segment_events_topic,  # type: ignore[union-attr]
                         b"\x00garbage event", b"not-a-key", partition=0)
        producer.flush(10)
        for p, last in ((0, 99), (1, 49)):
            def replayed(p: int = p, last: int = last) -> bool:
                return ing.metrics.value("replicator_ingress_checkpoint_offset",
                                         lbl(env, p)) == last

            wait_for(replayed, 30, f"partition {p} replayed")
        m = ing.metrics
        wait_for(lambda: sum(m.value("replicator_ingress_sqs_events_invalid_total",
                                     {"reason": r}) or 0 for r in bad_bodies) == 3, 20,
                 "the malformed SQS messages counted")
        for reason in bad_bodies:
            assert m.value("replicator_ingress_sqs_events_invalid_total",
                           {"reason": reason}) == 1, reason
        for reason in ("other_bucket", "other_prefix", "not_segment", "unconfigured_source"):
            assert (m.value("replicator_ingress_sqs_events_ignored_total",
                            {"reason": reason}) or 0) >= 1, reason
        wait_for(lambda: (m.value("replicator_ingress_segment_events_invalid_total")
                          or 0) >= 1, 20, "the garbage events-topic record counted")
        # Nothing loops: every message was deleted, the workers never failed.
        wait_for(lambda: queue_depth(env) == (0, 0), 20, "an empty queue")
        assert m.total("replicator_ingress_worker_errors_total") == 0
        assert ing.metrics.value("replicator_ingress_segments_replayed_total",
                                 lbl(env, 0)) == 1
    got = read_topic(env.brokers, env.dest)
    assert got[0] == expected_rows(0, exp0)
    assert got[1] == expected_rows(1, exp1)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    for body in bad_bodies.values():
        assert any(body[:30] in e for e in errors), (body, errors)  # body quoted in the log


def test_footer_that_disagrees_with_its_key_is_reported_then_declared_lost(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """A valid segment written for 0-49 but stored at 0-59 is refused (never replayed with
    the wrong offsets), counted as corrupt, and its range is declared lost, loudly, after
    ``lost_segment_timeout``; the next segment and the other partition flow."""
    env.write_meta(2)
    env.data["ingress"]["sources"][0]["lost_segment_timeout"] = "3s"
    written_for = env.segment_key(0, 0, 49)
    stored_at = env.segment_key(0, 0, 59)
    records = [rich_record(0, o) for o in range(0, 50)]
    up = SegmentUpload(env.store, FMT, "temp", WriterOptions())
    up.write_batch(records_to_batch(records))
    temp = up.finish(SegmentMetadata.for_key(written_for, len(records)))
    publish_segment(env.store, temp.key, stored_at)
    exp0 = env.write(env.segment_key(0, 60, 99))
    exp1 = env.write(env.segment_key(1, 0, 99))
    with caplog.at_level(logging.INFO), running(env.settings()) as ing:
        m = ing.metrics
        wait_for(lambda: m.value("replicator_ingress_checkpoint_offset", lbl(env, 0)) == 99,
                 40, "partition 0 after the lost range")
        wait_for(lambda: m.value("replicator_ingress_checkpoint_offset", lbl(env, 1)) == 99,
                 20, "partition 1")
        assert (m.value("replicator_ingress_segments_corrupt_total", lbl(env, 0)) or 0) >= 1
        assert m.value("replicator_ingress_segments_lost_total", lbl(env, 0)) == 1
        assert m.value("replicator_ingress_messages_lost_total", lbl(env, 0)) == 60
        assert m.total("replicator_ingress_worker_errors_total") == 0
    got = read_topic(env.brokers, env.dest)
    assert got[0] == expected_rows(0, exp0)
    assert got[1] == expected_rows(1, exp1)
    messages = [r.getMessage() for r in caplog.records]
    assert any(r.levelno == logging.ERROR and stored_at.to_key() in r.getMessage()
               for r in caplog.records), "the refused segment is named at ERROR"
    assert any("LOST" in x and f"{env.source}[0]" in x and "positions 0-59 (60)" in x
               for x in messages), [x for x in messages if "LOST" in x]


def test_checkpoint_record_that_is_not_json_is_skipped_loudly(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """The newest checkpoint record of partition 0 is garbage: it is logged and counted, the
    latest valid checkpoint (49) wins, so replay resumes at 50: nothing replayed twice,
    nothing skipped. Partition 1 (no checkpoint) replays from its start."""
    env.write_meta(2)
    settings = env.settings()
    topic = settings.ingress.checkpoint_topic  # type: ignore[union-attr]
    Admin(settings.kafka).create_topic(topic, 1, {"cleanup.policy": "compact"})
    key0 = f"{SOURCE_REGION}:{env.source}:0"
    seg0 = env.segment_key(0, 0, 99)
    producer = Producer(settings.kafka)
    valid = Checkpoint(49, seg0.to_key(), datetime.now(UTC)).encode()
    producer.produce(topic, valid, key0.encode(), partition=0)
    producer.produce(topic, b"{'offset': 99", key0.encode(), partition=0)   # not JSON
    producer.flush(10)
    exp0 = env.write(seg0)
    exp1 = env.write(env.segment_key(1, 0, 99))
    with caplog.at_level(logging.INFO), running(settings) as ing:
        m = ing.metrics
        for p in (0, 1):
            def done(p: int = p) -> bool:
                return m.value("replicator_ingress_checkpoint_offset", lbl(env, p)) == 99

            wait_for(done, 30, f"partition {p}")
        assert (m.value("replicator_ingress_checkpoints_invalid_total", {"key": key0})
                or 0) >= 1
        assert m.total("replicator_ingress_worker_errors_total") == 0
    got = read_topic(env.brokers, env.dest)
    assert got[0] == expected_rows(0, exp0[50:])
    assert got[1] == expected_rows(1, exp1)
    assert any(r.levelno == logging.ERROR and "invalid checkpoint record" in r.getMessage()
               and key0 in r.getMessage() for r in caplog.records)


BIN = Path(sys.executable).parent

COMMON = """
region = "us-east-1"
[s3]
bucket = "b-bad-input"
[kafka]
brokers = "127.0.0.1:1"
"""
SECTIONS = {
    "egress": '[egress]\n[egress.topics."t"]\nmax_segment_messages = 10\n',
    "ingress": '[ingress]\nsqs_queue = "q"\n[[ingress.sources]]\nregion = "us-west-1"\n'
               'topic = "t"\n',
    "compaction": '[compaction]\n[compaction.topics."t"]\n',
}


@pytest.mark.parametrize(("service", "edit", "key"), [
    ("egress", ("max_segment_messages = 10", 'max_segment_messages = "lots"'),
     "egress.topics.t.max_segment_messages"),
    ("egress", ('brokers = "127.0.0.1:1"', 'brokers = "127.0.0.1:1"\nconfig = "acks=all"'),
     "kafka.config"),
    ("ingress", ('sqs_queue = "q"', 'sqs_queue = "q"\nbatch_size = [500]'),
     "ingress.batch_size"),
    ("ingress", ('topic = "t"', 'topic = "t"\nlate_segment_retries = "five"'),
     "ingress.sources.0.late_segment_retries"),
    ("compaction", ("[compaction]", "[compaction]\nparallelism = 2.5"),
     "compaction.parallelism"),
    ("egress", ('[s3]', '[metrics]\nport = "http"\n[s3]'), "metrics.port"),
    ("egress", ("[egress]\n", '[egress]\n[egress.select]\ninclude = ["ok", "sensor\\\\.(*"]\n'),
     "egress.select.include"),
])
def test_wrong_types_exit_2_naming_the_key(tmp_path: Path, service: str,
                                           edit: tuple[str, str], key: str) -> None:
    text = (COMMON + SECTIONS[service]).replace(edit[0], edit[1], 1)
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    args = ["--once", "--dry-run"] if service == "compaction" else []
    r = subprocess.run([str(BIN / f"replicator-{service}"), "--config", str(cfg), *args],
                       capture_output=True, text=True, timeout=60, check=False,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert key in out, out
    assert "Traceback" not in out, out
