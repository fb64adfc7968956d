"""Kafka permissions of ``replicator doctor``: what the config's principal may do against
what the services need (docs/security.md, "Kafka principals").

The cluster says what the asking principal may do on each topic, group and the cluster
itself (the "authorized operations" of DescribeTopics, DescribeGroups and DescribeCluster,
KIP-430), so no ACL is read and no admin right is needed. A transactional id has no such
answer: exactly-once ingress's prefix is tried with ``init_transactions`` of one id under
it (``{group_id}.replicator-doctor``; the broker forgets an idle id after
``transactional.id.expiration.ms``).

* Egress (source cluster): each replicated topic that exists: ``DESCRIBE``, ``READ``,
  ``DESCRIBE_CONFIGS``; its group: ``READ``.
* Ingress (destination cluster): each named source's destination topic that exists:
  ``DESCRIBE``, ``WRITE`` (and ``READ`` with exactly-once: TxnOffsetCommit); the internal
  topics that exist: ``DESCRIBE``, ``READ``,
  ``WRITE``; its group: ``READ``; idempotent write (``IDEMPOTENT_WRITE`` on the cluster,
  or, since Kafka 3.0, ``WRITE`` on any topic); exactly-once: ``WRITE`` on the
  transactional-id prefix.

A broker without an authorizer reports nothing (``None``): the checks pass and say so.
The decisions (``acl_check``, ``idempotent_check``, ``transactional_check``) are pure;
``acl_checks`` asks the cluster through ``AclProbe`` (the Kafka seam's ``Admin``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from replicator.core.errors import ReplicatorError
from replicator.core.kafka.auth import certificate_subject
from replicator.core.settings import Settings
from replicator.ops.doctor.report import Check, fail, passed, warn

Granted = frozenset[str] | str | None
"""What the cluster answered for one resource: the operations allowed, the error that
answered instead (refused), or ``None`` (the broker does not say: no authorizer)."""

NOT_REPORTED = "not reported by the broker (no authorizer): not checked"
TXN_PROBE_SUFFIX = "replicator-doctor"


class AclProbe(Protocol):
    """What the permission checks read (``replicator.core.kafka.Admin``)."""

    def cluster_operations(self) -> frozenset[str] | None: ...
    def topic_operations(self, topics: list[str]) -> dict[str, Granted]: ...
    def group_operations(self, group: str) -> Granted: ...


@dataclass(frozen=True)
class Need:
    """Operations a service needs on one resource."""

    resource: str
    """``topic`` or ``group`` (as ``kafka-acls.sh`` names them)."""
    name: str
    operations: tuple[str, ...]
    why: str


def principal(kafka_config: Mapping[str, object]) -> str:
    """The principal the config authenticates as, for the fix's command line."""
    user = kafka_config.get("sasl.username")
    if user and str(kafka_config.get("security.protocol", "")).upper().startswith("SASL"):
        return f"User:{user}"
    cert = kafka_config.get("ssl.certificate.location")
    subject = certificate_subject(str(cert)) if cert else None
    if subject:
        # The broker's default principal for a client certificate is its whole subject;
        # ssl.principal.mapping.rules may shorten it (then grant the mapped name).
        return f"User:{subject}"
    if user:
        return f"User:{user}"
    if str(kafka_config.get("security.protocol", "")).upper() in ("SSL", "PLAINTEXT") \
            and not kafka_config.get("ssl.certificate.pem"):
        return "User:ANONYMOUS"      # TLS without a client certificate, or no security
    return "<the config's principal>"


def _camel(op: str) -> str:
    return "".join(w.capitalize() for w in op.split("_"))


def grant_command(need: Need, missing: Iterable[str], who: str) -> str:
    """The ``kafka-acls.sh`` line that grants ``missing`` on ``need``'s resource."""
    ops = " ".join(f"--operation {_camel(o)}" for o in missing)
    return (f"kafka-acls.sh --add --allow-principal {who} {ops} --{need.resource} "
            f"{need.name} (docs/security.md)")


def acl_check(need: Need, granted: Granted, who: str) -> Check:
    """PASS when ``granted`` covers ``need``; FAIL naming what is missing and the grant."""
    name = f"kafka acl {need.resource} {need.name}"
    if granted is None:
        return passed(name, f"{need.why}: {NOT_REPORTED}")
    if isinstance(granted, str):
        if "authoriz" not in granted.lower():
            return warn(name, f"{need.why}: not checked: {granted}",
                        "run the doctor again once the cluster answers")
        return fail(name, f"{need.why}: refused: {granted}",
                    "grant " + grant_command(need, need.operations, who))
    missing = [o for o in need.operations if o not in granted]
    if not missing:
        return passed(name, f"{need.why}: {', '.join(need.operations)} allowed")
    have = ", ".join(sorted(granted)) or "nothing"
    return fail(name, f"{need.why}: {', '.join(missing)} not allowed (allowed: {have})",
                "grant " + grant_command(need, missing, who))


