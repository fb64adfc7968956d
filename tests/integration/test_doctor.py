"""``replicator doctor`` against the embedded stack (the session's broker and moto server),
each fault made on purpose: a broker that is down (an unused port), a missing bucket,
versioning off, a missing queue, a checkpoint topic with the wrong cleanup.policy, a
transaction timeout above the brokers' limit, a source without _topic.json or with a
smaller destination, a missing egress topic, an unreachable Spark master; and a healthy
ingress config that passes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from replicator.cli.main import main
from replicator.core.compacted_topic import CHECKPOINT_TOPIC_CONFIG
from replicator.core.kafka import Admin
from replicator.core.keys import topic_meta_key
from replicator.core.settings import KafkaSettings
from replicator.core.sqs import SqsQueue, make_sqs_client
from replicator.core.wire import TopicMetadata
from replicator.devstack.aws import create_bucket, create_queue, set_bucket_notifications
from replicator.devstack.processes import free_port
from tests.conftest import BROKER_KIND, unique_name
from tests.integration.pipeline import wait_for

REGION = "us-west-1"
SOURCE = "us-east-1"


@dataclass
class Region:
    """One test's bucket, queue and ingress topics."""

    moto: str
    brokers: str
    bucket: str
    queue: str
    checkpoint_topic: str
    events_topic: str
    offset_map_topic: str
    source: str

    def config(self, path: Path, *, brokers: str | None = None, bucket: str | None = None,
               queue: str | None = None, kafka_config: str = "", extra: str = "") -> Path:
        path.write_text(f'''region = "{REGION}"
[s3]
bucket = "{bucket or self.bucket}"
endpoint_url = "{self.moto}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "{brokers or self.brokers}"
[kafka.config]
{kafka_config}
[ingress]
sqs_queue = "{queue or self.queue}"
checkpoint_topic = "{self.checkpoint_topic}"
segment_events_topic = "{self.events_topic}"
offset_map_topic = "{self.offset_map_topic}"
[[ingress.sources]]
region = "{SOURCE}"
topic = "{self.source}"
{extra}''')
        return path


def doctor(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    res = CliRunner().invoke(main, ["doctor", "--config", str(config), "--output", "json",
                                    *args])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.output[res.output.index("{"):])


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report["checks"]}


def by_name(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["check"] == name)


@pytest.fixture
def region(moto_endpoint: str, s3_client: Any, dest_brokers: str) -> Region:
    """A healthy ingress region: versioned bucket notifying its queue (visibility 60 s), and
    the checkpoint, segment-events and offset-map topics as ingress creates them."""
    r = Region(moto_endpoint, dest_brokers, unique_name("bucket"), unique_name("queue"),
               unique_name("cp"), unique_name("ev"), unique_name("om"), unique_name("orders"))
    create_bucket(s3_client, r.bucket, REGION)
    s3_client.put_bucket_versioning(Bucket=r.bucket,
                                    VersioningConfiguration={"Status": "Enabled"})
    sqs = make_sqs_client(endpoint_url=moto_endpoint, region=REGION, access_key_id="test",
                          secret_access_key="test")
    url = create_queue(sqs, r.queue)
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "60"})
    set_bucket_notifications(s3_client, r.bucket, SqsQueue(sqs, r.queue).arn, prefix="data/")
    admin = Admin(KafkaSettings(brokers=dest_brokers))
    assert admin.create_topic(r.checkpoint_topic, 1, dict(CHECKPOINT_TOPIC_CONFIG))
    assert admin.create_topic(r.offset_map_topic, 1, dict(CHECKPOINT_TOPIC_CONFIG))
    assert admin.create_topic(r.events_topic, 1, {"cleanup.policy": "delete",
                                                  "retention.ms": "3600000"})
    # The source as egress in us-east-1 announced it, and its copy here.
    s3_client.put_object(Bucket=r.bucket, Key=topic_meta_key("data", SOURCE, r.source),
                         Body=TopicMetadata(3, topic=r.source, region=SOURCE).encode())
    assert admin.create_topic(r.source, 3)
    # A created topic reaches every broker's metadata a moment later.
    wait_for(lambda: all(admin.partition_count(t) == n for t, n in (
        (r.checkpoint_topic, 1), (r.offset_map_topic, 1), (r.events_topic, 1),
        (r.source, 3))), 10, "the topics' metadata")
    return r


