"""The doctor's permission checks on Apache Kafka with SASL/PLAIN and ACLs (StandardAuthorizer,
KRaft): a dedicated broker started by this module only (the session's brokers have no
authorizer). ``alice`` gets some of what exactly-once ingress needs; the doctor names what
is missing, and passes once it is granted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from replicator.cli.doctor import permission_checks
from replicator.core.kafka import Admin
from replicator.core.settings import Settings, load_settings
from replicator.devstack.processes import ServerProcess, start_kafka
from replicator.ops.doctor import Status

pytestmark = pytest.mark.apache

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'username="admin" password="admin-secret" '
        'user_admin="admin-secret" user_alice="alice-secret";')
# The PLAINTEXT listener of the devstack's broker carries SASL here (listener names stay, so
# the ports do); the controller listener stays plaintext, its principal a super user.
SASL_BROKER = {
    "listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN",
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "listener.name.plaintext.plain.sasl.jaas.config": JAAS,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:admin;User:ANONYMOUS",
    "allow.everyone.if.no.acl.found": "false",
}
DEST, CHECKPOINTS, EVENTS, GROUP = "acl.t.copy", "acl.checkpoint", "acl.events", "acl.ingress"


def sasl(user: str, password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": password}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_kafka("kafka-sasl", tmp_path_factory.mktemp("kafka-sasl"),
                       extra_properties=SASL_BROKER)
    yield proc
    proc.stop(timeout=20)


def grant(admin: Any, resource: ResourceType, name: str, pattern: ResourcePatternType,
          *ops: AclOperation) -> None:
    bindings = [AclBinding(resource, name, pattern, "User:alice", "*", op,
                           AclPermissionType.ALLOW) for op in ops]
    for f in admin.create_acls(bindings, request_timeout=30).values():
        f.result(timeout=30)


def settled(verdicts: Callable[[], dict[str, tuple[Status, str, str]]],
            expected: dict[str, Status]) -> dict[str, tuple[Status, str, str]]:
    """The verdicts once they match ``expected``, or the last ones after 20 s."""
    deadline = time.monotonic() + 20
    while True:
        got = verdicts()
        if {n: v[0] for n, v in got.items()} == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def ingress_settings(brokers: str) -> Settings:
    return load_settings(data={
        "region": "us-west-1", "s3": {"bucket": "b"},
        "kafka": {"brokers": brokers, "config": sasl("alice", "alice-secret")},
        "ingress": {"sqs_queue": "q", "group_id": GROUP, "checkpoint_topic": CHECKPOINTS,
                    "segment_events_topic": EVENTS, "offset_map": False,
                    "sources": [{"region": "us-east-1", "topic": "t",
                                 "destination_topic": DEST}]}}, environ={})


def test_the_doctor_names_each_missing_permission_and_passes_once_granted(
        broker: ServerProcess) -> None:
    su = AdminClient({"bootstrap.servers": broker.address, **sasl("admin", "admin-secret")})
    for f in su.create_topics([NewTopic(t, 1, 1) for t in (DEST, CHECKPOINTS, EVENTS)],
                              request_timeout=30).values():
        f.result(timeout=30)
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    grant(su, ResourceType.TOPIC, DEST, lit, AclOperation.DESCRIBE, AclOperation.WRITE)
    grant(su, ResourceType.TOPIC, CHECKPOINTS, lit, AclOperation.DESCRIBE,
          AclOperation.WRITE)                                   # READ missing
    grant(su, ResourceType.GROUP, GROUP, lit, AclOperation.READ)
    settings = ingress_settings(broker.address)
    admin = Admin(settings.kafka, timeout=10)

    def verdicts() -> dict[str, tuple[Status, str, str]]:
        return {c.name: (c.status, c.seen, c.fix)
                for c in permission_checks(admin, settings, lambda ts: frozenset(), 10)}

    expected = {
        f"kafka acl topic {DEST}": Status.FAIL,               # READ (TxnOffsetCommit)
        f"kafka acl topic {CHECKPOINTS}": Status.FAIL,
        f"kafka acl topic {EVENTS}": Status.FAIL,             # hidden: not even DESCRIBE
        f"kafka acl group {GROUP}": Status.PASS,
        "kafka acl idempotent write": Status.PASS,            # WRITE on a topic (KIP-679)
        f"kafka acl transactional-id {GROUP}.*": Status.FAIL}
    # ACLs reach the broker from the controller's log shortly after create_acls returns.
    got = settled(verdicts, expected)
    assert {n: v[0] for n, v in got.items()} == expected, got
    _, seen, fix = got[f"kafka acl topic {CHECKPOINTS}"]
    assert "READ not allowed" in seen and "--operation Read --topic acl.checkpoint" in fix
    assert "User:alice" in fix
    _, seen, fix = got[f"kafka acl transactional-id {GROUP}.*"]
    assert "authoriz" in seen.lower() and f"--transactional-id {GROUP}." in fix

    grant(su, ResourceType.TOPIC, CHECKPOINTS, lit, AclOperation.READ)
    grant(su, ResourceType.TOPIC, DEST, lit, AclOperation.READ)
    grant(su, ResourceType.TOPIC, EVENTS, lit, AclOperation.DESCRIBE, AclOperation.READ,
          AclOperation.WRITE)
    grant(su, ResourceType.TRANSACTIONAL_ID, f"{GROUP}.", pre, AclOperation.WRITE,
          AclOperation.DESCRIBE)
    all_pass = dict.fromkeys(got, Status.PASS)
    got = settled(verdicts, all_pass)
    assert {n: v[0] for n, v in got.items()} == all_pass, got

