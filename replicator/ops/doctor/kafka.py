"""Kafka checks of ``replicator doctor``: the cluster answers, which cluster it is, the topics
a config names or selects, the internal topics of ingress, topic auto-creation and the
broker's transaction timeout limit.

The decisions (``reach_check``, ``cluster_check``, ``egress_topic_checks``,
``internal_topic_check``, ``auto_create_check``, ``transaction_timeout_check``) are pure:
they map what was read to PASS/WARN/FAIL and the fix. ``kafka_checks`` reads the cluster
through the Kafka seam's ``Admin`` (``KafkaProbe`` here) and calls them.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from replicator.core.compacted_topic import CHECKPOINT_TOPIC_CONFIG, checkpoint_topic_problems
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import ClusterInfo
from replicator.core.settings import Settings
from replicator.ops.doctor.report import Check, fail, passed, warn

REACH = "kafka reachable"


class KafkaProbe(Protocol):
    """What the Kafka checks read (``replicator.core.kafka.Admin``)."""

    timeout: float

    def topic_partitions(self) -> dict[str, int]: ...
    def client_errors(self) -> list[str]: ...
    def cluster(self) -> ClusterInfo: ...
    def broker_config(self, broker_id: int) -> dict[str, str]: ...
    def effective_topic_config(self, topic: str) -> dict[str, str]: ...


# --- reachability ----------------------------------------------------------------------


def bootstrap_addresses(brokers: str) -> list[str]:
    """The ``host:port`` entries of ``kafka.brokers`` (a ``PLAINTEXT://`` scheme dropped)."""
    out = []
    for raw in brokers.split(","):
        entry = raw.strip()
        if "://" in entry:
            entry = entry.split("://", 1)[1]
        if entry:
            out.append(entry)
    return out


_AFTER = re.compile(r"\s*\(after \d+ms in state \w+\)\s*$")
_SCHEME = re.compile(r"^[a-z_]+://", re.I)


def broker_causes(addresses: Sequence[str], client_errors: Sequence[str]) -> dict[str, str]:
    """The newest client error naming each bootstrap address, without librdkafka's
    ``host:port/bootstrap:`` prefix and ``(after Nms in state X)`` suffix.

    librdkafka names a broker of a TLS or SASL listener with its protocol
    (``sasl_ssl://host:port/bootstrap: SASL authentication error: ...``): that scheme is
    dropped before matching, so those causes are found too.
    """
    causes: dict[str, str] = {}
    for text in client_errors:
        head = text.split("://", 1)[1] if _SCHEME.match(text) else text
        for addr in addresses:
            if head.startswith(f"{addr}/"):
                cause = head.split(": ", 1)[1] if ": " in head else head
                causes[addr] = _AFTER.sub("", cause)
    return causes


def cause_fix(cause: str, address: str) -> str:
    """What to do about one broker's connection failure, by its cause."""
    low = cause.lower()
    if "resolve" in low:
        return f"fix the host name of {address} in kafka.brokers (it does not resolve)"
    if "refused" in low:
        return (f"nothing listens at {address}: start the brokers, or fix kafka.brokers "
                "(host and port of a listener)")
    if "ssl" in low or "handshake" in low or "certificate" in low:
        return ("the TLS handshake failed: check security.protocol and ssl.* in "
                "[kafka.config] (CA file, the listener's protocol)")
    if "sasl" in low or "authentication" in low:
        return ("authentication failed: check sasl.mechanism, sasl.username and "
                "sasl.password in [kafka.config]")
    return (f"check the network path to {address} (firewall, security group) and that it "
            "is a Kafka listener")


def reach_check(brokers: str, error: str | None, client_errors: Sequence[str],
                elapsed: float, deadline: float) -> Check:
    """PASS when the cluster answered a metadata request, else FAIL naming each bootstrap
    broker and why it could not be reached.
    """
    addresses = bootstrap_addresses(brokers)
    if error is None:
        return passed(REACH, f"{', '.join(addresses)} answered in {elapsed:.2f}s")
    causes = broker_causes(addresses, client_errors)
    if not causes:
        seen = (f"no answer from {', '.join(addresses)} within {deadline:g}s: {error}")
        return fail(REACH, seen, cause_fix("", ", ".join(addresses)))
    seen = "; ".join(f"{a}: {causes.get(a, 'no answer')}" for a in addresses)
    first = next(a for a in addresses if a in causes)
    return fail(REACH, f"no answer within {deadline:g}s: {seen}", cause_fix(causes[first], first))


def cluster_check(info: ClusterInfo) -> Check:
    """The cluster's id and brokers (PASS; WARN when the cluster has no id)."""
    brokers = ", ".join(map(str, info.broker_ids)) or "none"
    seen = f"cluster id {info.cluster_id}, brokers {brokers}, controller {info.controller_id}"
    if not info.cluster_id:
        return warn("kafka cluster", seen, "the cluster reports no id: check kafka.brokers "
                                           "names the cluster meant")
    return passed("kafka cluster", seen)


# --- topics ------------------------------------------------------------------------------


def egress_topic_checks(tables: Iterable[str], patterns: Sequence[str],
                        selected: Iterable[str], partitions: Mapping[str, int]
                        ) -> list[Check]:
    """One line per ``[egress.topics."NAME"]`` table (its partition count, WARN when the
    topic does not exist: egress waits for it) and one for what ``[egress.select]``
    matches now (WARN when it matches nothing).
    """
    tables = sorted(tables)
    out = []
    for t in tables:
        if t in partitions:
            out.append(passed(f"topic {t}", f"{partitions[t]} partition(s)"))
        else:
            out.append(warn(f"topic {t}", "does not exist: egress waits for it",
                            f"create {t}, or remove [egress.topics.\"{t}\"]"))
    if patterns:
        matched = sorted(set(selected) - set(tables))
        shown = ", ".join(f"{t} ({partitions.get(t, '?')})" for t in matched[:10])
        more = f" and {len(matched) - 10} more" if len(matched) > 10 else ""
        if matched:
            out.append(passed("egress select", f"{len(matched)} topic(s) match now: "
                                               f"{shown}{more}"))
        else:
            out.append(warn("egress select", f"include {list(patterns)} matches no topic now",
                            "check [egress.select] include/exclude against the topic names "
                            "(patterns match whole names)"))
    return out


@dataclass(frozen=True)
class InternalTopic:
    """One of ingress's own topics: its role, name and the cleanup policy it needs."""

    role: str
    topic: str
    compacted: bool
    """True: one record per key must stay (checkpoints, the offset map); False: expired by
    retention (segment events)."""


def internal_topic_check(t: InternalTopic, partitions: int | None,
                         configs: Mapping[str, str] | None,
                         config_error: str | None = None) -> Check:
    """A topic of ingress: missing is a WARN (ingress creates it at start when it may); a
    compacted topic that retention may delete from is a FAIL (checkpoints lost: partitions
    replay again from older positions); an events topic that is compacted only is a WARN
    (never expired).
    """
    name = f"{t.role} {t.topic}"
    if partitions is None:
        return warn(name, "does not exist yet",
                    "ingress creates it at start when its principal may create topics; "
                    "otherwise run deploy/kafka/create-topics.sh")
    if configs is None:
        return warn(name, f"{partitions} partition(s); configs not readable: {config_error}",
                    "grant DescribeConfigs on the topic to check its cleanup.policy")
    policy = configs.get("cleanup.policy")
    seen = f"{partitions} partition(s), cleanup.policy={policy or '(not described)'}"
    if t.compacted:
        problems = checkpoint_topic_problems(configs)
        errors = [m for level, m in problems if level >= logging.ERROR]
        if errors:
            # "cleanup.policy=X: why; set cleanup.policy=compact": the why, once.
            why = errors[0].split(": ", 1)[-1].rsplit("; set", 1)[0]
            return fail(name, seen, f"set cleanup.policy=compact on {t.topic}: {why}; "
                                    f"kafka-configs.sh --alter --entity-type topics "
                                    f"--entity-name {t.topic} --add-config "
                                    "cleanup.policy=compact")
        if problems:
            return warn(name, seen, "; ".join(m for _, m in problems))
        if policy is None:
            return warn(name, seen, "the broker does not describe cleanup.policy: make sure "
                                    f"it is {CHECKPOINT_TOPIC_CONFIG['cleanup.policy']}")
        return passed(name, seen)
    if policy is not None and "delete" not in policy:
        return warn(name, seen, f"set cleanup.policy=delete on {t.topic}: events are only "
                                "needed until ingress listed their segments, and a "
                                "compacted topic is never expired")
    return passed(name, seen)


def auto_create_check(value: str | None, error: str | None = None) -> Check:
    """``auto.create.topics.enable`` of a broker: WARN when on (a topic read or written by
    a wrong name appears with the broker's default partitions and configs) or unreadable.
    """
    name = "topic auto-creation"
    if value is None:
        return warn(name, f"auto.create.topics.enable not readable{f': {error}' if error else ''}",
                    "check the brokers' auto.create.topics.enable; false is safer (ingress and "
                    "restore create their topics with the source's partitions and configs)")
    if value.lower() == "true":
        return warn(name, "auto.create.topics.enable=true",
                    "set auto.create.topics.enable=false on the brokers: a mistyped topic is "
                    "created with the broker's default partitions and configs instead of "
                    "failing")
    return passed(name, f"auto.create.topics.enable={value}")


def transaction_timeout_check(max_ms: str | None, used_ms: int, used_from: str,
                              error: str | None = None) -> Check:
    """Exactly-once ingress: its producers' ``transaction.timeout.ms`` must not exceed the
    brokers' ``transaction.max.timeout.ms`` (InitProducerId fails with
    INVALID_TRANSACTION_TIMEOUT and no partition is replayed).
    """
    name = "transaction.max.timeout.ms"
    if max_ms is None or not max_ms.isdigit():
        return warn(name, f"not readable{f': {error}' if error else ''}; ingress uses "
                          f"transaction.timeout.ms={used_ms} ({used_from})",
                    f"make sure the brokers' transaction.max.timeout.ms is at least {used_ms}")
    seen = f"{max_ms} on the brokers; ingress uses {used_ms} ({used_from})"
    if int(max_ms) < used_ms:
        return fail(name, seen, f"raise transaction.max.timeout.ms on the brokers to at least "
                                f"{used_ms}, or set transaction.timeout.ms <= {max_ms} in "
                                "[kafka.config]")
    return passed(name, seen)


# --- gathering -----------------------------------------------------------------------------


def internal_topics(settings: Settings) -> list[InternalTopic]:
    """The topics ingress uses in its cluster (none without ``[ingress]``)."""
    ing = settings.ingress
    if ing is None:
        return []
    out = [InternalTopic("checkpoint topic", ing.checkpoint_topic, True),
           InternalTopic("segment events topic", ing.segment_events_topic, False)]
    if ing.delivery == "exactly-once" and ing.offset_map:
        out.append(InternalTopic("offset map topic", ing.offset_map_topic, True))
    return out


def kafka_checks(admin: KafkaProbe, settings: Settings, *,
                 select: Callable[[Sequence[str]], Iterable[str]] | None = None,
                 transaction_timeout: tuple[int, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> list[Check]:
    """Every Kafka check of ``settings``: reachability first (nothing else when the cluster
    does not answer), then the cluster, egress's topics (``select`` maps the cluster's
    topic names to those egress replicates), ingress's internal topics, auto-creation and,
    with ``transaction_timeout`` (the ``transaction.timeout.ms`` ingress uses and where it
    comes from), the brokers' limit.
    """
    start = clock()
    try:
        partitions = admin.topic_partitions()
    except ReplicatorError as e:
        return [reach_check(settings.kafka.brokers, str(e), admin.client_errors(),
                            clock() - start, admin.timeout)]
    out = [reach_check(settings.kafka.brokers, None, [], clock() - start, admin.timeout)]
    broker_configs: dict[str, str] | None = None
    config_error: str | None = None
    try:
        info = admin.cluster()
        out.append(cluster_check(info))
        if info.broker_ids:
            broker_configs = admin.broker_config(info.broker_ids[0])
    except ReplicatorError as e:
        config_error = str(e)
        out.append(warn("kafka cluster", f"not described: {e}",
                        "grant Describe on the cluster to the config's principal"))
    if settings.egress is not None and select is not None:
        eg = settings.egress
        out += egress_topic_checks(eg.topics, eg.select.include, select(sorted(partitions)),
                                   partitions)
    for t in internal_topics(settings):
        configs, error = None, None
        if t.topic in partitions:
            try:
                configs = admin.effective_topic_config(t.topic)
            except ReplicatorError as e:
                error = str(e)
        out.append(internal_topic_check(t, partitions.get(t.topic), configs, error))
    # Tansu describes no broker configs (an empty answer): "not readable", not "false".
    broker_configs = broker_configs or None
    out.append(auto_create_check(
        None if broker_configs is None else broker_configs.get("auto.create.topics.enable"),
        config_error or (None if broker_configs else "the broker describes no configs")))
    if transaction_timeout is not None:
        used, used_from = transaction_timeout
        out.append(transaction_timeout_check(
            None if broker_configs is None
            else broker_configs.get("transaction.max.timeout.ms"),
            used, used_from,
            config_error or (None if broker_configs else "the broker describes no configs")))
    return out
