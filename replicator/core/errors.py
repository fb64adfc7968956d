"""One error tree for the whole suite.

``ReplicatorError`` splits into ``RetriableError`` (try the same thing again later: a
network blip, a throttled request, a broker that is not ready) and ``FatalError`` (trying
again cannot help: bad configuration, a corrupt segment, a missing object). SDK errors are
translated at their seam with ``raise ... from e`` and name the bucket/key or
``topic[partition]@offset`` they concern.
"""

from __future__ import annotations


class ReplicatorError(Exception):
    """Base of every error raised by kafka-s3-replicator."""


class RetriableError(ReplicatorError):
    """The operation may succeed if tried again (see ``replicator.core.retry``)."""


class FatalError(ReplicatorError):
    """Trying again cannot help; the caller must handle it or stop."""


# --- configuration -----------------------------------------------------------------


class ConfigError(FatalError):
    """A setting is unknown, has the wrong type or contradicts another one.

    ``key`` is the dotted setting name (``egress.topics.sensor.events.max_segment_age``).
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


class ConfigErrors(ConfigError):
    """Several configuration problems at once (each one names its key)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__("", f"invalid configuration ({len(errors)} problem(s)):\n{lines}")


# --- keys and segments ---------------------------------------------------------------


class KeyFormatError(FatalError, ValueError):
    """A string is not a key of the expected layout (docs/architecture.md, "S3 layout")."""


class SegmentCorrupt(FatalError):
    """A segment cannot be read, or its footer disagrees with the key it was opened by."""


# --- storage -------------------------------------------------------------------------


class StorageError(RetriableError):
    """An object store request failed in a way that may pass (5xx, timeout, throttling)."""


class ConditionalConflict(StorageError):
    """S3's 409 ``ConditionalRequestConflict``: another conditional write of the same key
    is in flight. Retriable in general; for a conditional create it also means another
    writer is creating the key.
    """


class ObjectNotFound(FatalError):
    """The object (or bucket) does not exist."""


class SegmentNotFound(ObjectNotFound):
    """A segment key listed or announced earlier is gone (compacted or deleted)."""


class PreconditionFailed(FatalError):
    """A conditional request lost: the object already exists (or changed)."""


class StorageFatalError(FatalError):
    """An object store request failed for good (access denied, invalid request)."""


# --- kafka ---------------------------------------------------------------------------


class KafkaRetriableError(RetriableError):
    """A Kafka request failed in a way the client marks retriable."""


class GroupProtocolMismatch(KafkaRetriableError):
    """The consumer group refused this member's join: its members use an assignor of the
    other protocol (eager ``range``/``roundrobin`` against ``cooperative-sticky``). It
    passes once those members leave (a rolling update completed by hand), so it is
    retriable, but it must be reported clearly: the member owns nothing meanwhile.
    """


class NotAuthorized(KafkaRetriableError):
    """A broker refused a request of this principal for a missing ACL (a consumer's group
    or topic). It passes once the grant is made, so it is retriable, but the message names
    the principal and the grant, and it is reported at ERROR: nothing moves meanwhile.
    """


class KafkaFatalError(FatalError):
    """A Kafka error that cannot pass by itself (fenced producer, authorization, ...)."""


class ProducerFenced(KafkaFatalError):
    """Another producer with the same ``transactional.id`` took over this partition."""


class TransactionAbortable(KafkaRetriableError):
    """A transactional call failed in a way that needs ``abort`` before the batch is redone."""


class OffsetsNotAuthorized(TransactionAbortable, NotAuthorized):
    """A missing ACL refused a transaction's offsets (no ``Read`` on the topics or the
    group): abort and redo the batch (a grant lets it pass), reported like any
    ``NotAuthorized``.
    """


class GenerationFenced(TransactionAbortable):
    """The group coordinator refused a transaction's consumer-group metadata
    (``send_offsets_to_transaction``: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
    FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS), or this member is in no generation at all:
    the group moved on without it, so the partitions of the transaction may be another
    member's. Abort; never commit it.
    """


class RecordRefused(KafkaRetriableError):
    """The destination refused a record for good: larger than the topic's
    ``max.message.bytes``, invalid for it (``INVALID_RECORD``, a timestamp out of bounds), or
    the topic not writable by this principal. Only the record's partition is stopped at it;
    it is tried again on a slow backoff and when the destination's configs change (it
    passes once they do). ``offset`` / ``size`` / ``setting`` name the record when known.
    """

    def __init__(self, message: str, *, offset: int | None = None, size: int | None = None,
                 setting: str | None = None, reason: str = "",
                 enqueued: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset
        self.size = size
        self.setting = setting
        self.reason = reason
        self.enqueued = enqueued
        """Refused by the client itself when enqueued (larger than its own
        ``message.max.bytes``): how many records of the call were enqueued before it
        (``None``: refused by the broker, in a delivery report)."""


class TopicError(FatalError):
    """A topic is missing, too small, or cannot be created as required."""
