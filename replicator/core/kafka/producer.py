"""The ``Producer`` wrapper: one librdkafka producer with its sharp edges handled once.

* A full local queue (``BufferError``) is waited out by serving delivery callbacks, then the
  record is produced again: callers never see it.
* Failed deliveries are collected per ``(topic, partition)`` and surfaced as one typed error
  (``check_deliveries``) or as reports (``take_failures``); successful ones reach an
  ``on_delivery`` listener when one is given.
* Transactions are explicit steps (``init_transactions``, ``begin_transaction``, produce,
  ``send_offsets_to_transaction``, ``commit_transaction`` / ``abort_transaction``), each
  translating the client's errors: ``ProducerFenced``, ``TransactionAbortable`` (abort,
  then redo the batch), ``KafkaRetriableError``, ``KafkaFatalError``.

One producer may serve many partitions and topics in one transaction; delivery failures
name their partition.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import length_hint
from typing import Any, NewType, cast

import confluent_kafka as ck

from replicator.core.errors import KafkaFatalError, RecordRefused, ReplicatorError
from replicator.core.kafka.auth import client_principal
from replicator.core.kafka.config import (
    CLIENT_LOG,
    CONSUMER_ONLY,
    PRODUCER_DEFAULTS,
    client_config,
)
from replicator.core.kafka.errors import (
    client_error,
    construct,
    delivery_error,
    produce_error,
    translate,
    translate_offsets_error,
)
from replicator.core.kafka.types import DeliveryReport, Headers, TopicPartition, to_client
from replicator.core.settings import KafkaSettings

_ClientHeaders = list[tuple[str, str | bytes | None]]

QUEUE_FULL_WAIT = 0.05
"""Seconds of serving delivery callbacks before producing again into a full local queue."""

GroupMetadata = NewType("GroupMetadata", object)
"""A consumer's group metadata (``Consumer.group_metadata``), for
``send_offsets_to_transaction``."""


def _failure(topic: str, partition: int, err: ck.KafkaError, msg: ck.Message
             ) -> DeliveryReport:
    """The report of a failed record (with its key and value, which name it in its call)."""
    return DeliveryReport(topic, partition, -1, delivery_error(err, f"{topic}[{partition}]"),
                          err.str(), msg.key(), msg.value())


class Producer:
    """An idempotent producer (``acks=all``); transactional when given ``transactional_id``.

    Args:
        kafka: the cluster.
        transactional_id: makes the producer transactional; a newer producer with the same
            id fences this one.
        overrides: librdkafka settings over ``kafka.config``.
        name: how error messages name what this producer writes (default: its id).
        on_delivery: called (on the thread that polls) with every delivery report; without
            it only failures are reported, and collected for ``check_deliveries``.
        track_acks: count, per ``(topic, partition)``, the records whose delivery ended
            (acknowledged or failed): ``done``. Several writers share one producer and
            each needs its own partition's count (at-least-once ingress). A batch of
            ``produce_many`` is counted when its last record's report comes (one callback
            per batch, not per record).
        report_successes: successful deliveries are reported too, so per-record listeners
            (``produce(on_delivery=...)``, ``produce_many(on_ends=...)``) learn offsets.

    Raises:
        ConfigError: librdkafka refuses the configuration (names ``kafka.config``).
    """

    def __init__(self, kafka: KafkaSettings, *, transactional_id: str | None = None,
                 overrides: Mapping[str, Any] | None = None, name: str | None = None,
                 on_delivery: Callable[[DeliveryReport], None] | None = None,
                 track_acks: bool = False, report_successes: bool = False) -> None:
        extra: dict[str, Any] = dict(overrides or {})
        if transactional_id is not None:
            extra["transactional.id"] = transactional_id
        if on_delivery is None and not track_acks and not report_successes:
            # Successful deliveries raise no callback at all: nothing to do per record.
            extra.setdefault("delivery.report.only.error", True)
        extra["on_delivery"] = self._delivered
        extra["logger"] = CLIENT_LOG
        self.transactional_id = transactional_id
        self.name = name or transactional_id or "producer"
        self._principal = client_principal(kafka.config)
        self._listener = on_delivery
        self._failed: list[tuple[str, int, ck.KafkaError, ck.Message]] = []
        self._track = track_acks
        self._done: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._produce_lock = threading.RLock()
        self._purged = False
        conf = client_config(kafka, PRODUCER_DEFAULTS, extra, drop=CONSUMER_ONLY)
        self._p: ck.Producer = construct("producer", ck.Producer, conf)

    @property
    def transactional(self) -> bool:
        """True when the producer has a ``transactional.id``."""
        return self.transactional_id is not None

    # --- delivery reports ---------------------------------------------------------------

    def _delivered(self, err: ck.KafkaError | None, msg: ck.Message) -> None:
        """The producer-wide delivery callback: failures are collected; a success goes to
        the producer-wide listener, or nowhere: most records of a batch have no callback of
        their own, and their successes are dropped here before any other work.
        """
        if err is None and self._listener is None:
            return
        topic, partition = msg.topic() or "", msg.partition()
        p = -1 if partition is None else partition
        if err is not None:
            with self._lock:
                self._failed.append((topic, p, err, msg))
        if self._listener is not None:
            offset = msg.offset()
            self._listener(DeliveryReport(
                topic, p, -1 if err is not None or offset is None else offset,
                None if err is None else delivery_error(err, f"{topic}[{p}]"),
                "" if err is None else err.str()))

    def check_deliveries(self, where: str) -> None:
        """Raise the first failed delivery since the last check, as one typed error.

        Raises:
            ProducerFenced: the producer was fenced.
            KafkaFatalError: the client failed for good.
            KafkaRetriableError: records were not delivered (redo them).
        """
        with self._lock:
            failed, self._failed = self._failed, []
        if failed:
            raise delivery_error(failed[0][2], f"{where}: {len(failed)} record(s) failed")

    def done(self, topic: str, partition: int) -> int:
        """Records of ``topic[partition]`` whose delivery ended, acknowledged or failed
        (``track_acks``; served by ``poll``/``outstanding``/``flush``).
        """
        with self._lock:
            return self._done.get((topic, partition), 0)

    def take_failures(self, topic: str | None = None,
                      partition: int | None = None) -> list[DeliveryReport]:
        """Failed deliveries since the last check (of one topic/partition if given)."""
        with self._lock:
            keep: list[tuple[str, int, ck.KafkaError, ck.Message]] = []
            out: list[tuple[str, int, ck.KafkaError, ck.Message]] = []
            for t, p, err, msg in self._failed:
                mine = topic in (None, t) and partition in (None, p)
                (out if mine else keep).append((t, p, err, msg))
            self._failed = keep
        return [_failure(t, p, err, msg) for t, p, err, msg in out]

    # --- producing ----------------------------------------------------------------------

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None, *,
                partition: int | None = None, timestamp: int = 0,
                headers: Headers | None = None,
                on_delivery: Callable[[DeliveryReport], None] | None = None) -> None:
        """Enqueue one record (waiting while the local queue is full).

        ``partition`` ``None`` lets the partitioner choose; ``timestamp`` ``0`` lets the
        client stamp the current time. ``on_delivery`` is called with this record's report
        on the thread that polls (a success only reaches it when the producer reports
        successes: ``track_acks`` or a producer-wide ``on_delivery``).

        Raises:
            KafkaRetriableError / KafkaFatalError: the client refused the record.
        """
        one = None
        if on_delivery is not None or self._track:
            one = self._one(on_delivery, 1 if self._track else 0)
        self._produce(topic, value, key, -1 if partition is None else partition, timestamp,
                      headers, one)

    def _produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                 timestamp: int, headers: Headers | None,
                 on_delivery: Callable[[ck.KafkaError | None, ck.Message], None] | None,
                 what: str | None = None) -> None:
        """One record with the client's own callback (``None``: the producer-wide one);
        ``what`` names it in an error.
        """
        p = self._p
        kw: dict[str, Any] = {} if on_delivery is None else {"on_delivery": on_delivery}
        with self._produce_lock:
            while True:
                self._check_open(topic)
                try:
                    p.produce(topic, value, key, partition, timestamp=timestamp,
                              headers=cast("_ClientHeaders", headers), **kw)
                    return
                except BufferError:
                    self._serve(p.poll, QUEUE_FULL_WAIT, "poll")
                except ck.KafkaException as e:
                    raise self._refusal(e, what or f"produce to {topic}", 0) from e

    def _refusal(self, e: ck.KafkaException, what: str, enqueued: int) -> ReplicatorError:
        """``produce_error`` for a record the client refused; once the client has failed for
        good it refuses every record with a bare "fatal error" (``_FATAL``), and the error
        raised is then the one that made it fail (fenced by a newer producer: the caller
        stops its session, not its process).
        """
        err = client_error(e)
        if err is not None and err.code() == ck.KafkaError._FATAL:
            cause = self._fatal_cause()
            if cause is not None:
                return translate(cause, what)
        return produce_error(e, what, enqueued)

    def _fatal_cause(self) -> ck.KafkaException | None:
        """The error that made the client fail for good. confluent-kafka raises it once,
        from the next ``poll`` (the fatal error's callback); a transactional client also
        names it on every later transaction call, so a cause another thread's ``poll``
        already took is still found.
        """
        try:
            self._p.poll(0)
        except ck.KafkaException as e:
            return e
        except SystemError as e:        # see ``flush``
            if isinstance(e.__context__, ck.KafkaException):
                return e.__context__
            raise
        if self.transactional:
            try:
                self._p.begin_transaction()
            except ck.KafkaException as e:
                return e
        return None

    def _one(self, listener: Callable[[DeliveryReport], None] | None, count: int,
             on_failure: Callable[[DeliveryReport], None] | None = None
             ) -> Callable[[ck.KafkaError | None, ck.Message], None]:
        """A per-record delivery callback: the producer's own bookkeeping (a failure goes
        to ``on_failure`` instead when given), ``count`` more records of the partition
        ended (``track_acks``), then ``listener``.
        """
        def delivered(err: ck.KafkaError | None, msg: ck.Message) -> None:
            topic, partition = msg.topic() or "", msg.partition()
            p = -1 if partition is None else partition
            if err is not None and on_failure is not None:
                on_failure(_failure(topic, p, err, msg))
            else:
                self._delivered(err, msg)
            if count:
                with self._lock:
                    self._done[(topic, p)] = self._done.get((topic, p), 0) + count
            if listener is not None:
                offset = msg.offset()
                listener(DeliveryReport(
                    topic, p, -1 if err is not None or offset is None else offset,
                    None if err is None else delivery_error(err, f"{topic}[{p}]"),
                    "" if err is None else err.str()))
        return delivered

    def _check_open(self, topic: str) -> None:
        if self._purged:
            raise KafkaFatalError(f"produce to {topic} on {self.name}: the producer was "
                                  "purged")

    def produce_many(self, topic: str, partition: int, timestamps: Sequence[int],
                     keys: Sequence[bytes | None], values: Sequence[bytes | None],
                     headers: Sequence[Headers | None], ids: Sequence[int], *,
                     on_ends: Callable[[int, DeliveryReport], None] | None = None,
                     on_failure: Callable[[DeliveryReport], None] | None = None) -> None:
        """Enqueue records column by column to one partition, then serve callbacks once.

        The hot path of a replay: one client call per record and nothing else. ``ids``
        name the records in an error (``topic[partition]@id``: the source offsets).
        ``on_ends`` is called with ``(0, report)`` for the first record and ``(n - 1,
        report)`` for the last (successes need ``report_successes``): where the batch
        landed, at the cost of two callbacks, not one per record. ``on_failure`` is
        called with each failed record of this call, which is then kept out of
        ``check_deliveries`` / ``take_failures``: several writers share a partition of
        one producer, and a failure belongs to the writer of its call, not to the
        partition (each record of the call has its own callback then).

        Raises:
            RecordRefused: the client refused a record larger than its own
                ``message.max.bytes``; ``enqueued`` records of the call went before it
                (callers isolate such records first: ``ingress.limits``).
            KafkaRetriableError / KafkaFatalError: the client refused a record.
        """
        n = len(ids)
        if not len(timestamps) == len(keys) == len(values) == len(headers) == n:
            raise ValueError(f"produce to {topic}[{partition}]: columns of different lengths")
        # With ``track_acks`` the last record's report counts the whole batch: one
        # partition's records are reported in the order they were produced (idempotent
        # producer), so when it comes every record before it has ended too.
        tally = n if self._track else 0
        mid_cb = None if on_failure is None else self._failures_to(on_failure)
        if n and (on_ends is not None or tally):
            # The ends with their own callbacks, the middle on the plain hot path.
            def end(i: int, count: int) -> None:
                listener = None if on_ends is None else (lambda report: on_ends(i, report))
                self._produce(topic, values[i], keys[i], partition, timestamps[i],
                              headers[i], self._one(listener, count, on_failure),
                              f"produce to {topic}[{partition}]@{ids[i]}")

            with self._produce_lock:    # the batch stays contiguous in the partition
                lo = 0
                try:
                    if on_ends is not None and n > 1:
                        end(0, 0)
                        lo = 1
                    if n - 1 > lo:
                        mid = slice(lo, n - 1)
                        self._produce_run(topic, partition, timestamps[mid], keys[mid],
                                          values[mid], headers[mid], ids[mid], mid_cb)
                        lo = n - 1
                    end(n - 1, tally)
                except RecordRefused as e:
                    e.enqueued = lo + (e.enqueued or 0)
                    raise
            return
        self._produce_run(topic, partition, timestamps, keys, values, headers, ids, mid_cb)

    def _failures_to(self, on_failure: Callable[[DeliveryReport], None]
                     ) -> Callable[[ck.KafkaError | None, ck.Message], None]:
        """The callback of a call's middle records: failures go to ``on_failure``; a
        success costs what the producer-wide callback's does (returns at once).
        """
        def delivered(err: ck.KafkaError | None, msg: ck.Message) -> None:
            if err is None:
                return
            topic, partition = msg.topic() or "", msg.partition()
            on_failure(_failure(topic, -1 if partition is None else partition, err, msg))
        return delivered

    def _produce_run(self, topic: str, partition: int, timestamps: Sequence[int],
                     keys: Sequence[bytes | None], values: Sequence[bytes | None],
                     headers: Sequence[Headers | None], ids: Sequence[int],
                     on_delivery: Callable[[ck.KafkaError | None, ck.Message], None] | None
                     = None) -> None:
        """Records with one callback (default: the producer-wide one): one client call
        each, no more.
        """
        n = len(ids)
        p = self._p
        # The loop runs in C: ``map`` calls the client's ``produce`` with positional
        # arguments (no keyword dict per record; the first callback slot holds
        # ``on_delivery``, ``None`` for the producer-wide one, the second ``None``) and
        # ``deque(maxlen=0)`` drains it. A record the client
        # refuses stops the drain; the values iterator's remaining length names it, and
        # the same ``map`` then goes on after it.
        produce = cast("Callable[..., None]", p.produce)
        values_it = iter(values)
        args: list[Iterable[Any]] = [repeat(topic, n), values_it, keys, repeat(partition, n),
                                     repeat(on_delivery, n), repeat(None, n), timestamps]
        if headers.count(None) != n:
            args.append(headers)        # without headers the argument is left out
        run = map(produce, *args)
        # One lock per batch, not per record: ``purge`` waits for the batch's enqueue (a
        # full queue is waited out in ``produce``, which sees the purge and raises).
        with self._produce_lock:
            self._check_open(topic)
            while True:
                try:
                    deque(run, maxlen=0)
                    break
                except BufferError:
                    i = n - length_hint(values_it) - 1
                    self._serve(p.poll, QUEUE_FULL_WAIT, "poll")
                    try:
                        self._produce(topic, values[i], keys[i], partition, timestamps[i],
                                      headers[i], on_delivery)
                    except RecordRefused as e:
                        e.enqueued = i
                        raise
                except ck.KafkaException as e:
                    i = n - length_hint(values_it) - 1
                    raise self._refusal(e, f"produce to {topic}[{partition}]@{ids[i]}",
                                        i) from e
        self._serve(p.poll, 0, "poll")

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks for up to ``timeout`` seconds; returns how many ran.

        Raises:
            ProducerFenced / KafkaFatalError: the client failed for good (reported once,
                by the first call that serves callbacks afterwards).
        """
        return self._serve(self._p.poll, timeout, "poll")

    def outstanding(self, timeout: float = 0.0) -> int:
        """Records not yet acknowledged, after serving callbacks for up to ``timeout``
        (returning early once one arrives).
        """
        self._serve(self._p.poll, timeout, "poll")
        return len(self._p)

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every record; returns how many are left.

        Raises:
            ProducerFenced / KafkaFatalError: the client failed for good while waiting
                (a transactional producer fenced by a newer one).
        """
        return self._serve(self._p.flush, timeout, "flush")

    def _serve(self, call: Callable[[float], int], timeout: float, what: str) -> int:
        """``poll`` or ``flush`` of the client, its fatal error (raised once, by the call
        that serves its callback) translated.
        """
        try:
            return call(timeout)
        except ck.KafkaException as e:
            raise translate(e, f"{what} of {self.name}") from e
        except SystemError as e:
            # After a fatal error (fenced) confluent-kafka leaves its KafkaException pending
            # and still serves delivery callbacks; the first call into a Message there fails
            # with SystemError, whose context is the real error.
            if isinstance(e.__context__, ck.KafkaException):
                raise translate(e.__context__, f"{what} of {self.name}") from e.__context__
            raise

    def purge(self, *, in_flight: bool = False) -> None:
        """Refuse every later ``produce`` (``KafkaFatalError``) and drop every record still
        queued in the client (never sent); with ``in_flight`` also stop waiting for
        requests already sent (the broker may still append those). Any thread; a batch
        being enqueued by another thread finishes enqueueing first, then is dropped too.
        """
        self._purged = True                 # a produce waiting on a full queue gives up
        with self._produce_lock:
            self._p.purge(in_queue=True, in_flight=in_flight, blocking=False)
        self._p.poll(0)

    # --- transactions -------------------------------------------------------------------

    def init_transactions(self, timeout: float) -> None:
        """Register the ``transactional.id``: fences older producers with the same id and
        aborts their open transaction.

        Raises:
            ProducerFenced / KafkaRetriableError / KafkaFatalError.
        """
        try:
            self._p.init_transactions(timeout)
        except ck.KafkaException as e:
            raise translate(e, f"init transactions of {self.transactional_id}") from e

    def begin_transaction(self) -> None:
        """Start a transaction.

        Raises:
            ProducerFenced / KafkaFatalError.
        """
        try:
            self._p.begin_transaction()
        except ck.KafkaException as e:
            raise translate(e, f"begin transaction on {self.name}") from e

    def send_offsets_to_transaction(self, offsets: Sequence[TopicPartition],
                                    group: GroupMetadata, timeout: float) -> None:
        """Commit consumer ``offsets`` of ``group`` as part of the open transaction.

        This is where a transaction is fenced by the group's generation (KIP-447): the group
        coordinator refuses the offsets of a member that is no longer in the group's
        current generation.

        Raises:
            GenerationFenced: the coordinator refused the member's generation (abort).
            ProducerFenced / TransactionAbortable / KafkaRetriableError / KafkaFatalError.
        """
        try:
            self._p.send_offsets_to_transaction([to_client(tp) for tp in offsets], group,
                                                timeout)
        except ck.KafkaException as e:
            raise translate_offsets_error(
                e, f"send offsets to the transaction on {self.name}",
                principal=self._principal, topics=sorted({tp.topic for tp in offsets}),
                group=str(getattr(group, "group_id", "") or "")) from e

    def commit_transaction(self, timeout: float) -> None:
        """Commit the open transaction: everything produced in it becomes visible.

        Raises:
            ProducerFenced: a newer owner fenced this producer (do not abort).
            TransactionAbortable: ``abort_transaction``, then redo the batch.
            KafkaRetriableError / KafkaFatalError.
        """
        try:
            self._p.commit_transaction(timeout)
        except ck.KafkaException as e:
            raise translate(e, f"commit transaction on {self.name}") from e

    def abort_transaction(self, timeout: float) -> None:
        """Abort the open transaction; failed deliveries of its records are forgotten.

        Raises:
            ProducerFenced / KafkaRetriableError / KafkaFatalError.
        """
        try:
            self._p.abort_transaction(timeout)
        except ck.KafkaException as e:
            raise translate(e, f"abort transaction on {self.name}") from e
        finally:
            with self._lock:
                self._failed.clear()
