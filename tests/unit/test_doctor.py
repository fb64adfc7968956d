"""``replicator doctor``: the pure decisions of each dependency's checks, and the gathering
functions on fakes (the real stack: tests/integration/test_doctor.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from replicator.cli.doctor import table_rows, used_transaction_timeout
from replicator.cli.main import main
from replicator.core.errors import (
    ConfigError,
    KafkaRetriableError,
    ObjectNotFound,
    StorageError,
    StorageFatalError,
)
from replicator.core.kafka import ClusterInfo
from replicator.core.keys import topic_meta_key
from replicator.core.s3 import BucketHead, QueueNotification
from replicator.core.settings import (
    CompactionSettings,
    IngressSettings,
    Settings,
    load_settings,
)
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Refusal, TopicMetadata
from replicator.ops.checkpoints import CheckpointRow
from replicator.ops.doctor import Check, Status, exit_code, overall
from replicator.ops.doctor.compaction import (
    compaction_checks,
    java_check,
    java_major,
    master_address,
    spark_master_check,
)
from replicator.ops.doctor.kafka import (
    InternalTopic,
    auto_create_check,
    bootstrap_addresses,
    broker_causes,
    cluster_check,
    egress_topic_checks,
    internal_topic_check,
    kafka_checks,
    reach_check,
    transaction_timeout_check,
)
from replicator.ops.doctor.s3 import (
    bucket_check,
    list_check,
    mirror_check,
    notification_check,
    s3_checks,
    skew_check,
    temp_object_check,
    versioning_check,
)
from replicator.ops.doctor.sources import refused_check, source_check, source_checks
from replicator.ops.doctor.sqs import queue_check, sqs_checks, visibility_check

P, W, F = Status.PASS, Status.WARN, Status.FAIL
T0 = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def settings(**sections: Any) -> Settings:
    data: dict[str, Any] = {"region": "us-west-1", "s3": {"bucket": "b"},
                            "kafka": {"brokers": "k1:9092,k2:9092"}, **sections}
    return load_settings(data=data, environ={})


INGRESS = {"sqs_queue": "q", "sources": [{"region": "us-east-1", "topic": "t"}]}

# --- report ----------------------------------------------------------------------------


def test_overall_and_exit_code() -> None:
    assert overall([]) is P and exit_code([]) == 0
    checks = [Check("a", P, ""), Check("b", W, "", "x")]
    assert overall(checks) is W and exit_code(checks) == 0
    checks.append(Check("c", F, "", "y"))
    assert overall(checks) is F and exit_code(checks) == 1
    assert checks[2].as_dict() == {"check": "c", "status": "FAIL", "seen": "", "fix": "y"}


def test_table_rows_wrap_long_texts_under_their_check() -> None:
    rows = table_rows([Check("kafka reachable", F, "word " * 30, "fix it"),
                       Check("s3 bucket", P, "ok")])
    assert rows[0][:2] == ["kafka reachable", "FAIL"] and rows[0][3] == "fix it"
    assert all(r[:2] == ["", ""] for r in rows[1:-1]) and len(rows) > 3
    assert " ".join(r[2] for r in rows[:-1]).split() == ["word"] * 30
    assert rows[-1] == ["s3 bucket", "PASS", "ok", ""]


# --- kafka -----------------------------------------------------------------------------


def test_bootstrap_addresses() -> None:
    assert bootstrap_addresses(" a:1, SASL_SSL://b:2,,") == ["a:1", "b:2"]


ERRORS = [
    "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
    "(after 0ms in state CONNECT)",
    "nosuch.invalid:9092/bootstrap: Failed to resolve 'nosuch.invalid:9092': Name or "
    "service not known (after 1ms in state CONNECT)",
    "2/2 brokers are down",
]


def test_unreachable_brokers_are_named_with_their_cause() -> None:
    causes = broker_causes(["127.0.0.1:1", "nosuch.invalid:9092"], ERRORS)
    assert causes == {
        "127.0.0.1:1": "Connect to ipv4#127.0.0.1:1 failed: Connection refused",
        "nosuch.invalid:9092": "Failed to resolve 'nosuch.invalid:9092': Name or service "
                               "not known"}
    c = reach_check("127.0.0.1:1,nosuch.invalid:9092", "Failed to get metadata", ERRORS,
                    5.0, 5.0)
    assert c.status is F
    assert "127.0.0.1:1: Connect to ipv4#127.0.0.1:1 failed: Connection refused" in c.seen
    assert "nosuch.invalid:9092: Failed to resolve" in c.seen
    assert c.fix.startswith("nothing listens at 127.0.0.1:1")


@pytest.mark.parametrize(("error", "fix"), [
    ("Failed to resolve 'h:1': Name or service not known", "does not resolve"),
    ("SSL handshake failed: certificate verify failed", "TLS handshake"),
    ("SASL authentication error: Authentication failed", "sasl.username"),
    ("Connection setup timed out in state CONNECT", "network path"),
])
def test_the_fix_follows_the_cause(error: str, fix: str) -> None:
    c = reach_check("h:1", "no metadata", [f"h:1/bootstrap: {error}"], 5.0, 5.0)
    assert c.status is F and fix in c.fix, c


def test_no_client_error_still_names_the_brokers() -> None:
    c = reach_check("h:1", "timed out", [], 5.0, 5.0)
    assert c.status is F and "h:1" in c.seen and "within 5s" in c.seen
    assert reach_check("h:1", None, [], 0.01, 5.0).status is P


def test_cluster() -> None:
    assert cluster_check(ClusterInfo("abc", 1, (1, 2))).status is P
    assert cluster_check(ClusterInfo(None, None, ())).status is W


def test_egress_topics() -> None:
    checks = egress_topic_checks(["a", "gone"], ["s\\..*"], ["a", "gone", "s.x"],
                                 {"a": 3, "s.x": 2, "other": 1})
    assert [(c.name, c.status) for c in checks] == [
        ("topic a", P), ("topic gone", W), ("egress select", P)]
    assert checks[0].seen == "3 partition(s)" and "s.x (2)" in checks[2].seen
    none = egress_topic_checks([], ["nothing.*"], [], {"a": 1})
    assert [c.status for c in none] == [W]


CP = InternalTopic("checkpoint topic", "cp", compacted=True)
EV = InternalTopic("segment events topic", "ev", compacted=False)


@pytest.mark.parametrize(("topic", "partitions", "configs", "status"), [
    (CP, 1, {"cleanup.policy": "compact"}, P),
    (CP, 1, {"cleanup.policy": "delete"}, F),
    (CP, 1, {"cleanup.policy": "compact,delete"}, F),
    (CP, 1, {"cleanup.policy": "compact", "segment.ms": str(7 * 86_400_000)}, W),
    (CP, 1, {}, W),                       # a broker that does not describe it
    (CP, None, None, W),                  # missing: ingress creates it
    (CP, 1, None, W),                     # configs not readable
    (EV, 1, {"cleanup.policy": "delete"}, P),
    (EV, 1, {"cleanup.policy": "compact"}, W),
])
def test_internal_topics(topic: InternalTopic, partitions: int | None,
                         configs: dict[str, str] | None, status: Status) -> None:
    c = internal_topic_check(topic, partitions, configs, "denied")
    assert c.status is status, c
    assert c.name == f"{topic.role} {topic.topic}"
    if status is F:
        assert "cleanup.policy=compact" in c.fix


def test_auto_create() -> None:
    assert auto_create_check("false").status is P
    assert auto_create_check("true").status is W
    c = auto_create_check(None, "the broker describes no configs")
    assert c.status is W and "no configs" in c.seen


def test_transaction_timeout() -> None:
    assert transaction_timeout_check("900000", 150_000, "ingress default").status is P
    c = transaction_timeout_check("60000", 150_000, "ingress default")
    assert c.status is F and "at least 150000" in c.fix and "60000" in c.seen
    assert transaction_timeout_check(None, 150_000, "kafka.config").status is W


def test_used_transaction_timeout() -> None:
    assert used_transaction_timeout(settings()) is None
    assert used_transaction_timeout(settings(ingress=INGRESS)) == (150_000, "ingress default")
    s = settings(ingress=INGRESS, kafka={"brokers": "k:1",
                                         "config": {"transaction.timeout.ms": 1_000_000}})
    assert used_transaction_timeout(s) == (1_000_000, "kafka.config")
    alo = settings(ingress={**INGRESS, "delivery": "at-least-once"})
    assert used_transaction_timeout(alo) is None
    bad = settings(ingress=INGRESS, kafka={"brokers": "k:1",
                                           "config": {"transaction.timeout.ms": "soon"}})
    with pytest.raises(ConfigError, match=r"transaction\.timeout\.ms"):
        used_transaction_timeout(bad)


class FakeAdmin:
    """A cluster as the Kafka checks read it."""

    timeout = 5.0

    def __init__(self, topics: dict[str, int] | None, broker: dict[str, str],
                 configs: dict[str, dict[str, str]]) -> None:
        self.topics, self.broker, self.configs = topics, broker, configs

    def topic_partitions(self) -> dict[str, int]:
        if self.topics is None:
            raise KafkaRetriableError("list topics: Local: Broker transport failure")
        return dict(self.topics)

    def client_errors(self) -> list[str]:
        return ERRORS[:1]

    def cluster(self) -> ClusterInfo:
        return ClusterInfo("id-1", 1, (1,))

    def broker_config(self, broker_id: int) -> dict[str, str]:
        return dict(self.broker)

    def effective_topic_config(self, topic: str) -> dict[str, str]:
        return self.configs[topic]


def test_kafka_checks_stop_at_an_unreachable_cluster() -> None:
    s = settings(ingress=INGRESS, kafka={"brokers": "127.0.0.1:1"})
    checks = kafka_checks(FakeAdmin(None, {}, {}), s, transaction_timeout=(150_000, "x"))
    assert [(c.name, c.status) for c in checks] == [("kafka reachable", F)]
    assert "Connection refused" in checks[0].seen


def test_kafka_checks_of_an_ingress_config() -> None:
    s = settings(ingress=INGRESS)
    admin = FakeAdmin(
        {"replicator.checkpoint": 1, "replicator.segmentevents": 1},
        {"auto.create.topics.enable": "false", "transaction.max.timeout.ms": "100000"},
        {"replicator.checkpoint": {"cleanup.policy": "delete"},
         "replicator.segmentevents": {"cleanup.policy": "delete"}})
    checks = kafka_checks(admin, s, transaction_timeout=(150_000, "ingress default"))
    assert [(c.name, c.status) for c in checks] == [
        ("kafka reachable", P), ("kafka cluster", P),
        ("checkpoint topic replicator.checkpoint", F),
        ("segment events topic replicator.segmentevents", P),
        ("offset map topic replicator.offsetmap", W),
        ("topic auto-creation", P), ("transaction.max.timeout.ms", F)]


def test_kafka_checks_of_a_broker_without_configs() -> None:
    # Tansu describes no broker configs: unknown, not "false".
    s = settings(egress={"topics": {"a": {}}})
    checks = kafka_checks(FakeAdmin({"a": 4}, {}, {}), s, select=lambda ts: {"a"})
    assert [(c.name, c.status) for c in checks] == [
        ("kafka reachable", P), ("kafka cluster", P), ("topic a", P),
        ("topic auto-creation", W)]


# --- s3 ----------------------------------------------------------------------------------


def test_bucket() -> None:
    assert bucket_check("b", BucketHead("us-west-1", T0, T0, T0), None).status is P
    missing = bucket_check("b", None, ObjectNotFound("head bucket s3://b: does not exist"))
    assert missing.status is F and "does not exist" in missing.seen
    assert "create the bucket" in missing.fix
    assert "s3.endpoint_url" in bucket_check("b", None, StorageError("timeout")).fix
    assert "s3:ListBucket" in bucket_check("b", None, StorageFatalError("403")).fix


def test_versioning() -> None:
    assert versioning_check("b", "Enabled").status is P
    for status in ("Suspended", None):
        c = versioning_check("b", status)
        assert c.status is W and "put-bucket-versioning" in c.fix


def test_temp_object_round_trip() -> None:
    store = MemoryObjectStore("b")
    c = temp_object_check(store, "temp")
    assert c.status is P and "temp/doctor-" in c.seen
    assert list(store.list("")) == []      # deleted again


class RefusingStore(MemoryObjectStore):
    def get(self, key: str) -> bytes:
        raise StorageFatalError(f"get s3://b/{key}: AccessDenied")


def test_temp_object_names_the_refused_step() -> None:
    c = temp_object_check(RefusingStore("b"), "temp")
    assert c.status is F and c.seen.startswith("get temp/doctor-")
    assert "s3:GetObject on temp/*" in c.fix


ARN = "arn:aws:sqs:us-west-1:123456789012:q"


@pytest.mark.parametrize(("notifications", "status", "text"), [
    ([QueueNotification(ARN, ("s3:ObjectCreated:*", "s3:ObjectRemoved:*"), "data/")], P, ""),
    ([QueueNotification(ARN, ("s3:ObjectCreated:*", "s3:ObjectRemoved:*"), "")], P, ""),
    ([], F, "add a notification"),
    ([QueueNotification("arn:other", ("s3:ObjectCreated:*",), "")], F, "add a notification"),
    ([QueueNotification(ARN, ("s3:ObjectCreated:*",), "data/")], W, "s3:ObjectRemoved:*"),
    ([QueueNotification(ARN, ("s3:ObjectCreated:*", "s3:ObjectRemoved:*"), "other/")], W,
     "leaves out data/us-east-1/"),
])
def test_notifications(notifications: list[QueueNotification], status: Status,
                       text: str) -> None:
    c = notification_check("b", "q", ARN, ["data/us-east-1/"], notifications)
    assert c.status is status and text in c.fix, c


@pytest.mark.parametrize(("offset", "rtt", "status"), [
    (timedelta(0), timedelta(milliseconds=20), P),
    (timedelta(seconds=1), timedelta(milliseconds=20), P),     # the Date header's second
    (timedelta(seconds=-30), timedelta(milliseconds=20), W),
    (timedelta(seconds=3), timedelta(seconds=2), P),           # within the round trip
    (timedelta(minutes=20), timedelta(milliseconds=20), F),
])
def test_clock_skew(offset: timedelta, rtt: timedelta, status: Status) -> None:
    head = BucketHead(None, T0 + rtt / 2 + offset, T0, T0 + rtt)
    c = skew_check(head)
    assert c.status is status, c
    if status is W:
        assert "30.0s ahead of S3" in c.seen
    assert skew_check(BucketHead(None, None, T0, T0)).status is W


class FakeBucket:
    bucket = "b"

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def head_bucket(self) -> BucketHead:
        if self.error is not None:
            raise self.error
        return BucketHead("us-west-1", T0, T0, T0)

    def versioning(self) -> str | None:
        return None

    def queue_notifications(self) -> list[QueueNotification]:
        return []


def test_s3_checks() -> None:
    s = settings(ingress=INGRESS)
    store = MemoryObjectStore("b")
    missing = s3_checks(FakeBucket(ObjectNotFound("no")), store, s, queue=("q", ARN))
    assert [(c.name, c.status) for c in missing] == [("s3 bucket", F)]
    # The clock cannot be compared with T0 here: that is test_clock_skew's.
    checks = s3_checks(FakeBucket(), store, s, queue=("q", ARN))
    # Ingress writes nothing to the bucket: its prefixes are listed instead.
    assert [(c.name, c.status) for c in checks if c.name != "clock skew (S3)"] == [
        ("s3 bucket", P), ("s3 versioning", W), ("s3 list", P), ("s3 notifications", F)]
    assert list(store.list("")) == []
    writer = settings(egress={"topics": {"a": {}}})
    checks = s3_checks(FakeBucket(), store, writer)
    assert [c.name for c in checks] == ["s3 bucket", "s3 versioning", "s3 temp object",
                                        "clock skew (S3)"]


class RefusingList(MemoryObjectStore):
    def list(self, prefix: str, *, start_after: str | None = None) -> Any:
        raise StorageFatalError(f"list s3://b/{prefix}*: AccessDenied")


def test_list_of_the_source_prefixes() -> None:
    store = MemoryObjectStore("b")
    store.put("data/us-east-1/t/0/0/x", b"x")
    c = list_check(store, ["data/us-east-1/", "data/eu-west-1/"])
    assert c.status is P
    assert c.seen == "data/us-east-1/: objects; data/eu-west-1/: empty so far"
    refused = list_check(RefusingList("b"), ["data/us-east-1/"])
    assert refused.status is F and "s3:ListBucket" in refused.fix


# --- sqs ---------------------------------------------------------------------------------


def test_queue() -> None:
    ok = queue_check("q", {"ApproximateNumberOfMessages": "3"}, None)
    assert ok.status is P and "3 message(s)" in ok.seen
    missing = queue_check("q", None, ObjectNotFound("get url of SQS queue q: does not exist"))
    assert missing.status is F and "ingress.sqs_queue" in missing.fix
    assert queue_check("q", None, StorageFatalError("AccessDenied")).status is F


def test_visibility_timeout() -> None:
    assert visibility_check({"VisibilityTimeout": "60"}).status is P
    short = visibility_check({"VisibilityTimeout": "5"})
    assert short.status is W and "VisibilityTimeout=60" in short.fix
    assert visibility_check({}).status is W


class FakeQueue:
    name = "q"
    arn = ARN

    def __init__(self, attributes: dict[str, str] | None) -> None:
        self._attributes = attributes

    def attributes(self) -> dict[str, str]:
        if self._attributes is None:
            raise ObjectNotFound("get url of SQS queue q: does not exist")
        return self._attributes


def test_sqs_checks() -> None:
    checks, arn = sqs_checks(FakeQueue(None))
    assert [(c.name, c.status) for c in checks] == [("sqs queue", F)] and arn is None
    checks, arn = sqs_checks(FakeQueue({"VisibilityTimeout": "60", "QueueArn": ARN}))
    assert [c.status for c in checks] == [P, P] and arn == ARN


# --- ingress sources ---------------------------------------------------------------------


def test_source_check() -> None:
    key = "data/us-east-1/t/_topic.json"
    assert source_check("us-east-1", "t", "t.copy", key, 3, 3).status is P
    created = source_check("us-east-1", "t", "t.copy", key, 3, None)
    assert created.status is P and created.seen == \
        "3 partition(s) → t.copy: ingress creates it"
    small = source_check("us-east-1", "t", "t.copy", key, 3, 2)
    assert small.status is W and "--partitions 3" in small.fix
    waiting = source_check("us-east-1", "t", "t.copy", key, None, None)
    assert waiting.status is W and waiting.seen == f"no {key} yet: nothing to replay"
    assert "copies data/us-east-1/ into this bucket" in waiting.fix
    assert source_check("us-east-1", "t", "t.copy", key, None, None, "not JSON").status is F


def test_source_checks_find_sources_as_ingress_does() -> None:
    ingress = IngressSettings.model_validate({"sqs_queue": "q", "sources": [
        {"region": "us-east-1", "topic": "named", "destination_topic": "{topic}.copy"},
        {"region": "us-east-1", "topic_pattern": "s\\..*"}]})
    store = MemoryObjectStore("b")
    for topic, n in (("named", 2), ("s.found", 4)):
        store.put(topic_meta_key("data", "us-east-1", topic),
                  TopicMetadata(n, topic=topic, region="us-east-1").encode())
    store.put(topic_meta_key("data", "us-east-1", "other"), TopicMetadata(1).encode())
    store.put(topic_meta_key("data", "us-east-1", "s.bad"), b"not json")
    checks = source_checks(ingress, "data", store, {"named.copy": 2, "s.found": 1})
    assert [(c.name, c.status) for c in checks] == [
        ("source us-east-1/named", P), ("source us-east-1/s.bad", F),
        ("source us-east-1/s.found", W)]


# --- compaction --------------------------------------------------------------------------


def test_java_version() -> None:
    assert java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert java_major('java version "1.8.0_381"') == 8
    assert java_major('openjdk version "21" 2023-09-19') == 21
    assert java_major("nonsense") is None
    assert java_check('openjdk version "17.0.15"', None, "4.0.1").status is P
    old = java_check('openjdk version "11.0.2"', None, "4.0.1")
    assert old.status is F and "Java 17" in old.fix
    assert java_check('openjdk version "11.0.2"', None, "3.5.3").status is P
    assert java_check(None, "java not found", "4.0.1").status is F
    assert java_check('openjdk version "17"', None, None).status is F   # no pyspark


def test_spark_master() -> None:
    assert master_address("spark://m1:7078,m2:7078") == ("m1", 7078)
    assert master_address("spark://m1") == ("m1", 7077)
    assert master_address("k8s://https://api.example:6443") == ("api.example", 6443)
    assert master_address("k8s://api.example") == ("api.example", 443)
    assert master_address("local[*]") is None
    for master in ("inline", "", "local[2]"):
        assert spark_master_check(master, None).status is P
    down = spark_master_check("spark://m:7077", "Connection refused")
    assert down.status is F and "m:7077" in down.seen
    assert spark_master_check("yarn", None).status is W


def test_compaction_checks() -> None:
    cfg = CompactionSettings.model_validate({"spark_master": "spark://m:1", "topics": {"t": {}}})
    calls: list[tuple[str, int]] = []

    def connect(host: str, port: int, timeout: float) -> str | None:
        calls.append((host, port))
        return "Connection refused"

    checks = compaction_checks(cfg, java_home=None, timeout=1,
                               java=lambda home: ('openjdk version "17.0.1"', None),
                               connect=connect, spark=lambda: "4.0.0")
    assert [(c.name, c.status) for c in checks] == [("spark master", F), ("java", P)]
    assert calls == [("m", 1)]
    inline = cfg.model_copy(update={"spark_master": "inline"})
    checks = compaction_checks(inline, java_home=None, timeout=1,
                               java=lambda home: (None, "not found"), spark=lambda: None)
    assert [(c.name, c.status) for c in checks] == [("spark master", P)]


# --- documentation -----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_every_check_is_documented() -> None:
    """docs/operations.md has a row for every check the doctor prints."""
    s = settings(ingress=INGRESS, egress={"topics": {"a": {}}, "select": {"include": ["s.*"]}},
                 compaction={"spark_master": "spark://m:1", "topics": {"a": {}}})
    admin = FakeAdmin({"a": 1}, {}, {})
    names = [c.name for c in kafka_checks(admin, s, select=lambda ts: {"a"},
                                          transaction_timeout=(1, "x"))]
    names += [c.name for c in s3_checks(FakeBucket(), MemoryObjectStore("b"), s,
                                        queue=("q", ARN))]
    names += [c.name for c in s3_checks(FakeBucket(), MemoryObjectStore("b"),
                                        settings(ingress=INGRESS))]
    names += [c.name for c in sqs_checks(FakeQueue({"VisibilityTimeout": "60"}))[0]]
    assert s.ingress is not None
    names += ["source REGION/TOPIC" for c in source_checks(s.ingress, "data",
                                                           MemoryObjectStore("b"), {})
              if c.name == "source us-east-1/t"]
    assert s.compaction is not None
    names += [c.name for c in compaction_checks(s.compaction, java_home=None, timeout=1,
                                                java=lambda home: (None, "x"),
                                                connect=lambda h, p, t: None,
                                                spark=lambda: None)]
    doc = (ROOT / "docs" / "operations.md").read_text()
    topics = {"a", "replicator.checkpoint", "replicator.segmentevents", "replicator.offsetmap"}
    documented = {n.rsplit(" ", 1)[0] + " NAME" if n.rsplit(" ", 1)[-1] in topics else n
                  for n in names}
    assert len(documented) == 20
    missing = sorted(n for n in documented if f"`{n}`" not in doc)
    assert not missing, f"docs/operations.md has no row for {missing}"


def test_every_command_is_in_the_commands_doc() -> None:
    """docs/operator-commands.md, which the README's documentation map points to, names
    every ``replicator`` command."""
    doc = (ROOT / "docs" / "operator-commands.md").read_text()
    missing = [name for name in main.commands if f"replicator {name}" not in doc]
    assert not missing, f"docs/operator-commands.md does not show {missing}"
    assert "(docs/operator-commands.md)" in (ROOT / "README.md").read_text()


def test_a_partition_stopped_at_a_refused_record_fails_naming_it() -> None:
    refusal = Refusal(10, 150_040, "max.message.bytes=100000", "Broker: Message size too large")
    stopped = CheckpointRow("us-east-1", "t", 0, "t.copy", 6, None, 20, None, refused=refusal)
    fine = CheckpointRow("us-east-1", "t", 1, "t.copy", 20, None, 20, None)
    passed_it = CheckpointRow("us-east-1", "t", 2, "t.copy", 12, None, 20, None,
                              refused=refusal)      # a record the partition got past
    assert refused_check([fine, passed_it]).status is Status.PASS
    c = refused_check([stopped, fine])
    assert c.status is Status.FAIL
    assert c.seen == ("us-east-1/t[0] -> t.copy: offset 10 (150040 bytes; destination "
                      "max.message.bytes=100000): Broker: Message size too large")
    assert "max.message.bytes" in c.fix


# --- one controller's checks ---------------------------------------------------------------

def test_only_one_controller_checks_what_its_own_credentials_need() -> None:
    from replicator.cli.doctor import only_controller
    from replicator.ops.doctor.acls import needs
    full = settings(egress={"topics": {"orders": {}}}, ingress=INGRESS,
                    compaction={"topics": {"orders": {}}})
    egress = only_controller(full, "egress")
    assert egress.ingress is None and egress.compaction is None and egress.egress is not None
    assert {n.why for n in needs(egress, ["orders"])} == {"egress reads it",
                                                             "egress's consumer group"}
    ingress = only_controller(full, "ingress")
    assert ingress.egress is None and not any(
        n.why.startswith("egress") for n in needs(ingress, ["orders"]))
    with pytest.raises(ConfigError, match=r"--only.*\[compaction\]"):
        only_controller(settings(ingress=INGRESS), "compaction")


def test_only_compaction_asks_nothing_of_kafka(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction uses no Kafka: its doctor never builds a Kafka client (it would report
    brokers compaction's credentials need not reach)."""
    import replicator.cli.doctor as doctor_cli

    def no_kafka(*_: Any, **__: Any) -> Any:
        raise AssertionError("compaction's doctor built a Kafka client")

    monkeypatch.setattr(doctor_cli, "Admin", no_kafka)
    monkeypatch.setattr(doctor_cli, "s3_checks", lambda *a, **k: [Check("bucket", P, "", "")])
    monkeypatch.setattr(doctor_cli, "compaction_checks",
                        lambda *a, **k: [Check("spark master", P, "", "")])
    full = settings(egress={"topics": {"orders": {}}}, compaction={"topics": {"orders": {}}})
    checks = doctor_cli.run_checks(doctor_cli.only_controller(full, "compaction"), 1.0)
    assert [c.name for c in checks] == ["bucket", "spark master"]


