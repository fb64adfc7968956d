"""The Kafka seam without a broker: error translation, event sorting, delivery reports.

These tests build the client's own error values (``KafkaError``): the seam is the one place
allowed to look at them, and these rules are what every service relies on.
"""

from __future__ import annotations

import sys
from typing import Any

import confluent_kafka as ck
import pytest

from replicator.core.errors import (
    ConfigError,
    GenerationFenced,
    KafkaFatalError,
    KafkaRetriableError,
    ProducerFenced,
    RecordRefused,
    TransactionAbortable,
)
from replicator.core.kafka import GroupMetadata, Producer, TopicPartition, group_generation
from replicator.core.kafka.consumer import _sort
from replicator.core.kafka.errors import (
    classify,
    delivery_error,
    event_error,
    translate,
    translate_offsets_error,
)
from replicator.core.kafka.types import Fetched, from_client, to_client
from replicator.core.settings import KafkaSettings

KAFKA = KafkaSettings(brokers="127.0.0.1:1")


@pytest.mark.parametrize("code", [ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED,
                                  ck.KafkaError.INVALID_PRODUCER_EPOCH])
def test_fenced_codes_are_producer_fenced(code: int) -> None:
    # Fenced wins even over the abortable flag: a fenced producer must not abort.
    err = classify(ck.KafkaError(code, "fenced", txn_requires_abort=True), "commit t[0]")
    assert isinstance(err, ProducerFenced)
    assert "commit t[0]" in str(err)


def test_abortable_retriable_fatal() -> None:
    abortable = classify(ck.KafkaError(ck.KafkaError._STATE, "x", txn_requires_abort=True),
                         "commit")
    assert isinstance(abortable, TransactionAbortable)
    assert isinstance(abortable, KafkaRetriableError)   # callers that only retry still do
    retriable = classify(ck.KafkaError(ck.KafkaError._TRANSPORT, "x", retriable=True), "c")
    assert type(retriable) is KafkaRetriableError
    fatal = classify(ck.KafkaError(ck.KafkaError._FATAL, "x", fatal=True), "c")
    assert type(fatal) is KafkaFatalError


@pytest.mark.parametrize("code", [ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                  ck.KafkaError.COORDINATOR_NOT_AVAILABLE,
                                  ck.KafkaError.NOT_COORDINATOR,
                                  ck.KafkaError.UNSTABLE_OFFSET_COMMIT])
def test_a_coordinator_not_ready_is_retriable_without_the_clients_flag(code: int) -> None:
    """Admin results carry these per partition without ``retriable``: a group's offsets
    altered right after a broker start must be retried, not refused."""
    assert isinstance(classify(ck.KafkaError(code), "alter offset of group 'g' t[0]"),
                      KafkaRetriableError)


def test_delivery_errors() -> None:
    assert isinstance(delivery_error(ck.KafkaError(ck.KafkaError._FENCED), "w"),
                      ProducerFenced)
    assert type(delivery_error(ck.KafkaError(ck.KafkaError._FATAL, fatal=True), "w")) \
        is KafkaFatalError
    assert type(delivery_error(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT), "w")) \
        is KafkaRetriableError


def test_a_session_timeout_the_broker_refuses_is_a_config_error() -> None:
    """Apache Kafka refuses a group member whose session.timeout.ms lies outside its
    group.min/max.session.timeout.ms; the consumer would retry the join forever."""
    err = event_error(ck.KafkaError(ck.KafkaError.INVALID_SESSION_TIMEOUT, "JoinGroup failed"),
                      "t[0]")
    assert isinstance(err, ConfigError) and err.key == "kafka.config"
    assert "session.timeout.ms" in str(err)


class Event:
    """A consumed event with the client's accessors."""

    def __init__(self, topic: str, partition: int, offset: int,
                 error: ck.KafkaError | None = None) -> None:
        self._t, self._p, self._o, self._e = topic, partition, offset, error

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> ck.KafkaError | None:
        return self._e


