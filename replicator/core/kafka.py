"""The Kafka seam: the only module that imports ``confluent_kafka``.

Thin wrappers that apply our defaults and translate client errors into the error tree.
Messages are passed on as the client's own objects, typed by the ``Message`` protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import confluent_kafka as ck
import confluent_kafka.admin as cka
from confluent_kafka.admin._config import ConfigResource, ConfigSource
from confluent_kafka.cimpl import NewPartitions, NewTopic

from replicator.core.errors import (
    ConfigError,
    KafkaFatalError,
    KafkaRetriableError,
    ProducerFenced,
    ReplicatorError,
    TopicError,
)
from replicator.core.settings import KafkaSettings

log = logging.getLogger(__name__)

TopicPartition = ck.TopicPartition
OFFSET_BEGINNING = ck.OFFSET_BEGINNING
OFFSET_END = ck.OFFSET_END
OFFSET_INVALID = ck.OFFSET_INVALID
OFFSET_STORED = ck.OFFSET_STORED
TIMESTAMP_NOT_AVAILABLE = ck.TIMESTAMP_NOT_AVAILABLE
TIMESTAMP_CREATE_TIME = ck.TIMESTAMP_CREATE_TIME
TIMESTAMP_LOG_APPEND_TIME = ck.TIMESTAMP_LOG_APPEND_TIME

Headers = list[tuple[str, bytes | None]]


class Message(Protocol):
    """What we read from a consumed record (``confluent_kafka.Message``)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Any: ...
    def timestamp(self) -> tuple[int, int]: ...
    def error(self) -> Any: ...
    def __len__(self) -> int: ...


# Defaults that correctness depends on (``kafka.config`` and call-site overrides come after).
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,           # offsets are committed only after durability
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",       # a new group starts from the oldest record
    "isolation.level": "read_committed",   # never replicate open/aborted transactions
    # Eager range assignment; cooperative-sticky also works when set in kafka.config
    # (tests/integration/test_kafka_group_members.py runs both on Apache Kafka).
    "partition.assignment.strategy": "range",
    # When the prefetch queue is full (queued.max.messages.kbytes), librdkafka postpones
    # the partition's next fetch by this long; its default (1000 ms) idles a consumer that
    # does real work per record for most of each second once it drained the queue
    # (egress measured 120 MB/s with it, 190 MB/s with 10 ms).
    "fetch.queue.backoff.ms": 10,
}
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    # Records of up to the source's max.message.bytes must pass the client's own check.
    "message.max.bytes": 64 * 1024**2,
}

# ``kafka.config`` is shared by every client of a process, but librdkafka warns (CONFWARN)
# about consumer-only settings given to a producer or admin client and the reverse. These
# are dropped from the clients they do not apply to; everything else passes through.
CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "session.timeout.ms", "heartbeat.interval.ms",
    "group.protocol", "group.protocol.type", "group.remote.assignor",
    "partition.assignment.strategy", "coordinator.query.interval.ms",
    "max.poll.interval.ms", "enable.auto.commit", "auto.commit.interval.ms",
    "enable.auto.offset.store", "queued.min.messages", "queued.max.messages.kbytes",
    "fetch.wait.max.ms", "fetch.queue.backoff.ms", "fetch.message.max.bytes",
    "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes",
    "fetch.error.backoff.ms", "isolation.level", "enable.partition.eof", "check.crcs",
    "auto.offset.reset", "allow.auto.create.topics",
})
PRODUCER_ONLY = frozenset({
    "transactional.id", "transaction.timeout.ms", "enable.idempotence",
    "enable.gapless.guarantee", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "queue.buffering.max.ms", "linger.ms", "message.send.max.retries", "retries",
    "compression.codec", "compression.type", "compression.level", "batch.num.messages",
    "batch.size", "delivery.report.only.error", "sticky.partitioning.linger.ms",
    "acks", "request.required.acks", "request.timeout.ms", "message.timeout.ms",
    "delivery.timeout.ms", "partitioner", "queuing.strategy",
})


