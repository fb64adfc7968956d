"""TLS and SASL end to end on Apache Kafka, with ACLs on and one principal per controller.

Two single-node brokers (one per region, shared by the module, ``kafka_security.py``) with a
throw-away CA made at test time serve SASL_SSL (SCRAM-SHA-512), SSL with a required client
certificate and SSL without one; ``allow.everyone.if.no.acl.found=false``. Each controller
gets its own principal holding exactly the ACLs docs/security.md lists (the grants below are
that document's tables, row by row): egress over SASL_SSL on the source, ingress over mutual
TLS on the destination, a record-by-record exact copy through moto S3. The operators' tools
and the failures (a wrong password, an untrusted or expired certificate, a missing ACL) run
on the same brokers.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from egress.controller import Egress
from replicator.cli.common import wait_for_kafka
from replicator.cli.doctor import permission_checks
from replicator.cli.main import main
from replicator.core.errors import ConfigError, ReplicatorError
from replicator.core.kafka import Admin, Producer
from replicator.core.settings import KafkaSettings
from replicator.ops.doctor import Status
from replicator.ops.verify import read_partition, verify_topics
from tests.conftest import FAST_GROUP_CONFIG, RECENT_MS, unique_name
from tests.integration.kafka_security import SecureBroker, make_pki, start_secure_kafka
from tests.integration.pipeline import (
    Pipeline,
    new_pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

EGRESS, INGRESS = "replicator-egress", "replicator-ingress"
GROUPS_SYNC, RESTORE, DOCTOR = "replicator-groups-sync", "replicator-restore", "replicator-doctor"
PASSWORDS = {u: f"{u}-secret" for u in (EGRESS, INGRESS, GROUPS_SYNC, RESTORE, DOCTOR)}
PRE, LIT = ResourcePatternType.PREFIXED, ResourcePatternType.LITERAL
TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
Op = AclOperation


@dataclass
class Regions:
    source: SecureBroker
    dest: SecureBroker


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Regions]:
    root = tmp_path_factory.mktemp("kafka-tls-sasl")
    pki = make_pki(root / "pki", list(PASSWORDS))
    started: dict[str, SecureBroker] = {}
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:
            started[name] = start_secure_kafka(f"kafka-secure-{name}", root / name, pki)
        except BaseException as e:  # noqa: BLE001 - re-raised by the fixture's thread
            errors.append(e)

    threads = [threading.Thread(target=start, args=(n,)) for n in ("source", "dest")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            raise errors[0]
        for b in started.values():
            for user, password in PASSWORDS.items():
                b.add_scram_user(user, password)
        yield Regions(started["source"], started["dest"])
    finally:
        for b in started.values():
            b.stop()


def su_kafka(b: SecureBroker) -> KafkaSettings:
    """The test's super user (``User:admin``, mutual TLS)."""
    return KafkaSettings(brokers=b.mtls, config=b.mtls_config("admin"))


def sasl_kafka(b: SecureBroker, user: str, password: str | None = None) -> dict[str, Any]:
    return {**FAST_GROUP_CONFIG, **b.sasl_config(user, password or PASSWORDS[user])}


# docs/security.md, "Egress (source cluster)" ------------------------------------------
def grant_egress(b: SecureBroker, principal: str, topic: str, group: str) -> None:
    b.grant(principal, TOPIC, topic, [Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS])
    b.grant(principal, GROUP, group, [Op.READ])
    b.grant(principal, GROUP, "*", [Op.DESCRIBE])                   # group export


# docs/security.md, "Ingress (destination cluster)" ------------------------------------
def grant_ingress(b: SecureBroker, principal: str, pipe: Pipeline, *,
                  read_destination: bool = True) -> None:
    b.grant(principal, TOPIC, pipe.dest_topic,
            [Op.CREATE, Op.WRITE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.ALTER]
            + ([Op.READ] if read_destination else []))
    b.grant(principal, TOPIC, pipe.events_topic, [Op.CREATE, Op.DESCRIBE, Op.WRITE, Op.READ])
    for t in (pipe.checkpoint_topic, "replicator.offsetmap"):
        b.grant(principal, TOPIC, t,
                [Op.CREATE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.WRITE, Op.READ])
    b.grant(principal, GROUP, pipe.ingress_group, [Op.READ])
    for prefix in ("replicator.checkpoints.", "replicator.segment-events-reader.",
                   "replicator.reader."):
        b.grant(principal, GROUP, prefix, [Op.READ], pattern=PRE)
    b.grant(principal, TXN, f"{pipe.ingress_group}.", [Op.WRITE, Op.DESCRIBE], pattern=PRE)