def test_fetch_sorts_records_errors_and_ends_in_one_pass() -> None:
    events: list[Any] = [
        Event("a", 0, 5), Event("b", 1, 7), Event("a", 0, 6),
        Event("a", 1, 3, ck.KafkaError(ck.KafkaError._PARTITION_EOF)),
        Event("b", 1, -1, ck.KafkaError(ck.KafkaError._TRANSPORT, "down", retriable=True)),
        Event("b", 1, 8),
    ]
    f = _sort(events, Fetched())
    assert {k: [m.offset() for m in run] for k, run in f.runs.items()} == {
        ("a", 0): [5, 6], ("b", 1): [7, 8]}
    assert f.ends == {("a", 1): 3}
    assert len(f.errors) == 1 and isinstance(f.errors[0], KafkaRetriableError)
    assert "b[1]" in str(f.errors[0])
    assert f.records == 4 and f
    assert not Fetched()


def test_an_out_of_range_position_is_sorted_out_with_the_position() -> None:
    # auto.offset.reset=error: the position left the log (retention deleted records under
    # it); not an error of the call, the caller decides (egress reports the lost range).
    events: list[Any] = [Event("a", 0, 51, ck.KafkaError(
        ck.KafkaError._AUTO_OFFSET_RESET, "fetch failed: Broker: Offset out of range"))]
    f = _sort(events, Fetched())
    assert f.out_of_range == {("a", 0): 51} and f.errors == [] and f


def test_topic_partitions_round_trip_through_the_client() -> None:
    tp = TopicPartition("t", 3, 42)
    assert from_client(to_client(tp)) == tp
    assert str(tp) == "t[3]" and tp.key == ("t", 3)


class Delivered:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._t, self._p, self._o = topic, partition, offset

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return b"k"

    def value(self) -> bytes | None:
        return b"v%d" % self._p


def test_delivery_failures_are_kept_per_partition_and_raised_as_one_error() -> None:
    p = Producer(KAFKA, name="dest[0]")
    p._delivered(None, Delivered("dest", 0, 1))  # type: ignore[arg-type]
    p._delivered(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT, "timed out"),
                 Delivered("dest", 0, -1))  # type: ignore[arg-type]
    p._delivered(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT, "timed out"),
                 Delivered("cp", 2, -1))  # type: ignore[arg-type]
    cp = p.take_failures("cp", 2)
    assert [(r.topic, r.partition, r.offset) for r in cp] == [("cp", 2, -1)]
    assert isinstance(cp[0].error, KafkaRetriableError) and "timed out" in cp[0].reason
    with pytest.raises(KafkaRetriableError, match=r"dest\[0\]: 1 record\(s\) failed"):
        p.check_deliveries("dest[0]")
    p.check_deliveries("dest[0]")  # reported once


def test_delivery_listener_sees_successes_and_failures() -> None:
    seen: list[tuple[int, int, bool]] = []
    p = Producer(KAFKA, on_delivery=lambda r: seen.append((r.partition, r.offset,
                                                            r.error is None)))
    p._delivered(None, Delivered("t", 1, 10))  # type: ignore[arg-type]
    p._delivered(ck.KafkaError(ck.KafkaError._FENCED), Delivered("t", 1, -1))  # type: ignore[arg-type]
    assert seen == [(1, 10, True), (1, -1, False)]
    with pytest.raises(ProducerFenced):
        p.check_deliveries("t[1]")


class FencedWhileFlushing:
    """What confluent-kafka does on a fatal error during ``flush``: its KafkaException is
    left pending while a delivery callback runs, whose first call into the Message fails."""

    def flush(self, timeout: float) -> int:
        try:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError._FENCED, "fenced", fatal=True))
        except ck.KafkaException:
            raise SystemError("<method 'topic' of 'confluent_kafka.cimpl.Message' objects> "
                              "returned a result with an exception set") from None


def test_a_producer_fenced_during_flush_is_producer_fenced() -> None:
    p = Producer(KAFKA, transactional_id="tx", name="restore into t[0]")
    p._p = FencedWhileFlushing()  # type: ignore[assignment]
    with pytest.raises(ProducerFenced, match=r"flush of restore into t\[0\]"):
        p.flush(1)


def test_cooperative_assignment_is_recognised_from_kafka_config() -> None:
    """Ingress adds partitions with incremental_assign under cooperative-sticky (assign
    fails there with _STATE), with assign under the eager default."""
    from replicator.core.kafka import Consumer

    def cooperative(config: dict[str, Any]) -> bool:
        c = Consumer(KafkaSettings(brokers="127.0.0.1:1", config=config), "g")
        try:
            return c.cooperative
        finally:
            c.close()

    assert not cooperative({})
    assert cooperative({"partition.assignment.strategy": "cooperative-sticky"})
    assert not cooperative({"partition.assignment.strategy": "roundrobin"})


