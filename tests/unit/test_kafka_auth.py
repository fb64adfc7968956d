"""A service whose identity the brokers refuse (wrong password, untrusted or expired
certificate) stops at start with exit 2 and one ERROR naming its principal and the cause,
instead of "cannot reach Kafka ... retrying" forever. The texts below are librdkafka's own
``error_cb`` strings, as seen against Apache Kafka 4.1 (tests/integration/
test_kafka_tls_sasl.py runs the same failures on real brokers)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from replicator.cli.common import wait_for_kafka
from replicator.core.errors import ConfigError, KafkaRetriableError
from replicator.core.kafka.auth import client_principal, not_admitted
from replicator.core.settings import KafkaSettings

ADDR = "127.0.0.1:9093"
WRONG_PASSWORD = (f"sasl_ssl://{ADDR}/bootstrap: SASL authentication error: Authentication "
                  "failed during authentication due to invalid credentials with SASL "
                  "mechanism SCRAM-SHA-512 (after 356ms in state AUTH_REQ)")
UNTRUSTED_BROKER = (f"sasl_ssl://{ADDR}/bootstrap: SSL handshake failed: error:0A000086:SSL "
                    "routines::certificate verify failed: broker certificate could not be "
                    "verified, verify that ssl.ca.location is correctly configured or root "
                    "CA certificates are installed (install ca-certificates package) "
                    "(after 24ms in state SSL_HANDSHAKE)")
EXPIRED_CLIENT = (f"ssl://{ADDR}/bootstrap: Receive failed: error:0A000416:SSL routines::"
                  "ssl/tls alert certificate unknown: SSL alert number 46 (after 52ms in "
                  "state APIVERSION_QUERY)")
STRANGER_CLIENT = (f"ssl://{ADDR}/bootstrap: Receive failed: error:0A000412:SSL routines::"
                   "ssl/tls alert bad certificate: SSL alert number 42 (after 9ms in state "
                   "APIVERSION_QUERY)")
REFUSED = (f"{ADDR}/bootstrap: Connect to ipv4#{ADDR} failed: Connection refused "
           "(after 0ms in state CONNECT)")
SCRAM = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "replicator-egress", "sasl.password": "s3cr3t-value"}


class Refusing:
    """A cluster whose every metadata request fails with ``errors`` as the client's own;
    after ``calls_until_stop`` requests it sets ``stopping`` (a bounded retry loop)."""

    def __init__(self, errors: list[str], stopping: threading.Event | None = None,
                 calls_until_stop: int = 3) -> None:
        self.errors = errors
        self.calls = 0
        self.stopping = stopping
        self.calls_until_stop = calls_until_stop

    def list_topics(self) -> list[str]:
        self.calls += 1
        if self.stopping is not None and self.calls >= self.calls_until_stop:
            self.stopping.set()
        raise KafkaRetriableError("list topics: Local: Broker transport failure")

    def client_errors(self) -> list[str]:
        return [*self.errors, "1/1 brokers are down"]


@pytest.mark.parametrize(("error", "words"), [
    (WRONG_PASSWORD, "refused the credentials of User:replicator-egress (SASL SCRAM-SHA-512)"),
    (UNTRUSTED_BROKER, "does not trust the broker's certificate"),
    (EXPIRED_CLIENT, "refused the client certificate"),
    (STRANGER_CLIENT, "refused the client certificate"),
])
def test_a_refused_identity_exits_2_at_the_first_attempt_naming_principal_and_cause(
        error: str, words: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="replicator.cli.common")
    stopping = threading.Event()
    cluster = Refusing([error], stopping)
    with pytest.raises(ConfigError) as e:
        wait_for_kafka(KafkaSettings(brokers=ADDR, config=SCRAM), "egress",
                       stopping, every=0.01, admin=cluster)
    assert cluster.calls == 1                       # no retry loop
    assert e.value.key == "kafka.config"
    text = str(e.value)
    assert words in text and "egress not started" in text and ADDR in text, text
    assert "s3cr3t-value" not in text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]   # the CLI logs it once


def test_an_unreachable_broker_is_still_retried() -> None:
    stopping = threading.Event()
    cluster = Refusing([REFUSED], stopping)
    assert not wait_for_kafka(KafkaSettings(brokers=ADDR), "ingress", stopping, every=0.01,
                              admin=cluster)
    assert cluster.calls == 3


def test_one_broker_refusing_while_another_is_down_is_retried() -> None:
    """Mixed causes (a node restarting): not a verdict about the identity."""
    other = "127.0.0.1:9094"
    stopping = threading.Event()
    cluster = Refusing([WRONG_PASSWORD, REFUSED.replace(ADDR, other)], stopping)
    assert not wait_for_kafka(KafkaSettings(brokers=f"{ADDR},{other}", config=SCRAM),
                              "ingress", stopping, every=0.01, admin=cluster)


def test_principals_as_an_acl_names_them(tmp_path: Path) -> None:
    assert client_principal(SCRAM) == "User:replicator-egress (SASL SCRAM-SHA-512)"
    assert client_principal({}) == "User:ANONYMOUS (PLAINTEXT)"
    assert client_principal({"security.protocol": "ssl"}).startswith("User:ANONYMOUS")
    missing = str(tmp_path / "none.pem")
    assert client_principal({"security.protocol": "SSL", "ssl.certificate.location": missing}
                            ) == f"the client certificate {missing}"


def test_other_failures_are_not_taken_for_refusals() -> None:
    assert not_admitted(REFUSED, SCRAM) is None
    assert not_admitted("Failed to resolve 'kafka:9092'", SCRAM) is None
    assert not_admitted("Connection setup timed out in state CONNECT", SCRAM) is None


def test_a_transaction_refused_for_a_missing_read_acl_names_the_principal_and_the_grant(
) -> None:
    import confluent_kafka as ck

    from replicator.core.errors import NotAuthorized, TransactionAbortable
    from replicator.core.kafka.errors import translate_offsets_error

    err = ck.KafkaError(ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                        "Failed to commit offsets to transaction: t.copy[0] (Broker: Topic "
                        "authorization failed)", txn_requires_abort=True)
    got = translate_offsets_error(ck.KafkaException(err), "send offsets",
                                  principal="User:replicator-ingress", topics=["t.copy"])
    assert isinstance(got, TransactionAbortable)        # still aborted and retried
    assert isinstance(got, NotAuthorized)               # and an ERROR at once (status.py)
    assert ("User:replicator-ingress is not allowed to commit offsets in a transaction "
            "(TOPIC_AUTHORIZATION_FAILED): grant it Read on Topic:t.copy") in str(got)


def test_a_consumers_missing_acl_is_an_error_naming_the_principal_and_the_grant() -> None:
    import confluent_kafka as ck

    from replicator.core.errors import NotAuthorized
    from replicator.core.kafka.errors import event_error

    group = ck.KafkaError(ck.KafkaError.GROUP_AUTHORIZATION_FAILED,
                          "JoinGroup failed: Broker: Group authorization failed")
    got = event_error(group, "[-1]", principal="User:replicator-egress", group="eg")
    assert isinstance(got, NotAuthorized)          # retried: a grant lets it pass
    assert "User:replicator-egress is not authorized (GROUP_AUTHORIZATION_FAILED" in str(got)
    assert "grant it Read on Group:eg" in str(got)
    topic = ck.KafkaError(ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                          "Subscribed topic not available: Broker: Topic authorization failed")
    got = event_error(topic, "t[-1]", principal="User:u", group="eg", topic="t")
    assert "grant it Read and Describe on Topic:t" in str(got)
