"""Who a client is to the brokers, and whether a connection failure means "not admitted".

Pure functions over ``kafka.config`` and librdkafka's error texts (the ``error_cb`` strings
``Admin.client_errors`` keeps), shared by the services' start (``wait_for_kafka``: a client
the brokers will never admit exits 2 at once instead of retrying) and ``replicator doctor``.

librdkafka reports these failures only as text: a wrong SCRAM/PLAIN password or unknown user
("SASL authentication error: Authentication failed ... invalid credentials"), a broker
certificate the client does not trust ("SSL handshake failed: ... certificate verify
failed"), and a client certificate the broker refuses, which arrives as the TLS alert the
broker sent ("ssl/tls alert certificate unknown" for an expired one, "bad certificate" for
one from a CA it does not trust or none at all, "unknown ca", "certificate expired").
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SASL = re.compile(r"SASL authentication error|Authentication failed|SASL .*failed", re.I)
_UNTRUSTED_BROKER = re.compile(r"certificate verify failed", re.I)
_CLIENT_CERT_REFUSED = re.compile(
    r"alert (certificate unknown|bad certificate|certificate expired|unknown ca|"
    r"certificate revoked|certificate required|access denied)", re.I)


def _protocol(config: Mapping[str, Any]) -> str:
    return str(config.get("security.protocol", "plaintext")).upper()


def certificate_subject(path: str) -> str | None:
    """The subject of the PEM certificate at ``path`` (``CN=replicator-egress``), if readable.

    Uses the standard library's certificate decoder (no extra dependency); ``None`` when the
    file cannot be read or parsed.
    """
    try:
        decoded = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
    except (OSError, ssl.SSLError, ValueError, AttributeError):
        return None
    parts = [f"{k}={v}" for rdn in decoded.get("subject", ()) for k, v in rdn]
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
             "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST"}
    return ",".join(short.get(p.split("=", 1)[0], p.split("=", 1)[0]) + "=" + p.split("=", 1)[1]
                    for p in parts) or None


def client_principal(config: Mapping[str, Any]) -> str:
    """The identity ``kafka.config`` presents, as an operator would write it in an ACL.

    ``User:<sasl.username>`` for SASL (PLAIN, SCRAM); for mutual TLS the client
    certificate's subject (the broker maps it with ``ssl.principal.mapping.rules``; by
    default the principal is ``User:<the whole subject>``); ``User:ANONYMOUS`` otherwise.
    """
    protocol = _protocol(config)
    if protocol.startswith("SASL"):
        mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI")))
        if mechanism.upper() == "GSSAPI":
            return f"the Kerberos principal of sasl.kerberos.* (SASL {mechanism})"
        if mechanism.upper() == "OAUTHBEARER":
            return "the OAUTHBEARER token's principal (SASL OAUTHBEARER)"
        return f"User:{config.get('sasl.username', '?')} (SASL {mechanism})"
    if protocol == "SSL":
        cert = config.get("ssl.certificate.location")
        if cert:
            subject = certificate_subject(str(cert))
            return (f"User:{subject} (the client certificate {cert}, before the broker's "
                    "ssl.principal.mapping.rules)" if subject
                    else f"the client certificate {cert}")
        if config.get("ssl.certificate.pem"):
            return "the client certificate of ssl.certificate.pem"
        return "User:ANONYMOUS (TLS without a client certificate)"
    return "User:ANONYMOUS (PLAINTEXT)"


@dataclass(frozen=True)
class NotAdmitted:
    """A connection the brokers (or the client) refused on identity, not on reachability."""

    cause: str
    """librdkafka's words, e.g. ``SASL authentication error: ... invalid credentials``."""
    fix: str
    """What to change, naming the settings of ``kafka.config``."""


def not_admitted(cause: str, config: Mapping[str, Any]) -> NotAdmitted | None:
    """``cause`` (one broker's connection error) as an authentication or TLS refusal, or
    ``None`` for anything else (refused connection, timeout, name lookup: worth retrying).
    """
    who = client_principal(config)
    if _SASL.search(cause):
        return NotAdmitted(cause, f"the brokers refused the credentials of {who}: fix "
                           "sasl.username / sasl.password (or sasl.mechanism) in "
                           "[kafka.config], or create the user on the cluster")
    if _UNTRUSTED_BROKER.search(cause):
        ca = config.get("ssl.ca.location", "the system's CA bundle")
        return NotAdmitted(cause, f"this client does not trust the broker's certificate "
                           f"(expired, not for this host name, or not signed by a CA in "
                           f"{ca}): fix ssl.ca.location in [kafka.config] or the broker's "
                           "certificate")
    if _CLIENT_CERT_REFUSED.search(cause):
        return NotAdmitted(cause, f"the broker refused the client certificate of {who} "
                           "(expired, not yet valid, not signed by a CA the broker trusts, "
                           "or missing where the listener requires one): fix "
                           "ssl.certificate.location / ssl.key.location in [kafka.config]")
    return None