def test_only_names_a_section_the_config_lacks_with_exit_code_2(tmp_path: Path) -> None:
    from click.testing import CliRunner
    cfg = tmp_path / "c.toml"
    cfg.write_text('region = "r"\n[kafka]\nbrokers = "k:9092"\n[s3]\nbucket = "b"\n'
                   '[egress.topics."t"]\n')
    result = CliRunner().invoke(main, ["doctor", "--config", str(cfg), "--only", "ingress"])
    assert result.exit_code == 2, result.output
    assert "[ingress]" in result.output


def test_mirror_bucket() -> None:
    head = BucketHead("us-west-2", T0, T0, T0)
    assert mirror_check("peer", "us-west-2", head, None).status is P
    assert mirror_check("peer", "us-west-2", BucketHead(None, T0, T0, T0), None).status is P
    elsewhere = mirror_check("peer", "eu-central-1", head, None)
    assert elsewhere.status is F and "us-west-2" in elsewhere.seen
    missing = mirror_check("peer", "us-west-2", None, ObjectNotFound("no"))
    assert missing.status is F and "NoSuchBucket" in missing.seen
    assert "egress.mirror.bucket" in missing.fix
    silent = mirror_check("peer", "us-west-2", None, StorageError("timeout"))
    assert silent.status is F and "egress.mirror.region" in silent.fix
    denied = mirror_check("peer", "us-west-2", None, StorageFatalError("403 AccessDenied"))
    assert denied.status is P and "exists" in denied.seen    # no s3:ListBucket granted


def test_doctor_asks_the_mirror_bucket_with_the_mirrors_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import replicator.cli.doctor as doctor_cli

    asked: list[Settings] = []

    def destination(s: Settings) -> FakeBucket | None:
        asked.append(s)
        return FakeBucket(ObjectNotFound("no")) if s.egress and s.egress.mirror else None

    monkeypatch.setattr(doctor_cli, "mirror_destination", destination)
    assert doctor_cli.mirror_checks(settings(egress={"topics": {"t": {}}})) == []
    on = settings(egress={"topics": {"t": {}}, "mirror": {"bucket": "peer",
                                                          "region": "us-west-2"}})
    [check] = doctor_cli.mirror_checks(on)
    assert (check.name, check.status) == ("s3 mirror bucket", F)
    assert "s3://peer" in check.seen and asked[-1] is on