def idempotent_check(cluster: frozenset[str] | None, topics: Mapping[str, Granted],
                     who: str) -> Check:
    """Ingress's producers are idempotent: ``IDEMPOTENT_WRITE`` on the cluster, or (Kafka
    3.0 and later, KIP-679) ``WRITE`` on any topic, allows it.
    """
    name = "kafka acl idempotent write"
    if cluster is None:
        return passed(name, NOT_REPORTED)
    if "IDEMPOTENT_WRITE" in cluster:
        return passed(name, "IDEMPOTENT_WRITE allowed on the cluster")
    writable = sorted(t for t, g in topics.items() if isinstance(g, frozenset) and "WRITE" in g)
    if writable:
        return passed(name, f"WRITE on {writable[0]} allows it (Kafka 3.0 and later)")
    return fail(name, "neither IDEMPOTENT_WRITE on the cluster nor WRITE on a topic",
                f"grant kafka-acls.sh --add --allow-principal {who} --operation Write on the "
                "destination topics (docs/security.md)")


def transactional_check(prefix: str, error: str | None, who: str) -> Check:
    """Exactly-once ingress's transactional ids (``prefix`` + instance + n): ``error`` is
    what ``init_transactions`` of one id under the prefix answered (``None``: it worked).
    """
    name = f"kafka acl transactional-id {prefix}*"
    if error is None:
        return passed(name, f"init_transactions of {prefix}{TXN_PROBE_SUFFIX} worked")
    if "authoriz" in error.lower():
        return fail(name, f"refused: {error}",
                    f"grant kafka-acls.sh --add --allow-principal {who} --operation Write "
                    f"--operation Describe --resource-pattern-type prefixed "
                    f"--transactional-id {prefix} (docs/security.md)")
    return warn(name, f"not checked: {error}",
                "run the doctor again once the transaction coordinator answers")


def needs(settings: Settings, selected: Iterable[str] = ()) -> list[Need]:
    """What the config's services need (``selected``: the topics egress replicates). A
    topic is asked about whether or not the principal sees it: one it may not describe
    is hidden from its topic list (a topic that does not exist is left out by
    ``acl_checks``).
    """
    out: list[Need] = []
    if settings.egress is not None:
        for t in sorted(set(selected)):
            out.append(Need("topic", t, ("DESCRIBE", "READ", "DESCRIBE_CONFIGS"),
                            "egress reads it"))
        out.append(Need("group", settings.egress.group_id, ("READ",),
                        "egress's consumer group"))
    ing = settings.ingress
    if ing is not None:
        exactly_once = ing.delivery == "exactly-once"
        for t in sorted({s.destination for s in ing.sources if s.topic is not None}):
            # Exactly-once commits an offset of the destination partition in each
            # transaction (TxnOffsetCommit, for the placement group's generation check):
            # the broker asks READ on the topic for it.
            out.append(Need("topic", t, ("DESCRIBE", "WRITE", "READ") if exactly_once
                            else ("DESCRIBE", "WRITE"),
                            "ingress produces to it and commits its transactions' offsets "
                            "there" if exactly_once else "ingress produces to it"))
        internal = [ing.checkpoint_topic, ing.segment_events_topic]
        if ing.delivery == "exactly-once" and ing.offset_map:
            internal.append(ing.offset_map_topic)
        for t in internal:
            out.append(Need("topic", t, ("DESCRIBE", "READ", "WRITE"),
                            "ingress writes and reads it"))
        out.append(Need("group", ing.group_id, ("READ",), "ingress's placement group"))
    return out


def _unknown(granted: Granted) -> bool:
    """The cluster answered that the topic does not exist (it may describe it: the
    topic checks and ingress's start-up say what to do about a missing one).
    """
    return isinstance(granted, str) and ("unknown topic" in granted.lower()
                                         or "UNKNOWN_TOPIC" in granted)


def acl_checks(probe: AclProbe, settings: Settings, selected: Iterable[str] = (),
               init_transactions: Callable[[str], None] | None = None) -> list[Check]:
    """Every permission check of ``settings`` (see the module docstring);
    ``init_transactions(id)`` tries one transactional id (exactly-once ingress).
    """
    who = principal(settings.kafka.config)
    want = needs(settings, selected)
    topics = [n.name for n in want if n.resource == "topic"]
    try:
        granted: dict[str, Granted] = dict(probe.topic_operations(topics))
    except ReplicatorError as e:
        granted = {t: str(e) for t in topics}
    out: list[Check] = []
    for n in want:
        g = granted.get(n.name) if n.resource == "topic" else probe.group_operations(n.name)
        if n.resource == "topic" and _unknown(g):
            continue
        out.append(acl_check(n, g, who))
    ing = settings.ingress
    if ing is not None:
        try:
            cluster: frozenset[str] | None = probe.cluster_operations()
        except ReplicatorError:
            cluster = None       # reported by the cluster check
        out.append(idempotent_check(cluster, granted, who))
        if ing.delivery == "exactly-once" and init_transactions is not None:
            prefix = f"{ing.group_id}."
            error = None
            try:
                init_transactions(prefix + TXN_PROBE_SUFFIX)
            except ReplicatorError as e:
                error = str(e)
            out.append(transactional_check(prefix, error, who))
    return out