# docs/security.md, "Operators" ---------------------------------------------------------
def grant_groups_sync(b: SecureBroker, principal: str, pipe: Pipeline, app: str, *,
                      read_destination: bool = True) -> None:
    b.grant(principal, GROUP, app, [Op.READ])
    # OffsetCommit (AlterConsumerGroupOffsets) needs Read on the topic, not only Describe.
    b.grant(principal, TOPIC, pipe.dest_topic,
            [Op.DESCRIBE] + ([Op.READ] if read_destination else []))
    for t in (pipe.checkpoint_topic, "replicator.offsetmap"):
        b.grant(principal, TOPIC, t, [Op.READ, Op.DESCRIBE])
    for prefix in ("replicator.checkpoints.", "replicator.reader."):
        b.grant(principal, GROUP, prefix, [Op.READ], pattern=PRE)


def grant_restore(b: SecureBroker, principal: str, topic: str, checkpoints: str) -> None:
    b.grant(principal, TOPIC, topic, [Op.CREATE, Op.WRITE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS])
    b.grant(principal, TOPIC, checkpoints,
            [Op.CREATE, Op.WRITE, Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS])
    b.grant(principal, GROUP, "replicator.reader.", [Op.READ], pattern=PRE)
    b.grant(principal, TXN, "replicator-restore:", [Op.WRITE, Op.DESCRIBE], pattern=PRE)


def operator_config(path: Path, pipe: Pipeline, brokers: str, kafka: dict[str, str]) -> Path:
    """An ingress config file of ``pipe`` for the operator commands."""
    lines = "\n".join(f'"{k}" = "{v}"' for k, v in kafka.items())
    path.write_text(f'''region = "us-west-1"
[s3]
bucket = "{pipe.bucket}"
endpoint_url = "{pipe.moto}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "{brokers}"
[kafka.config]
{lines}
[ingress]
sqs_queue = "{pipe.queue}"
checkpoint_topic = "{pipe.checkpoint_topic}"
segment_events_topic = "{pipe.events_topic}"
group_id = "{pipe.ingress_group}"
[[ingress.sources]]
region = "us-east-1"
topic = "{pipe.topic}"
destination_topic = "{pipe.dest_topic}"
''')
    return path


def produce(b: SecureBroker, topic: str, n: int, partitions: int) -> None:
    p = Producer(su_kafka(b))
    for i in range(n):
        p.produce(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode(),
                  partition=i % partitions, timestamp=RECENT_MS + i,
                  headers=[("h", f"{i}".encode())])
    p.flush(30)


def create_topic(b: SecureBroker, topic: str, partitions: int) -> None:
    admin = b.admin()
    for f in admin.create_topics([NewTopic(topic, partitions, 1)],
                                 request_timeout=30).values():
        f.result(timeout=30)


def copied(src: SecureBroker, dst: SecureBroker, pipe: Pipeline) -> bool:
    try:
        return verify_topics(su_kafka(src), pipe.topic, su_kafka(dst), pipe.dest_topic,
                             idle_timeout=3).ok
    except ReplicatorError:
        return False      # the destination topic does not exist yet


