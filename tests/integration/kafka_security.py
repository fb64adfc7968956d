"""A throw-away PKI and single-node Apache Kafka brokers with TLS, SASL/SCRAM and ACLs.

``make_pki`` writes, at test time, a CA, the broker's certificate (SAN ``127.0.0.1``) and one
client certificate per principal (its CN is the principal: ``ssl.principal.mapping.rules``
maps ``CN=x`` to ``User:x``), plus what the failure tests need: an expired client
certificate and a second CA that the brokers do not trust (with a client certificate of its
own). Everything is PEM: the broker reads PEM key and trust stores (``ssl.keystore.type=PEM``),
librdkafka reads the files as they are, so neither ``keytool`` nor a JVM start is paid.

``start_secure_kafka`` starts one broker (KRaft, broker + controller in one JVM) with three
client listeners and ACLs on (StandardAuthorizer, ``allow.everyone.if.no.acl.found=false``):

* ``SASL_SSL`` with SCRAM-SHA-512 (the listener named ``PLAINTEXT`` of the devstack's
  template, so that its port is the one ``start_kafka`` waits for);
* ``MTLS``: ``SSL`` with a required client certificate (also the inter-broker and, with the
  controller's own listener, the broker's identity ``User:broker``, a super user);
* ``TLS``: ``SSL`` without client certificates (the principal is ``User:ANONYMOUS``).

The test admin is ``User:admin`` (a super user) over ``MTLS``; SCRAM users are created with
``AdminClient.alter_user_scram_credentials`` through it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from replicator.devstack.processes import LOOPBACK, ServerProcess, free_port, start_kafka

HEAP = "-Xmx384m -Xms64m"
SUPER_USERS = ("broker", "admin")


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files ``make_pki`` wrote."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    @property
    def untrusted_ca(self) -> Path:
        return self.root / "untrusted-ca.pem"

    def cert(self, name: str) -> Path:
        return self.root / f"{name}.crt.pem"

    def key(self, name: str) -> Path:
        return self.root / f"{name}.key.pem"

    def keystore(self, name: str) -> Path:
        """Key, certificate and CA in one file: the broker's PEM keystore."""
        return self.root / f"{name}.keystore.pem"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(cn: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False, server: bool = False,
          not_before: dt.datetime, not_after: dt.datetime) -> x509.Certificate:
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(issuer)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(not_before).not_valid_after(not_after)
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(LOOPBACK)), x509.DNSName("localhost")]),
            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_pki(root: Path, clients: Iterable[str]) -> Pki:
    """A CA, the broker's certificate, one client certificate per name in ``clients`` (and
    ``admin``), ``expired`` (a client certificate whose validity ended yesterday) and
    ``stranger`` (signed by ``untrusted-ca``, a CA no broker trusts).
    """
    root.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(days=1), now + dt.timedelta(days=2)
    pki = Pki(root)
    cas = {}
    for ca_name, path in (("test-ca", pki.ca), ("untrusted-ca", pki.untrusted_ca)):
        k = _key()
        c = _cert(ca_name, k, _name(ca_name), k, ca=True, not_before=start, not_after=end)
        path.write_bytes(_pem(c))
        cas[ca_name] = (c, k)
    issued: list[tuple[str, str, dt.datetime, dt.datetime, bool]] = [
        ("broker", "test-ca", start, end, True), ("admin", "test-ca", start, end, False),
        ("expired", "test-ca", now - dt.timedelta(days=3), now - dt.timedelta(days=1), False),
        ("stranger", "untrusted-ca", start, end, False)]
    issued += [(c, "test-ca", start, end, False) for c in clients]
    for cn, issuer, nb, na, server in issued:
        ic, ik = cas[issuer]
        k = _key()
        c = _cert(cn, k, ic.subject, ik, server=server, not_before=nb, not_after=na)
        pki.key(cn).write_bytes(_pem(k))
        pki.cert(cn).write_bytes(_pem(c))
        pki.keystore(cn).write_bytes(_pem(k) + _pem(c) + _pem(ic))
    return pki


@dataclass
class SecureBroker:
    """One broker of ``start_secure_kafka``: its process and the three listeners' addresses."""

    proc: ServerProcess
    pki: Pki
    sasl_port: int
    mtls_port: int
    tls_port: int

    @property
    def sasl_ssl(self) -> str:
        return f"{LOOPBACK}:{self.sasl_port}"

    @property
    def mtls(self) -> str:
        return f"{LOOPBACK}:{self.mtls_port}"

    @property
    def tls(self) -> str:
        return f"{LOOPBACK}:{self.tls_port}"

    # librdkafka settings of a client of each listener ---------------------------------
    def sasl_config(self, user: str, password: str, *, ca: Path | None = None) -> dict[str, str]:
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": user, "sasl.password": password,
                "ssl.ca.location": str(ca or self.pki.ca)}

    def mtls_config(self, user: str) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.pki.ca),
                "ssl.certificate.location": str(self.pki.cert(user)),
                "ssl.key.location": str(self.pki.key(user))}

    def tls_config(self) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.pki.ca)}

    def admin(self) -> Any:
        """A super user's ``AdminClient`` (``User:admin`` over mutual TLS)."""
        return AdminClient({"bootstrap.servers": self.mtls, **self.mtls_config("admin")})

    def add_scram_user(self, user: str, password: str) -> None:
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        admin = self.admin()
        futs = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user, info, password.encode())], request_timeout=30)
        for f in futs.values():
            f.result(timeout=30)

    def grant(self, principal: str, resource: ResourceType, name: str,
              ops: Iterable[AclOperation], *,
              pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> None:
        admin = self.admin()
        bindings = [AclBinding(resource, name, pattern, principal, "*", op,
                               AclPermissionType.ALLOW) for op in ops]
        for f in admin.create_acls(bindings, request_timeout=30).values():
            f.result(timeout=30)

    def stop(self) -> None:
        self.proc.stop(timeout=20)


def secure_broker_properties(pki: Pki, sasl_port: int, mtls_port: int, tls_port: int,
                             controller_port: int) -> dict[str, str]:
    """The broker settings of ``start_secure_kafka`` (they replace the template's listeners)."""
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return {
        "listeners": (f"PLAINTEXT://{LOOPBACK}:{sasl_port},MTLS://{LOOPBACK}:{mtls_port},"
                      f"TLS://{LOOPBACK}:{tls_port},CONTROLLER://{LOOPBACK}:{controller_port}"),
        "advertised.listeners": (f"PLAINTEXT://{LOOPBACK}:{sasl_port},"
                                 f"MTLS://{LOOPBACK}:{mtls_port},TLS://{LOOPBACK}:{tls_port}"),
        "listener.security.protocol.map": "PLAINTEXT:SASL_SSL,MTLS:SSL,TLS:SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "MTLS",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.keystore("broker")),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca),
        "ssl.client.auth": "none",
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.controller.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.plaintext.scram-sha-512.sasl.jaas.config": scram,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": ";".join(f"User:{u}" for u in SUPER_USERS),
        "allow.everyone.if.no.acl.found": "false",
    }


def start_secure_kafka(name: str, log_dir: Path, pki: Pki) -> SecureBroker:
    sasl_port, mtls_port, tls_port, cport = (free_port() for _ in range(4))
    props = secure_broker_properties(pki, sasl_port, mtls_port, tls_port, cport)
    proc = start_kafka(name, log_dir, port=sasl_port, controller_port=cport,
                       extra_properties=props, heap=HEAP, timeout=240)
    return SecureBroker(proc, pki, sasl_port, mtls_port, tls_port)