def test_a_healthy_ingress_region_passes(region: Region, tmp_path: Path) -> None:
    code, report = doctor(region.config(tmp_path / "ingress.toml"))
    got = statuses(report)
    acl = "kafka acl "
    assert list(got) == [
        "kafka reachable", "kafka cluster", f"checkpoint topic {region.checkpoint_topic}",
        f"segment events topic {region.events_topic}",
        f"offset map topic {region.offset_map_topic}", "topic auto-creation",
        "transaction.max.timeout.ms",
        # The session's brokers have no authorizer: every permission line passes unchecked.
        f"{acl}topic {region.source}", f"{acl}topic {region.checkpoint_topic}",
        f"{acl}topic {region.events_topic}", f"{acl}topic {region.offset_map_topic}",
        f"{acl}group replicator.ingress", f"{acl}idempotent write",
        f"{acl}transactional-id replicator.ingress.*", "s3 bucket", "s3 versioning", "s3 list",
        "clock skew (S3)", "s3 notifications", f"source {SOURCE}/{region.source}",
        "ingress refused records", "sqs queue", "sqs visibility timeout"]
    # Tansu describes no broker configs: auto-creation and the transaction limit are unknown.
    unknown = {"topic auto-creation", "transaction.max.timeout.ms"}
    expected_warn = unknown if BROKER_KIND == "tansu" else set()
    assert {k for k, v in got.items() if v != "PASS"} == expected_warn, json.dumps(report, indent=1)
    assert code == 0 and report["status"] == ("WARN" if expected_warn else "PASS")
    if BROKER_KIND == "apache":
        assert by_name(report, "topic auto-creation")["seen"] == \
            "auto.create.topics.enable=false"
        assert by_name(report, "transaction.max.timeout.ms")["seen"] == \
            "900000 on the brokers; ingress uses 150000 (ingress default)"
    # Ingress writes nothing: its source region's prefix is listed instead.
    assert by_name(report, "s3 list")["seen"] == f"data/{SOURCE}/: objects"
    assert by_name(report, f"source {SOURCE}/{region.source}")["seen"] == \
        f"3 partition(s) → {region.source} (3 partition(s))"


def test_the_table_names_each_check_and_the_totals(region: Region, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["doctor", "--config",
                                    str(region.config(tmp_path / "ingress.toml"))])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["check", "status", "seen", "fix"]
    assert any(line.startswith("kafka reachable") and " PASS " in line for line in lines)
    assert lines[-1].startswith(("PASS: 23 PASS, 0 WARN, 0 FAIL", "WARN: 21 PASS, 2 WARN"))


def test_a_broker_that_is_down_is_named_with_the_cause(region: Region,
                                                       tmp_path: Path) -> None:
    port = free_port()
    start = time.monotonic()
    code, report = doctor(region.config(tmp_path / "down.toml", brokers=f"127.0.0.1:{port}"),
                          "--timeout", "2")
    took = time.monotonic() - start
    assert code == 1 and report["status"] == "FAIL"
    kafka = [c for c in report["checks"] if c["check"].startswith(("kafka", "topic"))]
    assert [(c["check"], c["status"]) for c in kafka] == [("kafka reachable", "FAIL")]
    assert f"127.0.0.1:{port}: Connect to ipv4#127.0.0.1:{port} failed: Connection " \
           "refused" in kafka[0]["seen"], kafka
    assert kafka[0]["fix"].startswith(f"nothing listens at 127.0.0.1:{port}")
    # The hard deadline: the metadata request's 2 s, plus the S3 and SQS checks.
    assert took < 10, took
    # The other dependencies are still checked.
    assert statuses(report)["s3 bucket"] == "PASS"


def test_a_missing_bucket_fails(region: Region, tmp_path: Path) -> None:
    missing = unique_name("nobucket")
    code, report = doctor(region.config(tmp_path / "nobucket.toml", bucket=missing))
    assert code == 1
    s3 = [c for c in report["checks"] if c["check"].startswith("s3 ")]
    assert [(c["check"], c["status"]) for c in s3] == [("s3 bucket", "FAIL")]
    assert s3[0]["seen"] == f"s3://{missing} does not exist"
    assert "fix s3.bucket" in s3[0]["fix"]


def test_versioning_off_is_reported(region: Region, s3_client: Any, tmp_path: Path) -> None:
    s3_client.put_bucket_versioning(Bucket=region.bucket,
                                    VersioningConfiguration={"Status": "Suspended"})
    code, report = doctor(region.config(tmp_path / "unversioned.toml"))
    v = by_name(report, "s3 versioning")
    assert v["status"] == "WARN" and v["seen"] == f"Suspended on s3://{region.bucket}"
    assert "put-bucket-versioning" in v["fix"]
    assert code == 0     # a WARN: replicator sync needs no versioning


def test_a_missing_queue_fails(region: Region, tmp_path: Path) -> None:
    missing = unique_name("noqueue")
    code, report = doctor(region.config(tmp_path / "noqueue.toml", queue=missing))
    assert code == 1
    q = by_name(report, "sqs queue")
    assert q["status"] == "FAIL" and q["seen"] == f"{missing} does not exist"
    assert "ingress.sqs_queue" in q["fix"]
    # Without the queue's ARN the notification cannot be compared.
    assert "s3 notifications" not in statuses(report)


def test_a_bucket_that_notifies_another_queue_fails(region: Region, s3_client: Any,
                                                    tmp_path: Path) -> None:
    s3_client.put_bucket_notification_configuration(
        Bucket=region.bucket, NotificationConfiguration={})
    code, report = doctor(region.config(tmp_path / "nonotify.toml"))
    n = by_name(report, "s3 notifications")
    assert code == 1 and n["status"] == "FAIL" and "sends no events" in n["seen"]