def test_egress_over_sasl_ssl_and_ingress_over_mutual_tls_copy_every_record_exactly(
        regions: Regions, moto_endpoint: str, tmp_path: Path) -> None:
    src, dst = regions.source, regions.dest
    pipe = new_pipeline(moto_endpoint, src.sasl_ssl, dst.mtls)
    create_topic(src, pipe.topic, 2)
    produce(src, pipe.topic, 600, 2)
    grant_egress(src, f"User:{EGRESS}", pipe.topic, pipe.egress_group)
    grant_ingress(dst, f"User:{INGRESS}", pipe)
    app = unique_name("app")                     # an application group to fail over
    Admin(su_kafka(src)).alter_group_offsets(app, {(pipe.topic, 0): 100, (pipe.topic, 1): 50})
    egress = Egress(pipe.egress_settings(kafka_config=sasl_kafka(src, EGRESS),
                                         egress={"group_export": {"interval": "1s"}}))
    ingress = pipe.ingress_settings(kafka_config={**FAST_GROUP_CONFIG,
                                                  **dst.mtls_config(INGRESS)})
    with running_egress(egress), running_ingress(ingress):
        wait_for(lambda: copied(src, dst, pipe), 90, "the copy")
        # `replicator groups sync` under its own principal over SASL_SSL, with the ACLs of
        # docs/security.md ("Operators").
        # First without Read on the destination topic: the refusal names the grant.
        grant_groups_sync(dst, f"User:{GROUPS_SYNC}", pipe, app, read_destination=False)
        config = operator_config(tmp_path / "groups-sync.toml", pipe, dst.sasl_ssl,
                                 dst.sasl_config(GROUPS_SYNC, PASSWORDS[GROUPS_SYNC]))
        res = CliRunner().invoke(main, ["groups", "sync", "--config", str(config)])
        assert res.exit_code == 1, res.output
        assert (f"User:{GROUPS_SYNC} (SASL SCRAM-SHA-512) is not authorized "
                f"(TOPIC_AUTHORIZATION_FAILED): grant it Read on Topic:{pipe.dest_topic}"
                in res.output), res.output
        dst.grant(f"User:{GROUPS_SYNC}", TOPIC, pipe.dest_topic, [Op.READ])

        def synced() -> bool:
            res = CliRunner().invoke(main, ["groups", "sync", "--config", str(config)])
            if res.exit_code == 1 and "not authorized" in res.output:
                return False          # the grant not yet applied by the broker
            assert res.exit_code == 0, res.output
            return set(Admin(su_kafka(dst)).group_offsets(app)) == {
                (pipe.dest_topic, 0), (pipe.dest_topic, 1)}
        wait_for(synced, 60, "the group's translated offsets")
        # `replicator doctor`'s permission checks under each controller's principal.
        for settings in (egress.settings, ingress):
            admin = Admin(settings.kafka, timeout=10)
            checks = permission_checks(admin, settings, lambda _: frozenset({pipe.topic}), 10)
            assert checks and all(c.status is Status.PASS for c in checks), checks
    report = verify_topics(su_kafka(src), pipe.topic, su_kafka(dst), pipe.dest_topic)
    assert report.ok, report_text(report)
    # The group resumes in the destination at the record that follows its source commit.
    moved = Admin(su_kafka(dst)).group_offsets(app)
    for p, at in ((0, 100), (1, 50)):
        src_recs = [(m.key(), m.value()) for m in read_partition(su_kafka(src), pipe.topic, p)]
        dst_recs = list(read_partition(su_kafka(dst), pipe.dest_topic, p))
        after = [(m.key(), m.value()) for m in dst_recs
                 if (m.offset() or 0) >= moved[(pipe.dest_topic, p)]]
        assert after == src_recs[at:], p
    # `replicator restore` of the archive under its own principal, with docs/security.md's
    # grants: every record again, in a new topic.
    restored, restore_cps = unique_name("restored"), unique_name("restore-cps")
    grant_restore(dst, f"User:{RESTORE}", restored, restore_cps)
    config = operator_config(tmp_path / "restore.toml", pipe, dst.sasl_ssl,
                             dst.sasl_config(RESTORE, PASSWORDS[RESTORE]))
    res = CliRunner().invoke(main, ["restore", "--config", str(config), "--source-region",
                                    "us-east-1", "--topic", pipe.topic, "--to-topic", restored,
                                    "--checkpoint-topic", restore_cps])
    assert res.exit_code == 0, res.output
    report = verify_topics(su_kafka(src), pipe.topic, su_kafka(dst), restored)
    assert report.ok, report_text(report)



