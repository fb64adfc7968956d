"""The doctor's permission checks (``replicator.ops.doctor.acls``): what each service needs
and the verdict on what the cluster says the principal may do, with a fake cluster. The
same on Apache Kafka with SASL/PLAIN and ACLs: tests/integration/test_kafka_doctor_acls.py.
"""

from __future__ import annotations

from typing import Any

from replicator.core.errors import KafkaFatalError
from replicator.core.settings import Settings, load_settings
from replicator.ops.doctor import Status
from replicator.ops.doctor.acls import (
    Granted,
    Need,
    acl_check,
    acl_checks,
    idempotent_check,
    needs,
    principal,
    transactional_check,
)

P, W, F = Status.PASS, Status.WARN, Status.FAIL
ALL = frozenset({"READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS", "CREATE"})


def settings(**sections: Any) -> Settings:
    data: dict[str, Any] = {"region": "us-west-1", "s3": {"bucket": "b"},
                            "kafka": {"brokers": "k:9092", "config": {
                                "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                                "sasl.password": "x"}}, **sections}
    return load_settings(data=data, environ={})


INGRESS = {"sqs_queue": "q", "group_id": "ing", "sources": [
    {"region": "us-east-1", "topic": "t", "destination_topic": "t.copy"}]}


def test_a_missing_operation_fails_with_the_grant_that_fixes_it() -> None:
    need = Need("topic", "orders", ("DESCRIBE", "READ"), "egress reads it")
    c = acl_check(need, frozenset({"DESCRIBE"}), "User:alice")
    assert c.status is F
    assert c.seen == "egress reads it: READ not allowed (allowed: DESCRIBE)"
    assert c.fix == ("grant kafka-acls.sh --add --allow-principal User:alice --operation Read "
                     "--topic orders (docs/security.md)")
    assert acl_check(need, frozenset({"DESCRIBE", "READ", "WRITE"}), "u").status is P
    assert acl_check(need, "NOT_COORDINATOR: loading", "u").status is W
    refused = acl_check(need, "Topic authorization failed", "u")
    assert refused.status is F and "refused: Topic authorization failed" in refused.seen
    assert "--operation Describe --operation Read" in refused.fix
    assert acl_check(need, None, "u").status is P          # no authorizer: nothing to check


def test_idempotent_write_from_the_cluster_or_write_on_a_topic() -> None:
    assert idempotent_check(frozenset({"IDEMPOTENT_WRITE"}), {}, "u").status is P
    assert idempotent_check(frozenset({"DESCRIBE"}), {"t": frozenset({"WRITE"})},
                            "u").status is P
    assert idempotent_check(frozenset({"DESCRIBE"}), {"t": frozenset({"READ"}),
                                                      "x": "refused"}, "u").status is F
    assert idempotent_check(None, {}, "u").status is P


def test_transactional_ids() -> None:
    assert transactional_check("ing.", None, "u").status is P
    c = transactional_check("ing.", "init transactions: Transactional Id authorization "
                            "failed", "User:alice")
    assert c.status is F and "--resource-pattern-type prefixed --transactional-id ing." in c.fix
    assert transactional_check("ing.", "coordinator not available", "u").status is W


def test_what_each_service_needs() -> None:
    s = settings(egress={"group_id": "eg", "topics": {"a": {}, "gone": {}}}, ingress=INGRESS)
    got = {(n.resource, n.name, n.operations) for n in needs(s, selected={"a", "gone"})}
    rw = ("DESCRIBE", "READ", "WRITE")
    assert got == {
        ("topic", "a", ("DESCRIBE", "READ", "DESCRIBE_CONFIGS")),
        ("topic", "gone", ("DESCRIBE", "READ", "DESCRIBE_CONFIGS")),
        ("group", "eg", ("READ",)),
        # exactly-once: TxnOffsetCommit of a destination partition needs READ there
        ("topic", "t.copy", ("DESCRIBE", "WRITE", "READ")),
        ("topic", "replicator.checkpoint", rw), ("topic", "replicator.segmentevents", rw),
        ("topic", "replicator.offsetmap", rw),
        ("group", "ing", ("READ",))}
    assert principal(s.kafka.config) == "User:alice"


class FakeCluster:
    def __init__(self, topics: dict[str, Granted], groups: dict[str, Granted],
                 cluster: frozenset[str] | None) -> None:
        self.topics, self.groups, self.cluster = topics, groups, cluster

    def cluster_operations(self) -> frozenset[str] | None:
        return self.cluster

    def topic_operations(self, topics: list[str]) -> dict[str, Granted]:
        return {t: self.topics.get(t, "Topic authorization failed") for t in topics}

    def group_operations(self, group: str) -> Granted:
        return self.groups.get(group, "Group authorization failed")


def test_acl_checks_of_an_exactly_once_ingress() -> None:
    s = settings(ingress=INGRESS)
    tried: list[str] = []

    def init(txn_id: str) -> None:
        tried.append(txn_id)
        raise KafkaFatalError("init transactions: TRANSACTIONAL_ID_AUTHORIZATION_FAILED")

    cluster = FakeCluster({"t.copy": frozenset({"DESCRIBE", "WRITE"}),
                           "replicator.checkpoint": frozenset({"DESCRIBE", "WRITE"}),
                           "replicator.offsetmap": "Broker: Unknown topic or partition"},
                          {"ing": frozenset({"READ", "DESCRIBE"})}, frozenset({"DESCRIBE"}))
    checks = acl_checks(cluster, s, init_transactions=init)
    assert [(c.name, c.status) for c in checks] == [
        ("kafka acl topic t.copy", F),                          # READ missing
        ("kafka acl topic replicator.checkpoint", F),           # READ missing
        ("kafka acl topic replicator.segmentevents", F),        # hidden: not even DESCRIBE
        ("kafka acl group ing", P),
        ("kafka acl idempotent write", P),
        ("kafka acl transactional-id ing.*", F)]
    assert tried == ["ing.replicator-doctor"]
    dest = checks[0]
    assert "READ not allowed" in dest.seen and "--operation Read --topic t.copy" in dest.fix