def client_config(kafka: KafkaSettings, defaults: Mapping[str, Any],
                  overrides: Mapping[str, Any] | None = None, *,
                  drop: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Merge defaults, the user's ``kafka.config`` (less ``drop``) and call-site overrides."""
    conf: dict[str, Any] = {"bootstrap.servers": kafka.brokers}
    conf.update(defaults)
    conf.update({k: v for k, v in kafka.config.items() if k not in drop})
    conf.update(overrides or {})
    return conf


def translate(e: BaseException, what: str) -> ReplicatorError:
    """Turn a ``KafkaException`` into our error tree, naming ``what`` failed."""
    err = e.args[0] if e.args and isinstance(e.args[0], ck.KafkaError) else None
    if err is None:
        return KafkaFatalError(f"{what}: {e}")
    code = err.code()
    if code in (ck.KafkaError._FENCED, getattr(ck.KafkaError, "PRODUCER_FENCED", -999),
                ck.KafkaError.INVALID_PRODUCER_EPOCH):
        return ProducerFenced(f"{what}: producer fenced by a newer instance: {err.str()}")
    if err.retriable() or err.txn_requires_abort():
        return KafkaRetriableError(f"{what}: {err.str()}")
    return KafkaFatalError(f"{what}: {err.str()}")


def is_transaction_abortable(e: BaseException) -> bool:
    """True if a transactional call failed in a way that requires ``abort_transaction``."""
    err = e.args[0] if e.args and isinstance(e.args[0], ck.KafkaError) else None
    return bool(err is not None and err.txn_requires_abort())


KafkaException = ck.KafkaException


def message_error(msg: Message) -> ReplicatorError | None:
    """The error carried by a consumed message, or ``None`` (EOF is not an error).

    A group setting the broker refuses (``session.timeout.ms`` outside the broker's
    ``group.min.session.timeout.ms``..``group.max.session.timeout.ms``) is a
    ``ConfigError`` naming ``kafka.config``: the consumer would otherwise retry its join
    forever and never own a partition.
    """
    err = msg.error()
    if err is None or err.code() == ck.KafkaError._PARTITION_EOF:
        return None
    if err.code() == ck.KafkaError.INVALID_SESSION_TIMEOUT:
        return ConfigError("kafka.config", "the broker refuses the consumer group's "
                           "session.timeout.ms (it must lie within the broker's "
                           "group.min.session.timeout.ms and group.max.session.timeout.ms, "
                           f"6 s to 30 min by default): {err.str()}")
    where = f"{msg.topic()}[{msg.partition()}]"
    if err.retriable() or not err.fatal():
        return KafkaRetriableError(f"{where}: {err.str()}")
    return KafkaFatalError(f"{where}: {err.str()}")


def is_partition_eof(msg: Message) -> bool:
    """True for the EOF event of ``enable.partition.eof``."""
    err = msg.error()
    return err is not None and err.code() == ck.KafkaError._PARTITION_EOF


def _construct(kind: str, factory: Callable[[dict[str, Any]], Any],
               conf: dict[str, Any]) -> Any:
    """Build a client; a configuration librdkafka refuses is a ``ConfigError``.

    librdkafka checks its whole configuration when a client is created (unknown property,
    invalid value, SASL without ``sasl.password``, ...) and raises ``KafkaException`` with
    ``_INVALID_ARG``. That is a mistake in ``kafka.config``, not a runtime failure, so it
    must reach the CLI as a configuration error (exit 2), not as a traceback (exit 1).
    """
    try:
        return factory(conf)
    except ck.KafkaException as e:
        err = e.args[0] if e.args and isinstance(e.args[0], ck.KafkaError) else None
        if err is not None and err.code() == ck.KafkaError._INVALID_ARG:
            raise ConfigError("kafka.config", f"the Kafka {kind} client refuses the "
                              f"configuration: {err.str()}") from e
        raise translate(e, f"create Kafka {kind} client") from e


def make_consumer(kafka: KafkaSettings, group_id: str,
                  overrides: Mapping[str, Any] | None = None) -> ck.Consumer:
    """A consumer with our defaults (manual commits, read_committed, earliest).

    Raises:
        ConfigError: librdkafka refuses the configuration (names ``kafka.config``).
    """
    conf = client_config(kafka, {**CONSUMER_DEFAULTS, "group.id": group_id}, overrides,
                         drop=PRODUCER_ONLY)
    consumer: ck.Consumer = _construct("consumer", ck.Consumer, conf)
    return consumer


def is_cooperative(kafka: KafkaSettings, overrides: Mapping[str, Any] | None = None) -> bool:
    """True if a consumer built with these settings rebalances incrementally
    (``partition.assignment.strategy`` names ``cooperative-sticky``): a rebalance callback
    must then add partitions with ``incremental_assign``, ``assign`` fails with _STATE."""
    conf = client_config(kafka, CONSUMER_DEFAULTS, overrides)
    return "cooperative" in str(conf.get("partition.assignment.strategy", ""))


def assign_in_rebalance(consumer: ck.Consumer, partitions: list[Any], *,
                        cooperative: bool) -> None:
    """Take ``partitions`` from inside an ``on_assign`` callback, for either protocol."""
    if cooperative:
        consumer.incremental_assign(partitions)
    else:
        consumer.assign(partitions)


def make_producer(kafka: KafkaSettings, *, transactional_id: str | None = None,
                  overrides: Mapping[str, Any] | None = None) -> ck.Producer:
    """An idempotent producer; transactional when ``transactional_id`` is given.

    Raises:
        ConfigError: librdkafka refuses the configuration (names ``kafka.config``).
    """
    extra = dict(overrides or {})
    if transactional_id is not None:
        extra["transactional.id"] = transactional_id
    conf = client_config(kafka, PRODUCER_DEFAULTS, extra, drop=CONSUMER_ONLY)
    producer: ck.Producer = _construct("producer", ck.Producer, conf)
    return producer


def make_admin(kafka: KafkaSettings, overrides: Mapping[str, Any] | None = None) -> cka.AdminClient:
    """An admin client for this cluster.

    Raises:
        ConfigError: librdkafka refuses the configuration (names ``kafka.config``).
    """
    conf = client_config(kafka, {}, overrides, drop=CONSUMER_ONLY | PRODUCER_ONLY)
    admin: cka.AdminClient = _construct("admin", cka.AdminClient, conf)
    return admin


class Admin:
    """The admin operations the suite needs, with errors translated."""

    def __init__(self, kafka: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._admin = make_admin(kafka)
        self.timeout = timeout

    def partition_count(self, topic: str) -> int | None:
        """Number of partitions of ``topic``, or ``None`` if it does not exist.

        Asks for the metadata of every topic: a metadata request naming a missing topic
        makes brokers with auto-creation on create it as a side effect (Tansu always;
        Apache Kafka with ``auto.create.topics.enable``, the broker's default, so this is
        needed there too).
        """
        md = self._admin.list_topics(timeout=self.timeout)
        t = md.topics.get(topic)
        if t is None or (t.error is not None and t.error.code() == \
                ck.KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if t.error is not None:
            raise KafkaRetriableError(f"metadata of {topic}: {t.error.str()}")
        return len(t.partitions)

    def list_topics(self) -> list[str]:
        """All topic names."""
        return sorted(self._admin.list_topics(timeout=self.timeout).topics)

    def create_topic(self, topic: str, partitions: int, config: Mapping[str, str] | None = None,
                     *, replication_factor: int = -1) -> bool:
        """Create a topic; returns ``False`` if it already existed."""
        fut = self._admin.create_topics(
            [NewTopic(topic, partitions, replication_factor, config=dict(config or {}))],
            operation_timeout=self.timeout)[topic]
        try:
            fut.result()
            return True
        except ck.KafkaException as e:
            if e.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise translate(e, f"create topic {topic} ({partitions} partitions)") from e

    def grow_topic(self, topic: str, partitions: int) -> None:
        """Raise the partition count of ``topic`` to ``partitions``.

        Raises:
            TopicError: the broker refuses (e.g. it does not support CreatePartitions).
        """
        fut = self._admin.create_partitions([NewPartitions(topic, partitions)],
                                            operation_timeout=self.timeout)[topic]
        try:
            fut.result()
        except ck.KafkaException as e:
            raise TopicError(f"cannot grow {topic} to {partitions} partitions: "
                             f"{e.args[0].str()}") from e

    def topic_config(self, topic: str) -> dict[str, str]:
        """The configs set on the topic itself (its overrides), not the cluster's defaults.

        Apache Kafka describes every config with its source (topic, broker, cluster
        default). Only topic-level entries count, so a copy of the topic in another cluster
        takes that cluster's defaults for the rest instead of having the source cluster's
        defaults pinned as overrides. (Tansu describes only the configs set on a topic but
        marks them as defaults, so there this returns nothing.)
        """
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            entries = self._admin.describe_configs([res])[res].result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, f"describe configs of {topic}") from e
        return {k: v.value for k, v in entries.items()
                if v.value is not None
                and getattr(v.source, "value", v.source) in _TOPIC_LEVEL_SOURCES}

    def delete_topics(self, topics: Sequence[str]) -> None:
        """Delete topics (missing ones are ignored)."""
        if not topics:
            return
        for t, fut in self._admin.delete_topics(list(topics),
                                                operation_timeout=self.timeout).items():
            try:
                fut.result()
            except ck.KafkaException as e:
                if e.args[0].code() != ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise translate(e, f"delete topic {t}") from e


# A config describe entry that was set on the topic itself.
_TOPIC_LEVEL_SOURCES = frozenset({ConfigSource.DYNAMIC_TOPIC_CONFIG.value})

OnAssign = Callable[[Any, list[Any]], None]


# --- ingress additions -----------------------------------------------------------------

ERR_FENCED = ck.KafkaError._FENCED
"""librdkafka's local "producer fenced" code (a delivery error of a fenced producer)."""
ERR_PRODUCER_FENCED = getattr(ck.KafkaError, "PRODUCER_FENCED", -999)
"""The broker's PRODUCER_FENCED code (absent in old clients)."""
