"""The ``Admin`` wrapper: the topic administration the suite needs, errors translated."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck
import confluent_kafka.admin as cka
from confluent_kafka import ConsumerGroupTopicPartitions, TopicCollection
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewPartitions, NewTopic

from replicator.core.errors import (
    KafkaFatalError,
    KafkaRetriableError,
    ReplicatorError,
    TopicError,
)
from replicator.core.kafka.auth import client_principal
from replicator.core.kafka.config import CLIENT_LOG, CONSUMER_ONLY, PRODUCER_ONLY, client_config
from replicator.core.kafka.errors import classify, construct, is_code, translate
from replicator.core.settings import KafkaSettings

# A config describe entry that was set on the topic itself.
_TOPIC_LEVEL_SOURCES = frozenset({ConfigSource.DYNAMIC_TOPIC_CONFIG.value})

# Client errors kept for ``client_errors``: librdkafka repeats one per broker and retry
# (about 20 a second against a closed port), so only the newest distinct ones matter.
_KEPT_CLIENT_ERRORS = 32
# An offset commit's refusals for a missing ACL (Read on the group, Read on the topic).
_COMMIT_AUTHZ = frozenset({ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                           ck.KafkaError.GROUP_AUTHORIZATION_FAILED})


_COORDINATOR_WAIT = frozenset({ck.KafkaError.NOT_COORDINATOR,
                               ck.KafkaError.COORDINATOR_NOT_AVAILABLE,
                               ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS})
"""Group errors that pass once the group's coordinator is ready."""


@dataclass(frozen=True)
class ClusterInfo:
    """What DescribeCluster tells about a cluster."""

    cluster_id: str | None
    controller_id: int | None
    broker_ids: tuple[int, ...]


_MEMBERSHIP = frozenset({"group.id", "group.instance.id", "group.protocol",
                         "group.remote.assignor", "partition.assignment.strategy"})
"""Settings of a consumer's group membership: the consumer ``group_offsets`` reads with
never joins a group, and must not claim the process's static member id."""


