"""librdkafka's errors sorted into the suite's error tree: the one place that reads an error
code or flag of the Kafka client.

The rules (docs/architecture.md, "Errors"):

* fenced (``_FENCED``, ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``) → ``ProducerFenced``:
  this producer can no longer commit (a newer producer with its id, or a transaction that
  outlived ``transaction.timeout.ms``); what to do is the caller's decision;
* the group coordinator refusing a transaction's group metadata (``ILLEGAL_GENERATION``,
  ``UNKNOWN_MEMBER_ID``, ``FENCED_INSTANCE_ID``, ``REBALANCE_IN_PROGRESS``) →
  ``GenerationFenced`` (a ``TransactionAbortable``; ``translate_offsets_error``, for
  ``send_offsets_to_transaction`` only): the member is no longer in the group's current
  generation, the transaction must never commit;
* a delivery report refusing a record for good (``MSG_SIZE_TOO_LARGE``,
  ``RECORD_LIST_TOO_LARGE``, ``INVALID_RECORD``, ``INVALID_TIMESTAMP``,
  ``TOPIC_AUTHORIZATION_FAILED``) → ``RecordRefused`` (a ``KafkaRetriableError``): the
  record's partition stops at it, the others go on;
* ``txn_requires_abort()`` → ``TransactionAbortable``: abort the transaction, redo the batch;
* ``retriable()`` → ``KafkaRetriableError``: the same call may pass later;
* anything else → ``KafkaFatalError``: the client (or the process) has to restart.

A configuration librdkafka refuses when a client is built, or a group setting the broker
refuses (``session.timeout.ms``), is a ``ConfigError`` naming ``kafka.config``: the CLI exits
2 with one line instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import confluent_kafka as ck

from replicator.core.errors import (
    ConfigError,
    GenerationFenced,
    GroupProtocolMismatch,
    KafkaFatalError,
    KafkaRetriableError,
    NotAuthorized,
    OffsetsNotAuthorized,
    ProducerFenced,
    RecordRefused,
    ReplicatorError,
    TransactionAbortable,
)

C = TypeVar("C")

_FENCED_CODES = frozenset({
    ck.KafkaError._FENCED,                                # librdkafka's local "fenced"
    getattr(ck.KafkaError, "PRODUCER_FENCED", -999),      # the broker's (newer clients)
    ck.KafkaError.INVALID_PRODUCER_EPOCH,
})
# A delivery report of a fenced producer carries one of these (not INVALID_PRODUCER_EPOCH,
# which the client retries itself).
_FENCED_DELIVERY_CODES = frozenset({ck.KafkaError._FENCED,
                                    getattr(ck.KafkaError, "PRODUCER_FENCED", -999)})

# A broker's permanent answers about a record (or its batch) rather than the request: the
# record's partition stops at it, the others go on (``RecordRefused``).
_REFUSED_CODES = frozenset({
    ck.KafkaError.MSG_SIZE_TOO_LARGE,          # the batch is above max.message.bytes
    ck.KafkaError.RECORD_LIST_TOO_LARGE,
    ck.KafkaError.INVALID_RECORD,
    ck.KafkaError.INVALID_TIMESTAMP,           # message.timestamp.*.max.ms
    ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
})

# TxnOffsetCommit needs Read on each offset's topic and on the group.
_OFFSETS_AUTHZ = frozenset({ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                            ck.KafkaError.GROUP_AUTHORIZATION_FAILED})

# The group coordinator's answers to a TxnOffsetCommit from a member of an older generation
# (KIP-447): the transaction must abort.
_GENERATION_CODES = frozenset({
    ck.KafkaError.ILLEGAL_GENERATION,
    ck.KafkaError.UNKNOWN_MEMBER_ID,
    ck.KafkaError.FENCED_INSTANCE_ID,
    ck.KafkaError.REBALANCE_IN_PROGRESS,
})

# Transient by the protocol, but reported without the client's retriable flag in the
# per-partition results of admin requests (a group coordinator still loading its offsets
# after a broker start, or moved; a group's offsets pending in an open transaction):
# retried, never taken for a refusal.
_TRANSIENT_GROUP_CODES = frozenset({
    ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    ck.KafkaError.COORDINATOR_NOT_AVAILABLE,
    ck.KafkaError.NOT_COORDINATOR,
    ck.KafkaError.UNSTABLE_OFFSET_COMMIT,
})

_TRANSIENT_PARTITION_CODES = frozenset({
    ck.KafkaError.LEADER_NOT_AVAILABLE,
    ck.KafkaError.NOT_LEADER_FOR_PARTITION,
    ck.KafkaError.UNKNOWN_LEADER_EPOCH,
    ck.KafkaError.FENCED_LEADER_EPOCH,
    ck.KafkaError.OFFSET_NOT_AVAILABLE,
})
"""A partition's leadership moving (a broker restarting, a topic just created): retriable
in the Kafka protocol, but a per-partition error the client builds carries no retriable
flag (a ListOffsets answer right after MirrorMaker 2 created a topic was taken as fatal)."""

KafkaException = ck.KafkaException
"""The client's exception type (seam-internal: nothing outside this package catches it)."""