@pytest.mark.parametrize("code", [ck.KafkaError.ILLEGAL_GENERATION,
                                  ck.KafkaError.UNKNOWN_MEMBER_ID,
                                  ck.KafkaError.FENCED_INSTANCE_ID,
                                  ck.KafkaError.REBALANCE_IN_PROGRESS])
def test_a_refused_generation_is_generation_fenced_only_for_transactional_offsets(
        code: int) -> None:
    e = ck.KafkaException(ck.KafkaError(code, "refused", txn_requires_abort=True))
    err = translate_offsets_error(e, "send offsets")
    assert isinstance(err, GenerationFenced) and isinstance(err, TransactionAbortable)
    # Elsewhere (a consumer's own commit) the same codes keep their old classification.
    assert not isinstance(translate(e, "commit"), GenerationFenced)
    fenced = ck.KafkaException(ck.KafkaError(ck.KafkaError._FENCED, "f"))
    assert isinstance(translate_offsets_error(fenced, "send offsets"), ProducerFenced)


def test_group_generation_reads_librdkafkas_serialized_metadata() -> None:
    meta = ck.Consumer({"group.id": "grp", "bootstrap.servers": "127.0.0.1:1",
                        "log_level": 0}).consumer_group_metadata()
    assert group_generation(GroupMetadata(meta)) == (-1, "")     # never joined
    joined = GroupMetadata(b"CGMDv2:" + (7).to_bytes(4, sys.byteorder, signed=True)
                           + b"grp\0member-1\0\x01")
    assert group_generation(joined) == (7, "member-1")
    with pytest.raises(KafkaFatalError):
        group_generation(GroupMetadata(b"something else"))


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value


def _partition(topic: str, partition: int, offset: int, error: ck.KafkaError | None = None
               ) -> Any:
    from types import SimpleNamespace
    return SimpleNamespace(topic=topic, partition=partition, offset=offset, error=error)


class _GroupsClient:
    """The admin client's group calls: answers given per call."""

    def __init__(self, answers: list[list[Any]]) -> None:
        self.answers = answers
        self.calls = 0
        self.readers_closed = 0

    def _answer(self, group: str) -> dict[str, _Done]:
        from types import SimpleNamespace
        self.calls += 1
        return {group: _Done(SimpleNamespace(topic_partitions=self.answers.pop(0)))}

    def list_topics(self, **_: Any) -> Any:
        from types import SimpleNamespace
        return SimpleNamespace(topics={
            "t": SimpleNamespace(error=None, partitions={0: None, 1: None}),
            "__consumer_offsets": SimpleNamespace(error=None, partitions={0: None})})

    def reader(self, conf: dict[str, Any]) -> Any:
        """The consumer ``group_offsets`` reads with: never joins (no subscribe)."""
        client = self
        assert conf["group.id"] == "g" and not conf["enable.auto.commit"]

        class Reader:
            closed = False

            def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
                assert [(p.topic, p.partition) for p in partitions] == [("t", 0), ("t", 1)]
                client.calls += 1
                return client.answers.pop(0)

            def close(self) -> None:
                client.readers_closed += 1

        return Reader()

    def alter_consumer_group_offsets(self, requests: list[Any], **_: Any) -> dict[str, _Done]:
        return self._answer(requests[0].group_id)


def _admin_with(answers: list[list[Any]]) -> tuple[Any, _GroupsClient]:
    from replicator.core.kafka import Admin

    admin = Admin(KAFKA, timeout=5)
    client = _GroupsClient(answers)
    admin._admin = client  # type: ignore[assignment]
    admin._group_reader = client.reader
    return admin, client


def test_group_offsets_never_answers_with_a_partition_left_out() -> None:
    """A partition whose committed offset could not be read (an open transaction's offsets,
    a coordinator loading) fails the read: left out, it would be exported as "no commit".
    The read goes through a consumer of the group (the admin API's OffsetFetch crashes the
    process when the coordinator moved), for every partition but internal topics'."""
    unstable = ck.KafkaError(ck.KafkaError.UNSTABLE_OFFSET_COMMIT)
    admin, client = _admin_with([[_partition("t", 0, 7), _partition("t", 1, -1001, unstable)],
                                 [_partition("t", 0, 7), _partition("t", 1, -1001)]])
    with pytest.raises(KafkaRetriableError, match=r"t\[1\]"):
        admin.group_offsets("g")
    assert admin.group_offsets("g") == {("t", 0): 7}   # no commit for t[1]: absent
    assert client.readers_closed == 2                  # never left open, error or not


