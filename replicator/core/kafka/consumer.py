"""The ``Consumer`` wrapper: one librdkafka consumer, typed, with errors translated.

* ``fetch``/``poll`` sort the client's events in one pass into records per partition, error
  events (translated) and end-of-partition events (``Fetched``).
* Rebalance callbacks are typed (``RebalanceCallback``: this wrapper and our
  ``TopicPartition`` values); eager (``assign``/``unassign``) and incremental
  (``incremental_assign``/``incremental_unassign``) assignment are both available.
* ``commit`` is synchronous and reports per-partition failures; ``seek``, ``pause``,
  ``resume``, ``committed``, ``position`` and ``watermarks`` raise translated errors.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import confluent_kafka as ck

from replicator.core.errors import KafkaFatalError, KafkaRetriableError, ReplicatorError
from replicator.core.kafka.auth import client_principal
from replicator.core.kafka.config import (
    CLIENT_LOG,
    CONSUMER_DEFAULTS,
    PRODUCER_ONLY,
    client_config,
)
from replicator.core.kafka.errors import (
    classify,
    construct,
    event_error,
    is_end_event,
    is_out_of_range_event,
    translate,
)
from replicator.core.kafka.producer import GroupMetadata
from replicator.core.kafka.types import (
    OFFSET_BEGINNING,
    Fetched,
    TopicPartition,
    from_client,
    to_client,
)
from replicator.core.settings import KafkaSettings

RebalanceCallback = Callable[["Consumer", list[TopicPartition]], None]
"""``(consumer, partitions)``: called on the thread that polls, during ``fetch``/``poll``."""


def _clients(tps: Sequence[TopicPartition]) -> list[ck.TopicPartition]:
    return [to_client(tp) for tp in tps]


def _sort(events: Sequence[ck.Message], out: Fetched, who: tuple[str, str] = ("", "")
          ) -> Fetched:
    # The per-record cost of this loop is the egress poll loop's: two accessor calls.
    runs: dict[Any, list[Any]] = out.runs
    for m in events:
        err = m.error()
        if err is not None:
            topic, partition = m.topic() or "", m.partition()
            p = -1 if partition is None else partition
            if is_end_event(err):
                offset = m.offset()
                out.ends[(topic, p)] = -1 if offset is None else offset
            elif is_out_of_range_event(err) and p >= 0:
                offset = m.offset()
                out.out_of_range[(topic, p)] = -1 if offset is None else offset
            else:
                out.errors.append(event_error(err, f"{topic}[{p}]", principal=who[0],
                                              group=who[1], topic=topic))
            continue
        k = (m.topic(), m.partition())
        run = runs.get(k)
        if run is None:
            runs[k] = [m]
        else:
            run.append(m)
    return out


_CGMD_MAGIC = b"CGMDv2:"


def group_generation(meta: GroupMetadata) -> tuple[int, str]:
    """``(generation id, member id)`` carried by a consumer's group metadata.

    librdkafka hands the metadata out serialized (``rd_kafka_consumer_group_metadata_write``):
    ``"CGMDv2:"``, the generation id (int32, host byte order), the group id and the member
    id (each NUL-terminated), then the group instance id. A generation below 0 or an empty
    member id means the member is in no generation; a transactional offset commit with such
    metadata is not checked against the group by the broker (it is accepted for old
    clients), so the caller must refuse it itself.

    Raises:
        KafkaFatalError: the metadata is not in that format (a client this code does not
            know).
    """
    raw = meta if isinstance(meta, bytes) else b""
    if not raw.startswith(_CGMD_MAGIC) or len(raw) < len(_CGMD_MAGIC) + 4:
        raise KafkaFatalError("consumer group metadata in an unknown format")
    at = len(_CGMD_MAGIC)
    (generation,) = struct.unpack_from("=i", raw, at)
    parts = raw[at + 4:].split(b"\0", 2)
    if len(parts) < 3:
        raise KafkaFatalError("consumer group metadata in an unknown format")
    return generation, parts[1].decode(errors="replace")


def group_id_of(meta: GroupMetadata) -> str:
    """The group id carried by a consumer's group metadata (format: ``group_generation``).

    Raises:
        KafkaFatalError: the metadata is not in that format.
    """
    raw = meta if isinstance(meta, bytes) else b""
    if not raw.startswith(_CGMD_MAGIC) or len(raw) < len(_CGMD_MAGIC) + 4:
        raise KafkaFatalError("consumer group metadata in an unknown format")
    parts = raw[len(_CGMD_MAGIC) + 4:].split(b"\0", 2)
    if len(parts) < 3:
        raise KafkaFatalError("consumer group metadata in an unknown format")
    return parts[0].decode(errors="replace")


class Consumer:
    """A consumer with our defaults: manual commits, ``read_committed``, earliest.

    Args:
        kafka: the cluster.
        group_id: the consumer group (also for consumers that only ``assign``).
        overrides: librdkafka settings over the defaults and ``kafka.config``.

    Raises:
        ConfigError: librdkafka refuses the configuration (names ``kafka.config``).
    """

    def __init__(self, kafka: KafkaSettings, group_id: str,
                 overrides: Mapping[str, Any] | None = None) -> None:
        conf = client_config(kafka, {**CONSUMER_DEFAULTS, "group.id": group_id}, overrides,
                             drop=PRODUCER_ONLY)
        conf["logger"] = CLIENT_LOG
        self.group_id = group_id
        self._who = (client_principal(kafka.config), group_id)   # named by a missing ACL
        # cooperative-sticky rebalances incrementally: an on_assign callback gets only the
        # added partitions, and ``assign`` fails there with _STATE.
        self.cooperative = "cooperative" in str(conf.get("partition.assignment.strategy", ""))
        self._c: ck.Consumer = construct("consumer", ck.Consumer, conf)

    # --- membership ---------------------------------------------------------------------

    def subscribe(self, topics: Sequence[str], *, on_assign: RebalanceCallback | None = None,
                  on_revoke: RebalanceCallback | None = None,
                  on_lost: RebalanceCallback | None = None) -> None:
        """Join the group for ``topics``; the callbacks run inside ``fetch``/``poll``."""
        def bind(cb: RebalanceCallback) -> Callable[[ck.Consumer, list[ck.TopicPartition]],
                                                     None]:
            return lambda _c, parts: cb(self, [from_client(tp) for tp in parts])

        kw: dict[str, Any] = {}
        if on_assign is not None:
            kw["on_assign"] = bind(on_assign)
        if on_revoke is not None:
            kw["on_revoke"] = bind(on_revoke)
        if on_lost is not None:
            kw["on_lost"] = bind(on_lost)
        try:
            self._c.subscribe(list(topics), **kw)
        except ck.KafkaException as e:
            raise translate(e, f"subscribe to {', '.join(topics)}") from e

    def unsubscribe(self) -> None:
        """Leave the group's subscription."""
        try:
            self._c.unsubscribe()
        except ck.KafkaException as e:
            raise translate(e, "unsubscribe") from e

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Replace the assignment (eager; also for consumers outside a group)."""
        try:
            self._c.assign(_clients(partitions))
        except ck.KafkaException as e:
            raise translate(e, "assign") from e

    def unassign(self) -> None:
        """Drop the whole assignment."""
        try:
            self._c.unassign()
        except ck.KafkaException as e:
            raise translate(e, "unassign") from e

    def assign_added(self, partitions: Sequence[TopicPartition]) -> None:
        """Take ``partitions`` from inside an ``on_assign`` callback, for either protocol:
        added to the assignment when cooperative, replacing it when eager.
        """
        if self.cooperative:
            self.incremental_assign(partitions)
        else:
            self.assign(partitions)

    def incremental_assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Add partitions to the assignment (cooperative rebalancing)."""
        try:
            self._c.incremental_assign(_clients(partitions))
        except ck.KafkaException as e:
            raise translate(e, "incremental assign") from e

    def incremental_unassign(self, partitions: Sequence[TopicPartition]) -> None:
        """Remove partitions from the assignment (cooperative rebalancing)."""
        try:
            self._c.incremental_unassign(_clients(partitions))
        except ck.KafkaException as e:
            raise translate(e, "incremental unassign") from e

    def assignment(self) -> list[TopicPartition]:
        """The partitions currently assigned."""
        try:
            return [from_client(tp) for tp in self._c.assignment()]
        except ck.KafkaException as e:
            raise translate(e, "assignment") from e

    def group_metadata(self) -> GroupMetadata:
        """This member's group metadata (for ``Producer.send_offsets_to_transaction``)."""
        try:
            return GroupMetadata(self._c.consumer_group_metadata())
        except ck.KafkaException as e:
            raise translate(e, "consumer group metadata") from e

    def generation(self) -> tuple[int, str]:
        """``(generation id, member id)`` of this member now; ``(-1, "")`` outside any
        generation (before the first join, after leaving or being removed).
        """
        return group_generation(self.group_metadata())

    # --- reading ------------------------------------------------------------------------

    def fetch(self, max_messages: int, timeout: float) -> Fetched:
        """Up to ``max_messages`` events within ``timeout`` seconds (serves callbacks).

        Raises:
            KafkaFatalError / KafkaRetriableError: the call itself failed.
        """
        try:
            events = self._c.consume(num_messages=max_messages, timeout=timeout)
        except ck.KafkaException as e:
            raise translate(e, "consume") from e
        return _sort(events, Fetched(), self._who)

    def poll(self, timeout: float) -> Fetched:
        """At most one event within ``timeout`` seconds (serves callbacks)."""
        try:
            m = self._c.poll(timeout)
        except ck.KafkaException as e:
            raise translate(e, "poll") from e
        return _sort(() if m is None else (m,), Fetched(), self._who)

    def partitions_of(self, topic: str, timeout: float) -> list[int]:
        """The partitions of ``topic`` from a metadata request (``[]`` if it has none).

        A metadata request naming a missing topic makes brokers with topic auto-creation
        create it; ask only for topics that should exist.
        """
        try:
            md = self._c.list_topics(topic, timeout=timeout)
        except ck.KafkaException as e:
            raise translate(e, f"metadata of {topic}") from e
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return []
        return sorted(t.partitions)

    def assign_from_beginning(self, topic: str, partitions: Sequence[int]) -> None:
        """Assign ``partitions`` of ``topic``, each from its oldest record."""
        self.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])

    # --- positions ----------------------------------------------------------------------

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        """Stop fetching ``partitions`` (kept across a reassignment: resume first)."""
        try:
            self._c.pause(_clients(partitions))
        except ck.KafkaException as e:
            raise translate(e, "pause") from e

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        """Fetch ``partitions`` again."""
        try:
            self._c.resume(_clients(partitions))
        except ck.KafkaException as e:
            raise translate(e, "resume") from e

    def seek(self, partition: TopicPartition) -> None:
        """Read ``partition`` from its ``offset`` next."""
        try:
            self._c.seek(to_client(partition))
        except ck.KafkaException as e:
            raise translate(e, f"seek {partition} to {partition.offset}") from e

    def restart(self, partition: TopicPartition, others: Sequence[TopicPartition]) -> None:
        """Fetch ``partition`` again, from its ``offset``, after the client stopped it (a
        position out of range with ``auto.offset.reset=error``; ``seek`` is refused then).

        Cooperative: the partition alone is unassigned and assigned again. Eager: the
        client only takes a whole assignment, so ``others`` (every other assigned
        partition, each at the offset to read next) are assigned again with it; their
        prefetched records are fetched again.
        """
        try:
            if self.cooperative:
                self._c.incremental_unassign([to_client(partition)])
                self._c.incremental_assign([to_client(partition)])
            else:
                self._c.assign(_clients([partition, *others]))
        except ck.KafkaException as e:
            raise translate(e, f"restart {partition} at {partition.offset}") from e

    def commit(self, offsets: Sequence[TopicPartition]) -> dict[tuple[str, int],
                                                                 ReplicatorError]:
        """Commit ``offsets`` (the next offset to read) synchronously.

        Returns:
            The partitions the broker refused, each with its translated error.

        Raises:
            KafkaRetriableError / KafkaFatalError: the request as a whole failed.
        """
        what = ", ".join(f"{tp}@{tp.offset}" for tp in offsets)
        try:
            results = self._c.commit(offsets=_clients(offsets), asynchronous=False) or []
        except ck.KafkaException as e:
            raise translate(e, f"commit {what}") from e
        return {(r.topic, r.partition): classify(r.error, f"commit {r.topic}[{r.partition}]"
                                                         f"@{r.offset}")
                for r in results if r.error is not None}

    def committed(self, partitions: Sequence[TopicPartition], timeout: float
                  ) -> list[TopicPartition]:
        """The group's committed offsets (``OFFSET_INVALID`` where there is none)."""
        try:
            return [from_client(tp) for tp in self._c.committed(_clients(partitions),
                                                                timeout=timeout)]
        except ck.KafkaException as e:
            raise translate(e, "read committed offsets at assignment") from e

    def offsets_for_times(self, partitions: Sequence[TopicPartition], timeout: float
                          ) -> list[TopicPartition]:
        """For each partition (its ``offset`` a timestamp in milliseconds), the offset of
        its first record at or after that time (``OFFSET_END``, -1, when there is none).
        """
        try:
            return [from_client(tp) for tp in self._c.offsets_for_times(_clients(partitions),
                                                                        timeout=timeout)]
        except ck.KafkaException as e:
            raise translate(e, "offsets for times") from e

    def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """The next offset this consumer reads of each partition."""
        try:
            return [from_client(tp) for tp in self._c.position(_clients(partitions))]
        except ck.KafkaException as e:
            raise translate(e, "position") from e

    def watermarks(self, partition: TopicPartition, *, cached: bool = False,
                   timeout: float = 10.0) -> tuple[int, int]:
        """``(low, high)`` offsets of a partition.

        ``cached`` reads what the last fetch response said, without a request (right even
        on brokers whose ListOffsets "latest" is not, such as Tansu); ``-1001`` means
        unknown.
        """
        try:
            if cached:
                marks = self._c.get_watermark_offsets(to_client(partition), cached=True)
            else:
                marks = self._c.get_watermark_offsets(to_client(partition), timeout=timeout,
                                                      cached=False)
        except ck.KafkaException as e:
            raise translate(e, f"watermarks of {partition}") from e
        if marks is None:  # the client's answer to a timeout
            raise KafkaRetriableError(f"watermarks of {partition}: no answer in time")
        return int(marks[0]), int(marks[1])

    def close(self) -> None:
        """Leave the group (revoking the assignment) and release the client."""
        try:
            self._c.close()
        except ck.KafkaException as e:
            raise translate(e, "close consumer") from e