def client_error(e: BaseException) -> ck.KafkaError | None:
    """The ``KafkaError`` carried by a ``KafkaException``, if any."""
    return e.args[0] if e.args and isinstance(e.args[0], ck.KafkaError) else None


def classify(err: ck.KafkaError, what: str) -> ReplicatorError:
    """Sort one ``KafkaError`` into the error tree (see the module docstring)."""
    if err.code() in _FENCED_CODES:
        return ProducerFenced(f"{what}: producer fenced by a newer instance: {err.str()}")
    if err.txn_requires_abort():
        return TransactionAbortable(f"{what}: {err.str()}")
    if (err.retriable() or err.code() in _TRANSIENT_GROUP_CODES
            or err.code() in _TRANSIENT_PARTITION_CODES):
        return KafkaRetriableError(f"{what}: {err.str()}")
    return KafkaFatalError(f"{what}: {err.str()}")


def translate(e: BaseException, what: str) -> ReplicatorError:
    """Turn a ``KafkaException`` into the error tree, naming ``what`` failed."""
    err = client_error(e)
    if err is None:
        return KafkaFatalError(f"{what}: {e}")
    return classify(err, what)


def translate_offsets_error(e: BaseException, what: str, *, principal: str = "",
                            topics: Sequence[str] = (), group: str = "") -> ReplicatorError:
    """``translate`` for ``send_offsets_to_transaction``: the group coordinator's refusal
    of the member's generation is ``GenerationFenced`` (the transaction must abort).

    A missing ACL (``TOPIC_AUTHORIZATION_FAILED``: no ``Read`` on the offsets' topics;
    ``GROUP_AUTHORIZATION_FAILED``: no ``Read`` on the group) keeps its class (the
    transaction aborts and is retried, so a grant lets it pass without a restart) but its
    message names ``principal`` and the grant that is missing.
    """
    err = client_error(e)
    if err is not None and err.code() in _GENERATION_CODES:
        return GenerationFenced(f"{what}: the consumer group's coordinator refused this "
                                f"member's generation: {err.str()}")
    if err is not None and err.code() in _OFFSETS_AUTHZ:
        resource = (", ".join(f"Topic:{t}" for t in topics) if
                    err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
                    else f"Group:{group}" if group else "the transaction's consumer group")
        base = classify(err, what)
        cls: type[ReplicatorError] = (
            OffsetsNotAuthorized if isinstance(base, TransactionAbortable)
            else NotAuthorized if isinstance(base, KafkaRetriableError) else type(base))
        return cls(f"{what}: {principal or 'this principal'} is not allowed to commit "
                   f"offsets in a transaction ({err.name()}): grant it Read on "
                   f"{resource} (docs/security.md, Ingress)")
    return translate(e, what)


def produce_error(e: BaseException, what: str, enqueued: int) -> ReplicatorError:
    """``translate`` for a record the client refused when enqueued: one larger than the
    client's own ``message.max.bytes`` is a ``RecordRefused`` (its partition stops at it,
    as for the broker's refusal), saying how many records of the call went before it.
    """
    err = client_error(e)
    if err is not None and err.code() == ck.KafkaError.MSG_SIZE_TOO_LARGE:
        return RecordRefused(f"{what}: refused by the client (larger than its "
                             f"message.max.bytes): {err.str()}", reason=err.str(),
                             setting="message.max.bytes of kafka.config",
                             enqueued=enqueued)
    return translate(e, what)


def delivery_error(err: ck.KafkaError, what: str) -> ReplicatorError:
    """The error of a failed delivery report: fenced, refused (``RecordRefused``: the
    record's partition stops at it), fatal, or retriable (redo the batch).
    """
    if err.code() in _FENCED_DELIVERY_CODES:
        return ProducerFenced(f"{what}: {err.str()}")
    if err.code() in _REFUSED_CODES and not err.fatal():
        return RecordRefused(f"{what}: refused: {err.str()}", reason=err.str())
    if err.fatal():
        return KafkaFatalError(f"{what}: {err.str()}")
    return KafkaRetriableError(f"{what}: {err.str()}")