def test_altering_offsets_retries_a_coordinator_that_is_still_loading() -> None:
    loading = ck.KafkaError(ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    admin, client = _admin_with([[_partition("t", 0, 4, loading)],
                                 [_partition("t", 0, 4, loading)],
                                 [_partition("t", 0, 4)]])
    admin.alter_group_offsets("g", {("t", 0): 4})
    assert client.calls == 3
    refused = ck.KafkaError(ck.KafkaError.GROUP_AUTHORIZATION_FAILED)
    admin, client = _admin_with([[_partition("t", 0, 4, refused)]])
    with pytest.raises(KafkaFatalError, match=r"GROUP_AUTHORIZATION|[Aa]uthoriz"):
        admin.alter_group_offsets("g", {("t", 0): 4})
    assert client.calls == 1


def test_a_calls_failures_go_to_its_own_listener_not_to_the_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Several writers share one partition of a producer: ``on_failure`` takes the failed
    records of its ``produce_many`` call (middle and ends), and the partition-wide
    collection keeps only the others'."""
    from tests.unit.ingress_fakes import fake_producer, too_large

    p, client = fake_producer(monkeypatch, track_acks=True)
    client.fail = lambda q: too_large() if q.value == b"x" else None
    mine: list[int] = []
    p.produce_many("t", 0, [1] * 4, [None] * 4, [b"x", b"x", b"v", b"x"], [None] * 4,
                   [0, 1, 2, 3], on_failure=lambda r: mine.append(r.partition))
    p.produce_many("t", 0, [1] * 2, [None] * 2, [b"v", b"x"], [None] * 2, [4, 5])
    p.poll()
    assert mine == [0, 0, 0]
    assert len(p.take_failures("t", 0)) == 1
    assert p.done("t", 0) == 6


def test_a_record_the_client_refuses_is_refused_with_what_was_enqueued_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A record above the client's own ``message.max.bytes`` (librdkafka refuses it when
    enqueued) is a ``RecordRefused`` saying how many records of the call went before it,
    not a ``KafkaFatalError``: its partition stops at it, the client is fine."""
    from tests.unit.ingress_fakes import FakeClient, fake_producer

    class LocalSizeClient(FakeClient):
        def produce(self, topic: str, value: bytes | None = None, *a: Any, **kw: Any) -> None:
            if value is not None and len(value) > 100:
                raise ck.KafkaException(ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE,
                                                      "Unable to produce message"))
            super().produce(topic, value, *a, **kw)

    import tests.unit.ingress_fakes as fakes
    monkeypatch.setattr(fakes, "FakeClient", LocalSizeClient)
    for track, big in ((False, 2), (True, 0), (True, 2), (True, 4)):
        p, c = fake_producer(monkeypatch, track_acks=track)
        values = [b"v"] * 5
        values[big] = b"x" * 200
        with pytest.raises(RecordRefused) as e:
            p.produce_many("t", 0, [1] * 5, [b"k"] * 5, values, [None] * 5, [10, 11, 12, 13, 14])
        assert e.value.enqueued == big and len(c.queued) + len(c.log) == big
        assert f"@{10 + big}" in str(e.value)


@pytest.mark.parametrize("code", [ck.KafkaError.LEADER_NOT_AVAILABLE,
                                  ck.KafkaError.NOT_LEADER_FOR_PARTITION,
                                  ck.KafkaError.UNKNOWN_LEADER_EPOCH,
                                  ck.KafkaError.FENCED_LEADER_EPOCH,
                                  ck.KafkaError.OFFSET_NOT_AVAILABLE])
def test_a_partition_whose_leadership_moves_is_retried_not_fatal(code: int) -> None:
    """Per-partition errors carry no retriable flag; a leader moving is transient."""
    from replicator.core.kafka.errors import classify
    assert isinstance(classify(ck.KafkaError(code), "end offsets of t[0]"),
                      KafkaRetriableError)