class Admin:
    """Topic administration of one cluster.

    Args:
        kafka: the cluster.
        timeout: seconds each request may take.
        overrides: librdkafka settings over ``kafka.config``.
        collect_errors: keep the client's own errors for ``client_errors`` (for a
            short-lived admin that reports why a cluster cannot be reached).

    Raises:
        ConfigError: librdkafka refuses the configuration (names ``kafka.config``).
    """

    def __init__(self, kafka: KafkaSettings, *, timeout: float = 30.0,
                 overrides: Mapping[str, Any] | None = None,
                 collect_errors: bool = False) -> None:
        conf = client_config(kafka, {}, overrides, drop=CONSUMER_ONLY | PRODUCER_ONLY)
        conf["logger"] = CLIENT_LOG
        self._kafka_config = dict(kafka.config)      # whose principal a refusal names
        self._offsets_conf = {**client_config(kafka, {}, overrides,
                                              drop=PRODUCER_ONLY | _MEMBERSHIP),
                              "enable.auto.commit": False, "logger": CLIENT_LOG,
                              # OffsetFetch with RequireStable: an offset an open
                              # transaction commits is never read as the group's.
                              "isolation.level": "read_committed"}
        """A consumer's settings for reading a group's committed offsets (``group_offsets``)."""
        self._group_reader: Callable[[dict[str, Any]], Any] = \
            lambda c: construct("consumer", ck.Consumer, c)
        if collect_errors:
            # Only on request: with an error callback the client queues every error event
            # until something polls, and a long-lived admin (egress's) never polls.
            conf["error_cb"] = self._on_client_error
        self._errors: deque[str] = deque(maxlen=_KEPT_CLIENT_ERRORS)
        self._errors_lock = threading.Lock()
        self._admin: cka.AdminClient = construct("admin", cka.AdminClient, conf)
        self.timeout = timeout

    def _on_client_error(self, err: ck.KafkaError) -> None:
        text = err.str()
        with self._errors_lock:
            if text in self._errors:
                self._errors.remove(text)
            self._errors.append(text)

    def client_errors(self) -> list[str]:
        """The client's own errors so far, oldest first, each once: why a broker could not
        be reached (``host:port/bootstrap: Connect to ... failed: Connection refused``,
        a failed name lookup, TLS handshake or SASL authentication). Empty unless the
        admin was built with ``collect_errors=True``.
        """
        self._admin.poll(0)   # error callbacks are served by poll
        with self._errors_lock:
            return list(self._errors)

    def _metadata(self) -> Any:
        try:
            return self._admin.list_topics(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, "list topics") from e

    def partition_count(self, topic: str) -> int | None:
        """Number of partitions of ``topic``, or ``None`` if it does not exist.

        Asks for the metadata of every topic: a metadata request naming a missing topic
        makes brokers with auto-creation on create it as a side effect (Tansu always;
        Apache Kafka with ``auto.create.topics.enable``, the broker's default, so this is
        needed there too).
        """
        t = self._metadata().topics.get(topic)
        if t is None or (t.error is not None
                         and t.error.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if t.error is not None:
            raise KafkaRetriableError(f"metadata of {topic}: {t.error.str()}")
        return len(t.partitions)

    def list_topics(self) -> list[str]:
        """All topic names."""
        return sorted(self._metadata().topics)

    def topic_partitions(self) -> dict[str, int]:
        """Every topic of the cluster with its partition count, from one metadata request.

        Raises:
            KafkaRetriableError: the cluster did not answer within ``timeout``.
        """
        return {name: len(t.partitions) for name, t in self._metadata().topics.items()
                if t.error is None}

    def partition_replicas(self, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition of ``topic``: (its in-sync replicas, its replicas), from the
        metadata of that topic alone. Empty for a topic the cluster does not have.
        """
        try:
            md = self._admin.list_topics(topic=topic, timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, f"metadata of {topic}") from e
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return {}
        return {p: (len(m.isrs), len(m.replicas)) for p, m in t.partitions.items()}

    def cluster(self) -> ClusterInfo:
        """The cluster's id, controller and brokers (DescribeCluster)."""
        try:
            desc = self._admin.describe_cluster(
                request_timeout=self.timeout).result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, "describe cluster") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"describe cluster: no answer within "
                                      f"{self.timeout:.0f}s") from e
        controller = desc.controller.id if desc.controller is not None else None
        return ClusterInfo(desc.cluster_id, controller,
                           tuple(sorted(n.id for n in desc.nodes or [])))

    # --- what this client's principal may do (ACLs) ----------------------------------------

    @staticmethod
    def _operations(ops: Any) -> frozenset[str] | None:
        if ops is None:
            return None
        return frozenset(str(getattr(o, "name", o)) for o in ops)

    def cluster_operations(self) -> frozenset[str] | None:
        """What the principal may do on the cluster (``IDEMPOTENT_WRITE``, ``CREATE``,
        ...), or ``None`` when the broker does not say.

        Raises:
            KafkaRetriableError / KafkaFatalError: DescribeCluster failed.
        """
        try:
            desc = self._admin.describe_cluster(
                request_timeout=self.timeout,
                include_authorized_operations=True).result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, "describe cluster") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"describe cluster: no answer within "
                                      f"{self.timeout:.0f}s") from e
        return self._operations(desc.authorized_operations)

    def topic_operations(self, topics: Sequence[str]) -> dict[str, frozenset[str] | str | None]:
        """Per topic, what the principal may do on it (``READ``, ``WRITE``, ``DESCRIBE``,
        ...; ``None`` when the broker does not say), or the error that answered instead
        (``TOPIC_AUTHORIZATION_FAILED``: not even ``DESCRIBE``).
        """
        if not topics:
            return {}
        futures = self._admin.describe_topics(
            TopicCollection(list(topics)), request_timeout=self.timeout,
            include_authorized_operations=True)
        out: dict[str, frozenset[str] | str | None] = {}
        for name, f in futures.items():
            try:
                out[name] = self._operations(f.result(timeout=self.timeout).authorized_operations)
            except ck.KafkaException as e:
                err = e.args[0] if e.args else None
                out[name] = f"{err.name()}: {err.str()}" if isinstance(err, ck.KafkaError) \
                    else str(e)
            except TimeoutError:
                out[name] = f"no answer within {self.timeout:.0f}s"
        return out

    def group_operations(self, group: str) -> frozenset[str] | str | None:
        """What the principal may do on consumer group ``group`` (``READ``, ``DESCRIBE``,
        ``DELETE``; ``None`` when the broker does not say), or the error that answered
        instead (``GROUP_AUTHORIZATION_FAILED``).
        """
        # The group's coordinator may still be loading (a fresh cluster creates its
        # offsets topic on the first group request): asked again until ``timeout``.
        deadline = time.monotonic() + self.timeout
        while True:
            f = self._admin.describe_consumer_groups(
                [group], request_timeout=self.timeout, include_authorized_operations=True)[group]
            try:
                return self._operations(f.result(timeout=self.timeout).authorized_operations)
            except ck.KafkaException as e:
                err = e.args[0] if e.args else None
                if not isinstance(err, ck.KafkaError):
                    return str(e)
                if err.code() in _COORDINATOR_WAIT and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                return f"{err.name()}: {err.str()}"
            except TimeoutError:
                return f"no answer within {self.timeout:.0f}s"

    def broker_config(self, broker_id: int) -> dict[str, str]:
        """The effective configs of one broker (empty when the broker describes none, as
        Tansu does).
        """
        res = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
        try:
            entries = self._admin.describe_configs(
                [res], request_timeout=self.timeout)[res].result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, f"describe configs of broker {broker_id}") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"describe configs of broker {broker_id}: no answer "
                                      f"within {self.timeout:.0f}s") from e
        return {k: v.value for k, v in entries.items() if v.value is not None}

    def topic_id(self, topic: str) -> str | None:
        """Kafka's id of ``topic`` (a new one each time the topic is created), or ``None``
        if it does not exist.

        Raises:
            KafkaRetriableError / KafkaFatalError: the describe failed, naming the topic.
        """
        fut = self._admin.describe_topics(TopicCollection([topic]),
                                          request_timeout=self.timeout)[topic]
        try:
            return str(fut.result(timeout=self.timeout).topic_id)
        except ck.KafkaException as e:
            if is_code(e, "UNKNOWN_TOPIC_OR_PART") or is_code(e, "UNKNOWN_TOPIC_ID"):
                return None
            raise translate(e, f"describe topic {topic}") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"describe topic {topic}: no answer within "
                                      f"{self.timeout:.0f}s") from e

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
            if is_code(e, "TOPIC_ALREADY_EXISTS"):
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
        except TimeoutError as e:
            raise KafkaRetriableError(f"describe configs of {topic}: no answer within "
                                      f"{self.timeout:.0f}s") from e
        return {k: v.value for k, v in entries.items()
                if v.value is not None
                and getattr(v.source, "value", v.source) in _TOPIC_LEVEL_SOURCES}

    def effective_topic_config(self, topic: str) -> dict[str, str]:
        """Every config of the topic with the value the broker applies (its own overrides,
        else the broker's and the cluster's defaults).
        """
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            entries = self._admin.describe_configs([res])[res].result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, f"describe configs of {topic}") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"describe configs of {topic}: no answer within "
                                      f"{self.timeout:.0f}s") from e
        return {k: v.value for k, v in entries.items() if v.value is not None}

    def alter_topic_config(self, topic: str, configs: Mapping[str, str]) -> None:
        """Set ``configs`` on the topic (IncrementalAlterConfigs; other configs stay)."""
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in sorted(configs.items())])
        try:
            self._admin.incremental_alter_configs([res])[res].result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, f"alter configs of {topic}") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"alter configs of {topic}: no answer within "
                                      f"{self.timeout:.0f}s") from e

    def delete_topics(self, topics: Sequence[str]) -> None:
        """Delete topics (missing ones are ignored)."""
        if not topics:
            return
        for t, fut in self._admin.delete_topics(list(topics),
                                                operation_timeout=self.timeout).items():
            try:
                fut.result()
            except ck.KafkaException as e:
                if not is_code(e, "UNKNOWN_TOPIC_OR_PART"):
                    raise translate(e, f"delete topic {t}") from e

    # --- offsets -----------------------------------------------------------------------

    def log_start(self, topic: str, partition: int, *, timeout: float) -> Future[int]:
        """Ask for the partition's log start offset (ListOffsets "earliest"), without
        waiting: the answer, or its translated error, arrives on the returned future.

        The request runs on the admin client's own thread with ``timeout`` as its overall
        deadline (leader lookup included). It shares no state with any consumer, so a
        consumer whose partition is stopped in an error state cannot hold it up; the caller
        still bounds its own wait on the future (the client's deadline is not trusted
        alone).
        """
        out: Future[int] = Future()
        what = f"log start of {topic}[{partition}]"
        earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        try:
            futures = self._admin.list_offsets({ck.TopicPartition(topic, partition): earliest},
                                               request_timeout=timeout)
        except (ck.KafkaException, ValueError, TypeError) as e:
            out.set_exception(KafkaRetriableError(f"{what}: {e}"))
            return out

        def done(f: Future[Any]) -> None:
            # On the client's thread: only translate and hand over (the caller may have
            # cancelled ``out`` when it gave up waiting).
            try:
                offset = int(f.result().offset)
                error: ReplicatorError | None = None
                if offset < 0:
                    error = KafkaRetriableError(f"{what}: no offset ({offset})")
            except ck.KafkaException as e:
                error = translate(e, what)
            except Exception as e:  # noqa: BLE001 (a callback must resolve the future whatever)
                error = KafkaRetriableError(f"{what}: {e}")
            with contextlib.suppress(InvalidStateError):
                if error is None:
                    out.set_result(offset)
                else:
                    out.set_exception(error)

        for f in futures.values():
            f.add_done_callback(done)
        return out

    def log_ends(self, partitions: Sequence[tuple[str, int]], *, timeout: float
                 ) -> dict[tuple[str, int], int]:
        """The end of each partition's log as a ``read_committed`` consumer sees it (the
        last stable offset: ListOffsets "latest"), in one request per leader.

        Brokers whose ListOffsets "latest" is wrong (Tansu answers the last batch's base
        offset + 1) give an offset at or below the end, never above it.

        Raises:
            KafkaRetriableError / ReplicatorError: no answer in ``timeout`` seconds or a
                refusal, naming the partition.
        """
        if not partitions:
            return {}
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        try:
            futures = self._admin.list_offsets(
                {ck.TopicPartition(t, p): latest for t, p in partitions},
                isolation_level=ck.IsolationLevel.READ_COMMITTED, request_timeout=timeout)
        except (ck.KafkaException, ValueError, TypeError) as e:
            raise KafkaRetriableError(f"end offsets of {len(partitions)} partition(s): {e}"
                                      ) from e
        ends: dict[tuple[str, int], int] = {}
        for tp, f in futures.items():
            what = f"end offset of {tp.topic}[{tp.partition}]"
            try:
                offset = int(f.result(timeout=timeout + 5).offset)
            except ck.KafkaException as e:
                raise translate(e, what) from e
            except TimeoutError:
                raise KafkaRetriableError(f"{what}: no answer in {timeout:.0f} s") from None
            if offset < 0:
                raise KafkaRetriableError(f"{what}: no offset ({offset})")
            ends[(tp.topic, tp.partition)] = offset
        return ends

    # --- consumer groups ---------------------------------------------------------------

    def list_groups(self) -> list[str]:
        """Ids of the cluster's consumer groups (classic protocol and KIP-848 alike)."""
        try:
            result = self._admin.list_consumer_groups(
                request_timeout=self.timeout).result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, "list consumer groups") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"list consumer groups: no answer within "
                                      f"{self.timeout:.0f}s") from e
        return sorted(g.group_id for g in result.valid)

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """The committed offsets of ``group``: ``(topic, partition) -> offset`` (the next
        record the group would read). Partitions without a commit are absent.

        Read by a consumer of the group that never joins it (no subscription; its
        ``committed``), not by the admin API's ListConsumerGroupOffsets: librdkafka handles
        a coordinator that moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE: a broker
        restarting, a new cluster's offsets topic being created) in that API by
        dereferencing the consumer-group handle an admin client does not have, and the
        process dies of a segmentation fault. The consumer's group handle asks for the
        new coordinator and retries instead. Asked for every partition of every topic but
        the cluster's internal ones (one OffsetFetch request).
        """
        md = self._metadata().topics
        partitions = [CkTopicPartition(name, p) for name, t in sorted(md.items())
                      if t.error is None and not name.startswith("__")
                      for p in sorted(t.partitions)]
        if not partitions:
            return {}
        consumer = self._group_reader({**self._offsets_conf, "group.id": group})
        try:
            result = consumer.committed(partitions, timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, f"committed offsets of group {group!r}") from e
        finally:
            consumer.close()
        out: dict[tuple[str, int], int] = {}
        for tp in result:
            if tp.error is not None:
                # Never a partial answer: a partition left out would read as "no commit".
                raise classify(tp.error, f"committed offset of group {group!r} "
                                         f"{tp.topic}[{tp.partition}]")
            if tp.offset >= 0:
                out[(tp.topic, tp.partition)] = tp.offset
        return out

    def group_members(self, group: str) -> int:
        """Members of ``group`` now (0: nobody consumes with this group id)."""
        fut = self._admin.describe_consumer_groups([group], request_timeout=self.timeout)[group]
        try:
            return len(fut.result(timeout=self.timeout).members or [])
        except ck.KafkaException as e:
            raise translate(e, f"describe group {group!r}") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"describe group {group!r}: no answer within "
                                      f"{self.timeout:.0f}s") from e

    def group_coordinator(self, group: str) -> int | None:
        """The node coordinating ``group`` if it answers a DescribeGroups now; ``None``
        when no coordinator answered (moving, loading, unreachable) within ``timeout``.
        """
        fut = self._admin.describe_consumer_groups([group], request_timeout=self.timeout)[group]
        try:
            return int(fut.result(timeout=self.timeout).coordinator.id)
        except (ck.KafkaException, TimeoutError):
            return None

    def alter_group_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set ``group``'s committed offsets (the broker refuses while it has members).

        Raises:
            KafkaRetriableError / KafkaFatalError: the broker refused, naming the group.
        """
        deadline = time.monotonic() + self.timeout
        delay = 0.2
        while True:
            try:
                return self._alter_group_offsets(group, offsets)
            except KafkaRetriableError:
                # A coordinator still loading after a broker start, or moving: the same
                # request again, within this call's timeout.
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def _alter_group_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]
                             ) -> None:
        request = ConsumerGroupTopicPartitions(group, [
            CkTopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())])
        fut = self._admin.alter_consumer_group_offsets(
            [request], request_timeout=self.timeout)[group]
        try:
            result = fut.result(timeout=self.timeout)
        except ck.KafkaException as e:
            raise translate(e, f"alter offsets of group {group!r}") from e
        except TimeoutError as e:
            raise KafkaRetriableError(f"alter offsets of group {group!r}: no answer within "
                                      f"{self.timeout:.0f}s") from e
        for tp in result.topic_partitions or []:
            if tp.error is not None:
                what = f"alter offset of group {group!r} {tp.topic}[{tp.partition}]"
                if tp.error.code() in _COMMIT_AUTHZ:
                    # An offset commit asks Read on the group and on the topic.
                    grant = (f"Read on Topic:{tp.topic}" if tp.error.code()
                             == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
                             else f"Read on Group:{group}")
                    raise KafkaFatalError(
                        f"{what}: {client_principal(self._kafka_config)} is not authorized "
                        f"({tp.error.name()}): grant it {grant} (docs/security.md, "
                        "Operators)")
                raise classify(tp.error, what)