# Failures ------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_wrong_password_stops_egress_with_exit_2_and_one_error(
        regions: Regions, moto_endpoint: str, tmp_path: Path) -> None:
    src = regions.source
    conf = src.sasl_config(EGRESS, "not-the-password")
    kafka_config = "\n".join(f'"{k}" = "{v}"' for k, v in conf.items())
    cfg = write_config(tmp_path / "egress.toml", f'''region = "us-east-1"
[s3]
bucket = "b"
endpoint_url = "{moto_endpoint}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "{src.sasl_ssl}"
[kafka.config]
{kafka_config}
[metrics]
port = 0
[egress]
topics = {{ "sensor.events" = {{}} }}
''')
    done = subprocess.run(
        [sys.executable, "-c", "from replicator.cli.egress import main; main()",
         "--config", str(cfg)], check=False, cwd=ROOT, capture_output=True, text=True, timeout=90,
        stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    errors = [x for x in out.splitlines() if " ERROR " in x and "replicator" in x]
    assert len(errors) == 1, errors
    assert (f"egress not started: Kafka at {src.sasl_ssl}: SASL authentication error"
            in errors[0]), errors
    assert f"refused the credentials of User:{EGRESS} (SASL SCRAM-SHA-512)" in errors[0]
    assert "not-the-password" not in out                  # masked in the start-up line too
    assert "cannot reach Kafka" not in out


def refused_start(b: SecureBroker, address: str, config: dict[str, str]) -> ConfigError:
    """What ``wait_for_kafka`` (every service's start) raises for ``config``."""
    kafka = KafkaSettings(brokers=address, config=config)
    stopping = threading.Event()
    timer = threading.Timer(60, stopping.set)          # a retry loop ends the test, failing
    timer.start()
    try:
        with pytest.raises(ConfigError) as e:
            wait_for_kafka(kafka, "ingress", stopping, request_timeout=2)
    finally:
        timer.cancel()
    return e.value


def test_an_untrusted_broker_certificate_stops_the_start_naming_the_ca(
        regions: Regions) -> None:
    dst = regions.dest
    err = refused_start(dst, dst.sasl_ssl,
                        dst.sasl_config(INGRESS, PASSWORDS[INGRESS], ca=dst.pki.untrusted_ca))
    assert "certificate verify failed" in str(err)
    assert "does not trust the broker's certificate" in str(err)
    assert str(dst.pki.untrusted_ca) in str(err)


@pytest.mark.parametrize("cert", ["expired", "stranger"])
def test_a_client_certificate_the_broker_refuses_stops_the_start_naming_it(
        regions: Regions, cert: str) -> None:
    """An expired certificate, and one signed by a CA the broker does not trust."""
    dst = regions.dest
    conf = {**dst.mtls_config(INGRESS), "ssl.certificate.location": str(dst.pki.cert(cert)),
            "ssl.key.location": str(dst.pki.key(cert))}
    err = refused_start(dst, dst.mtls, conf)
    assert f"refused the client certificate of User:CN={cert}" in str(err), str(err)
    assert "ssl/tls alert" in str(err)


def test_ingress_without_read_on_its_destination_names_principal_and_grant_then_resumes(
        regions: Regions, moto_endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    """Both controllers over SASL_SSL. Ingress lacks only ``Read`` on the destination topic
    (exactly-once commits an offset there in each transaction): its ERROR and the doctor
    name ``User:replicator-ingress`` and the grant; once granted, the copy completes
    exactly, without a restart."""
    src, dst = regions.source, regions.dest
    pipe = new_pipeline(moto_endpoint, src.sasl_ssl, dst.sasl_ssl)
    create_topic(src, pipe.topic, 1)
    produce(src, pipe.topic, 300, 1)
    grant_egress(src, f"User:{EGRESS}", pipe.topic, pipe.egress_group)
    grant_ingress(dst, f"User:{INGRESS}", pipe, read_destination=False)
    egress = Egress(pipe.egress_settings(kafka_config=sasl_kafka(src, EGRESS)))
    ingress = pipe.ingress_settings(kafka_config=sasl_kafka(dst, INGRESS))
    wanted = (f"User:{INGRESS} (SASL SCRAM-SHA-512) is not allowed to commit offsets in a "
              "transaction "
              f"(TOPIC_AUTHORIZATION_FAILED): grant it Read on Topic:{pipe.dest_topic}")
    with running_egress(egress), running_ingress(ingress):
        wait_for(lambda: any(wanted in r.getMessage() and r.levelno == logging.ERROR
                             for r in caplog.records), 90, "ingress's ERROR")
        admin = Admin(ingress.kafka, timeout=10)
        checks = {c.name: c for c in permission_checks(admin, ingress, lambda _: frozenset(),
                                                       10)}
        dest = checks[f"kafka acl topic {pipe.dest_topic}"]
        assert dest.status is Status.FAIL, dest
        assert "READ not allowed" in dest.seen
        assert (f"--allow-principal User:{INGRESS} --operation Read --topic "
                f"{pipe.dest_topic}") in dest.fix
        dst.grant(f"User:{INGRESS}", TOPIC, pipe.dest_topic, [Op.READ])
        wait_for(lambda: copied(src, dst, pipe), 120, "the copy after the grant")
    report = verify_topics(su_kafka(src), pipe.topic, su_kafka(dst), pipe.dest_topic)
    assert report.ok, report_text(report)


def test_egress_without_read_on_its_group_names_principal_and_grant(
        regions: Regions, moto_endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    """Egress over SASL_SSL lacking only ``Read`` on its consumer group: one ERROR (at most
    one a minute) naming ``User:replicator-egress`` and the grant, and the doctor's FAIL
    with the ``kafka-acls.sh`` line; not the broker's bare words as a WARNING per poll."""
    src = regions.source
    pipe = new_pipeline(moto_endpoint, src.sasl_ssl, src.sasl_ssl)
    create_topic(src, pipe.topic, 1)
    produce(src, pipe.topic, 10, 1)
    src.grant(f"User:{EGRESS}", TOPIC, pipe.topic, [Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS])
    src.grant(f"User:{EGRESS}", GROUP, "*", [Op.DESCRIBE])
    settings = pipe.egress_settings(kafka_config=sasl_kafka(src, EGRESS))
    wanted = (f"User:{EGRESS} (SASL SCRAM-SHA-512) is not authorized "
              "(GROUP_AUTHORIZATION_FAILED")
    grant = f"grant it Read on Group:{pipe.egress_group}"
    with running_egress(Egress(settings)):
        wait_for(lambda: any(wanted in r.getMessage() and grant in r.getMessage()
                             and r.levelno == logging.ERROR for r in caplog.records),
                 60, "egress's ERROR")
        checks = {c.name: c for c in permission_checks(Admin(settings.kafka, timeout=10),
                                                       settings,
                                                       lambda _: frozenset({pipe.topic}), 10)}
    group = checks[f"kafka acl group {pipe.egress_group}"]
    assert group.status is Status.FAIL, group
    assert (f"--allow-principal User:{EGRESS} --operation Read --group "
            f"{pipe.egress_group}") in group.fix
    assert checks[f"kafka acl topic {pipe.topic}"].status is Status.PASS
    mine = [r for r in caplog.records if wanted in r.getMessage()]
    assert len(mine) == 1, [r.getMessage() for r in mine]     # once, not per poll


def test_tls_without_a_client_certificate_is_anonymous_and_the_doctor_says_so(
        regions: Regions, moto_endpoint: str) -> None:
    """The SSL listener without client certificates: the connection is encrypted and
    verified, the principal is ``User:ANONYMOUS``, which holds no ACL here: the doctor
    names it in each grant it asks for."""
    src = regions.source
    pipe = new_pipeline(moto_endpoint, src.tls, src.tls)
    create_topic(src, pipe.topic, 1)
    settings = pipe.egress_settings(kafka_config=src.tls_config())
    checks = {c.name: c for c in permission_checks(Admin(settings.kafka, timeout=10), settings,
                                                   lambda _: frozenset({pipe.topic}), 10)}
    group = checks[f"kafka acl group {pipe.egress_group}"]
    assert group.status is Status.FAIL, checks
    assert f"--allow-principal User:ANONYMOUS --operation Read --group {pipe.egress_group}" \
        in group.fix
    src.grant("User:ANONYMOUS", GROUP, pipe.egress_group, [Op.READ])
    wait_for(lambda: next(c for c in permission_checks(
        Admin(settings.kafka, timeout=10), settings, lambda _: frozenset({pipe.topic}), 10)
        if c.name == group.name).status is Status.PASS, 20, "the grant to User:ANONYMOUS")