def is_end_event(err: ck.KafkaError) -> bool:
    """True for the end-of-partition event of ``enable.partition.eof`` (not an error)."""
    return err.code() == ck.KafkaError._PARTITION_EOF


def is_out_of_range_event(err: ck.KafkaError) -> bool:
    """True for the event of ``auto.offset.reset=error``: the fetch position left the log."""
    return err.code() == ck.KafkaError._AUTO_OFFSET_RESET


_CONSUMER_AUTHZ = frozenset({ck.KafkaError.GROUP_AUTHORIZATION_FAILED,
                             ck.KafkaError.TOPIC_AUTHORIZATION_FAILED})


def not_authorized(err: ck.KafkaError, where: str, principal: str, group: str,
                   topic: str) -> NotAuthorized:
    """A consumer's missing ACL, naming ``principal`` and the grant (docs/security.md)."""
    if err.code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED:
        grant = f"Read on Group:{group}"
    else:
        grant = f"Read and Describe on Topic:{topic or '<the topic>'}"
    return NotAuthorized(f"{where}: {principal or 'this principal'} is not authorized "
                         f"({err.name()}: {err.str()}): grant it {grant} "
                         "(docs/security.md)")


def event_error(err: ck.KafkaError, where: str, *, principal: str = "", group: str = "",
                topic: str = "") -> ReplicatorError:
    """The error of an error event returned by ``consume``/``poll``.

    A group setting the broker refuses (``session.timeout.ms`` outside the broker's
    ``group.min.session.timeout.ms``..``group.max.session.timeout.ms``) is a
    ``ConfigError`` naming ``kafka.config``: the consumer would otherwise retry its join
    forever and never own a partition.
    """
    if err.code() in _CONSUMER_AUTHZ:
        return not_authorized(err, where, principal, group, topic)
    if err.code() == ck.KafkaError.INVALID_SESSION_TIMEOUT:
        return ConfigError("kafka.config", "the broker refuses the consumer group's "
                           "session.timeout.ms (it must lie within the broker's "
                           "group.min.session.timeout.ms and group.max.session.timeout.ms, "
                           f"6 s to 30 min by default): {err.str()}")
    if err.code() == ck.KafkaError.INCONSISTENT_GROUP_PROTOCOL:
        return GroupProtocolMismatch(
            f"the consumer group refused this member ({err.str()}): other members use a "
            "partition.assignment.strategy of the other protocol (eager range or roundrobin "
            "against cooperative-sticky), which one group cannot mix. Egress uses "
            "cooperative-sticky unless kafka.config sets the strategy; older versions used "
            "range. Either set kafka.config partition.assignment.strategy = \"range\" on the "
            "new members until every member runs them, or stop every member of the group "
            "and start the new ones (docs/upgrades.md). This member owns no partition until "
            "then and joins by itself once the others have left.")
    if err.retriable() or not err.fatal():
        return KafkaRetriableError(f"{where}: {err.str()}")
    return KafkaFatalError(f"{where}: {err.str()}")


def is_code(e: BaseException, name: str) -> bool:
    """True if ``e`` carries the error code called ``name`` (``"TOPIC_ALREADY_EXISTS"``)."""
    err = client_error(e)
    return err is not None and err.code() == getattr(ck.KafkaError, name, None)


def construct(kind: str, factory: Callable[[dict[str, Any]], C], conf: dict[str, Any]) -> C:
    """Build a client; a configuration librdkafka refuses is a ``ConfigError``.

    librdkafka checks its whole configuration when a client is created (unknown property,
    invalid value, SASL without ``sasl.password``, ...) and raises with ``_INVALID_ARG``.
    That is a mistake in ``kafka.config``, not a runtime failure, so it must reach the CLI
    as a configuration error (exit 2), not as a traceback (exit 1).
    """
    try:
        return factory(conf)
    except ck.KafkaException as e:
        err = client_error(e)
        if err is not None and err.code() == ck.KafkaError._INVALID_ARG:
            raise ConfigError("kafka.config", f"the Kafka {kind} client refuses the "
                              f"configuration: {err.str()}") from e
        raise translate(e, f"create Kafka {kind} client") from e