def test_a_checkpoint_topic_that_is_not_compacted_fails(region: Region,
                                                        tmp_path: Path) -> None:
    Admin(KafkaSettings(brokers=region.brokers)).alter_topic_config(
        region.checkpoint_topic, {"cleanup.policy": "delete"})
    code, report = doctor(region.config(tmp_path / "cp.toml"))
    cp = by_name(report, f"checkpoint topic {region.checkpoint_topic}")
    assert code == 1 and cp["status"] == "FAIL"
    assert "cleanup.policy=delete" in cp["seen"]
    assert cp["fix"].startswith(f"set cleanup.policy=compact on {region.checkpoint_topic}")


def test_missing_internal_topics_are_warned_about(region: Region, tmp_path: Path) -> None:
    cfg = region.config(tmp_path / "fresh.toml")
    cfg.write_text(cfg.read_text().replace(region.checkpoint_topic, unique_name("nocp")))
    code, report = doctor(cfg)
    cp = next(c for c in report["checks"] if c["check"].startswith("checkpoint topic"))
    assert cp["status"] == "WARN" and cp["seen"] == "does not exist yet"
    assert code == 0


def test_sources_without_topic_json_or_with_a_smaller_destination(
        region: Region, s3_client: Any, tmp_path: Path) -> None:
    waiting, small = unique_name("waiting"), unique_name("small")
    s3_client.put_object(Bucket=region.bucket, Key=topic_meta_key("data", SOURCE, small),
                         Body=TopicMetadata(4, topic=small, region=SOURCE).encode())
    admin = Admin(KafkaSettings(brokers=region.brokers))
    assert admin.create_topic(small, 2)
    wait_for(lambda: admin.partition_count(small) == 2, 10, "the topic's metadata")
    code, report = doctor(region.config(tmp_path / "sources.toml", extra=f"""
[[ingress.sources]]
region = "{SOURCE}"
topic = "{waiting}"
[[ingress.sources]]
region = "{SOURCE}"
topic = "{small}"
"""))
    w = by_name(report, f"source {SOURCE}/{waiting}")
    assert w["status"] == "WARN"
    assert w["seen"] == f"no data/{SOURCE}/{waiting}/_topic.json yet: nothing to replay"
    s = by_name(report, f"source {SOURCE}/{small}")
    assert s["status"] == "WARN" and s["seen"] == f"4 partition(s) → {small}, which has 2"
    assert statuses(report)[f"source {SOURCE}/{region.source}"] == "PASS"
    assert code == 0


@pytest.mark.apache
def test_a_transaction_timeout_above_the_brokers_limit_fails(region: Region,
                                                             tmp_path: Path) -> None:
    code, report = doctor(region.config(tmp_path / "txn.toml",
                                        kafka_config='"transaction.timeout.ms" = 1000000'))
    t = by_name(report, "transaction.max.timeout.ms")
    assert code == 1 and t["status"] == "FAIL"
    assert t["seen"] == "900000 on the brokers; ingress uses 1000000 (kafka.config)"


def test_an_egress_config_with_its_topics_and_compaction(
        moto_endpoint: str, s3_client: Any, bucket: str, source_brokers: str,
        tmp_path: Path) -> None:
    base = unique_name("dr")
    present, missing, matched = f"{base}.a", f"{base}.gone", f"{base}.sensor.x"
    admin = Admin(KafkaSettings(brokers=source_brokers))
    assert admin.create_topic(present, 3)
    assert admin.create_topic(matched, 2)
    wait_for(lambda: admin.partition_count(present) == 3 and admin.partition_count(matched) == 2,
             10, "the topics' metadata")
    cfg = tmp_path / "egress.toml"
    cfg.write_text(f'''region = "{SOURCE}"
[s3]
bucket = "{bucket}"
endpoint_url = "{moto_endpoint}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "{source_brokers}"
[egress]
select = {{ include = ["{base}\\\\.sensor\\\\..*"] }}
[egress.topics."{present}"]
[egress.topics."{missing}"]
[compaction]
spark_master = "spark://127.0.0.1:{free_port()}"
[compaction.topics."{present}"]
''')
    code, report = doctor(cfg)
    got = statuses(report)
    assert got[f"topic {present}"] == "PASS"
    assert by_name(report, f"topic {present}")["seen"] == "3 partition(s)"
    assert got[f"topic {missing}"] == "WARN"
    assert by_name(report, "egress select")["seen"] == f"1 topic(s) match now: {matched} (2)"
    assert got["s3 versioning"] == "WARN"        # a new bucket: never enabled
    # A writer: a temporary object written, read and deleted again.
    assert got["s3 temp object"] == "PASS"
    assert list(s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])) == []
    assert got["spark master"] == "FAIL" and "Connection refused" in \
        by_name(report, "spark master")["seen"]
    # Java from the machine (Spark 4 needs 17+; the test infrastructure has 17).
    assert got["java"] == "PASS", by_name(report, "java")
    assert not any(c.startswith(("sqs", "checkpoint")) for c in got)
    assert code == 1


def test_a_config_that_does_not_load_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('region = "us-west-1"\n[kafka]\nbrokers = "k:1"\n')
    res = CliRunner().invoke(main, ["doctor", "--config", str(cfg)])
    assert res.exit_code == 2 and "s3" in res.output
