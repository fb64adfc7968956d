"""Security: secrets never logged, Kafka client configuration errors, SSE on every S3 write.

* ``Settings.masked()`` and the CLIs' start-up log line hide every secret (Kafka SASL/TLS/
  OAuth secrets in ``kafka.config``, the static S3 keys), whether they come from the file or
  from ``REPLICATOR_KAFKA__CONFIG__…`` environment variables.
* A ``kafka.config`` that librdkafka refuses (SASL without ``sasl.password``, an unknown
  property) is a configuration error naming ``kafka.config``: exit 2 and one clear line, not
  a client exception's traceback and exit 1.
* The documented TLS/SASL/OAUTHBEARER examples (docs/deploy.md 3.2) are accepted by
  librdkafka.
* ``s3.sse`` / ``s3.sse_kms_key_id`` reach every S3 write: PutObject, CreateMultipartUpload
  (streamed uploads, multipart copies) and CopyObject (checked on the wire against moto).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replicator.cli.stores import store_for
from replicator.core.errors import ConfigError
from replicator.core.kafka import Admin, Consumer, Producer
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import KafkaSettings, is_secret_setting, load_settings
from replicator.devstack import aws, toml_writer
from tests.conftest import unique_name

SECRETS = {
    "sasl.password": "SASL-pw-7f3a",
    "ssl.key.password": "SSL-key-pw-91c2",
    "sasl.oauthbearer.client.secret": "OAUTH-client-secret-55e1",
    "ssl.keystore.password": "KEYSTORE-pw-0b7d",
    "sasl.oauthbearer.config": "principal=x secret=OAUTH-config-8d2a",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----PEM-body-3c9e",
}
S3_KEY, S3_SECRET = "AKIA-ACCESS-KEY-41d0", "S3-secret-key-6a8f"
ALL_SECRETS = [*SECRETS.values(), S3_KEY, S3_SECRET]

BIN = Path(sys.executable).parent


def base(kafka_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "region": "us-east-1",
        "s3": {"bucket": "sec-bucket", "endpoint_url": "http://127.0.0.1:1",
               "access_key_id": S3_KEY, "secret_access_key": S3_SECRET},
        "kafka": {"brokers": "127.0.0.1:1", "config": kafka_config},
        "metrics": {"port": 0, "host": "127.0.0.1"},
        "egress": {"group_id": "sec", "topics": {"t": {"max_segment_messages": 10}}},
        "ingress": {"sqs_queue": "q", "sources": [{"region": "us-west-1", "topic": "t"}]},
    }


def test_masked_hides_every_secret() -> None:
    settings = load_settings(data=base({"security.protocol": "SASL_SSL",
                                        "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                                        **SECRETS}), environ={})
    text = json.dumps(settings.masked())
    for secret in ALL_SECRETS:
        assert secret not in text
        assert secret not in repr(settings)
        assert secret not in str(settings)
    masked = settings.masked()["kafka"]["config"]
    assert all(masked[k] == "***" for k in SECRETS)
    assert masked["sasl.username"] == "alice"          # not a secret: visible for debugging
    assert masked["security.protocol"] == "SASL_SSL"
    # The values themselves are intact for the clients.
    assert settings.kafka.config["sasl.password"] == SECRETS["sasl.password"]


def test_secrets_from_environment_are_masked_too() -> None:
    environ = {f"REPLICATOR_KAFKA__CONFIG__{k}": v for k, v in SECRETS.items()}
    environ["REPLICATOR_S3__SECRET_ACCESS_KEY"] = S3_SECRET
    settings = load_settings(data=base({"security.protocol": "SASL_SSL"}), environ=environ)
    assert settings.kafka.config["sasl.oauthbearer.client.secret"] == \
        SECRETS["sasl.oauthbearer.client.secret"]
    text = json.dumps(settings.masked())
    for secret in ALL_SECRETS:
        assert secret not in text


@pytest.mark.parametrize("name", ["sasl.password", "SSL.KEY.PASSWORD", "ssl.keystore.password",
                                  "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
                                  "ssl.key.pem", "ssl_key_password", "my.token"])
def test_secret_setting_names(name: str) -> None:
    assert is_secret_setting(name)


@pytest.mark.parametrize("name", ["sasl.username", "security.protocol", "ssl.ca.location",
                                  "sasl.mechanism", "ssl.certificate.location"])
def test_plain_setting_names(name: str) -> None:
    assert not is_secret_setting(name)


# --- librdkafka refusing the configuration ------------------------------------------------


SASL_WITHOUT_PASSWORD = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                         "sasl.username": "alice"}


@pytest.mark.parametrize("make", [
    Admin,
    lambda k: Consumer(k, "g"),
    Producer,
    lambda k: Producer(k, transactional_id="tx"),
], ids=["admin", "consumer", "producer", "transactional-producer"])
@pytest.mark.parametrize("config", [SASL_WITHOUT_PASSWORD, {"no.such.property": "x"},
                                    {"security.protocol": "carrier-pigeon"}],
                         ids=["sasl-without-password", "unknown-property", "bad-value"])
def test_client_configuration_errors_are_config_errors(make: Any, config: dict[str, Any]
                                                       ) -> None:
    with pytest.raises(ConfigError) as exc:
        make(KafkaSettings(brokers="127.0.0.1:1", config=config))
    assert exc.value.key == "kafka.config"
    assert "refuses the configuration" in str(exc.value)


def run_cli(exe: str, cfg: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / exe), "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})}, check=False)


def write_toml(path: Path, data: dict[str, Any], sections: tuple[str, ...]) -> Path:
    """The common sections of ``data`` and ``sections`` (one service's config file)."""
    return toml_writer.write_toml(path, {k: data[k] for k in ("region", "s3", "kafka",
                                                              "metrics", *sections)})


@pytest.mark.parametrize("service", ["egress", "ingress"])
def test_sasl_without_password_exits_2_naming_kafka_config(tmp_path: Path, service: str
                                                           ) -> None:
    """The deploy engineer's bug: a client exception's traceback, exit 1."""
    cfg = write_toml(tmp_path / "c.toml",
                     base({**SASL_WITHOUT_PASSWORD, "ssl.key.password": SECRETS[
                         "ssl.key.password"]}), (service,))
    r = run_cli(f"replicator-{service}", cfg)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "kafka.config" in out and "sasl.password must be set" in out, out
    assert "Traceback" not in out, out
    assert f"starting {service} with settings" in out  # the start-up line was logged
    for secret in ALL_SECRETS:
        assert secret not in out


def test_startup_line_masks_secrets_given_by_environment(tmp_path: Path) -> None:
    """Secrets through REPLICATOR_KAFKA__CONFIG__… (as the manifests do) never reach the log.

    An unknown librdkafka property makes the process stop right after the start-up line.
    """
    cfg = write_toml(tmp_path / "c.toml",
                     base({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                           "sasl.username": "alice", "no.such.property": "x"}), ("egress",))
    env = {f"REPLICATOR_KAFKA__CONFIG__{k}": v for k, v in SECRETS.items()}
    r = run_cli("replicator-egress", cfg, env)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    line = next(x for x in out.splitlines() if "starting egress with settings" in x)
    settings = json.loads(line.split("with settings ", 1)[1])
    assert settings["kafka"]["config"]["sasl.password"] == "***"
    assert settings["kafka"]["config"]["sasl.username"] == "alice"
    assert settings["s3"]["secret_access_key"] != S3_SECRET
    for secret in ALL_SECRETS:
        assert secret not in out


CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.mark.skipif(not CA.exists(), reason="no system CA bundle")
@pytest.mark.parametrize("config", [
    {"security.protocol": "SSL", "ssl.ca.location": str(CA)},
    {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
     "sasl.username": "replicator", "sasl.password": "x", "ssl.ca.location": str(CA)},
    {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
     "sasl.username": "replicator", "sasl.password": "x", "ssl.ca.location": str(CA)},
    {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
     "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "replicator",
     "sasl.oauthbearer.client.secret": "x",
     "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/oauth2/token",
     "sasl.oauthbearer.scope": "kafka", "ssl.ca.location": str(CA)},
], ids=["tls", "sasl-scram", "sasl-plain", "oauthbearer-oidc"])
def test_documented_security_configs_are_accepted(config: dict[str, Any]) -> None:
    """The examples of docs/deploy.md 3.2 are valid librdkafka configurations."""
    kafka = KafkaSettings(brokers="127.0.0.1:1", config=config)
    Admin(kafka)
    Consumer(kafka, "g").close()
    Producer(kafka)


# --- server-side encryption -------------------------------------------------------------------


WRITES_WITH_SSE = {"PutObject", "CreateMultipartUpload", "CopyObject"}


@pytest.mark.integration
def test_sse_kms_reaches_every_write(moto_endpoint: str) -> None:
    settings = load_settings(data={
        "region": "us-east-1",
        "s3": {"bucket": unique_name("sse"), "endpoint_url": moto_endpoint,
               "access_key_id": "test", "secret_access_key": "test", "sse": "aws:kms",
               "sse_kms_key_id": "arn:aws:kms:us-east-1:111122223333:key/replicator",
               "part_size": "5MiB", "multipart_copy_threshold": "5MiB"},
        "kafka": {"brokers": "127.0.0.1:1"}}, environ={})
    store = S3ObjectStore.from_settings(settings)
    aws.create_bucket(store.client, settings.s3.bucket, "us-east-1")
    seen: list[tuple[str, str | None, str | None]] = []

    def capture(model: Any, params: dict[str, Any], **kw: Any) -> None:
        h = params.get("headers", {})
        seen.append((model.name, h.get("x-amz-server-side-encryption"),
                     h.get("x-amz-server-side-encryption-aws-kms-key-id")))

    store.client.meta.events.register("before-call.s3", capture)
    store.put("small", b"x")                                   # PutObject
    up = store.open_upload("streamed")                          # multipart upload
    up.write(b"y" * (11 * 1024**2))
    up.complete()
    up = store.open_upload("streamed-small")                    # one PutObject
    up.write(b"z")
    up.complete()
    store.copy("small", "copied")                               # CopyObject
    store.copy("streamed", "copied-multipart")                  # UploadPartCopy
    writes = [w for w in seen if w[0] in WRITES_WITH_SSE]
    assert {w[0] for w in writes} == WRITES_WITH_SSE
    assert len(writes) == 5
    key_id = "arn:aws:kms:us-east-1:111122223333:key/replicator"
    assert all(w[1:] == ("aws:kms", key_id) for w in writes), writes
    head = store.client.head_object(Bucket=settings.s3.bucket, Key="copied-multipart")
    assert head["ServerSideEncryption"] == "aws:kms"
    assert head["SSEKMSKeyId"] == key_id


def test_sync_store_encrypts_only_its_own_bucket() -> None:
    """``replicator sync --config`` applies the config's SSE to writes into its bucket."""
    settings = load_settings(data={
        "region": "us-west-1",
        "s3": {"bucket": "dest-bucket", "sse": "aws:kms", "sse_kms_key_id": "k",
               "access_key_id": "test", "secret_access_key": "test"},
        "kafka": {"brokers": "127.0.0.1:1"}}, environ={})
    own = store_for("dest-bucket", endpoint_url=None, region="us-west-1", settings=settings)
    other = store_for("other-bucket", endpoint_url=None, region="us-west-1", settings=settings)
    assert (own.sse, own.sse_kms_key_id) == ("aws:kms", "k")
    assert (other.sse, other.sse_kms_key_id) == (None, None)
