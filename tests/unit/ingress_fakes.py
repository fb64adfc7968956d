"""A fake librdkafka producer under the real Kafka seam (``replicator.core.kafka.Producer``),
for the ingress delivery tests: the seam's own callbacks, counters and failure routing run
as in production; the broker is a list whose answers the test chooses.

``FakeClient`` keeps librdkafka's contract that matters here: records of one partition
are answered in the order they were produced, each answer reaches its record's callback
(or the producer-wide one) only when a thread polls, ``purge`` turns queued records into
``_PURGE_QUEUE`` failures reported at the next poll, and a full local queue raises
``BufferError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
import pytest

from replicator.core.kafka import Producer
from replicator.core.kafka import producer as seam
from replicator.core.settings import KafkaSettings

Callback = Callable[[ck.KafkaError | None, Any], None]


class Msg:
    """What a delivery callback receives (the fields the seam reads)."""

    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None,
                 key: bytes | None = None) -> None:
        self._t, self._p, self._o, self.value_, self.key_ = topic, partition, offset, value, key

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


class Queued:
    """A record in the client: sent to the broker, answered, or reported."""

    def __init__(self, topic: str, partition: int, value: bytes | None,
                 key: bytes | None, cb: Callback) -> None:
        self.topic, self.partition, self.value, self.key, self.cb = (topic, partition, value,
                                                                     key, cb)


class FakeClient:
    """Stands in for ``confluent_kafka.Producer`` inside the seam.

    Args:
        default_cb: the producer-wide delivery callback (the seam's ``_delivered``).
        auto: every poll first answers every queued record (a healthy broker).
        capacity: records the local queue holds (``BufferError`` beyond).
    """

    def __init__(self, default_cb: Callback, *, auto: bool = True,
                 capacity: int | None = None) -> None:
        self.default_cb = default_cb
        self.auto = auto
        self.capacity = capacity
        self.queued: list[Queued] = []
        self.reports: list[tuple[Queued, ck.KafkaError | None]] = []
        self.log: list[Queued] = []
        """Every record the broker appended, in order."""
        self.fail: Callable[[Queued], ck.KafkaError | None] = lambda q: None
        """Decides each record's answer: ``None`` appends it, an error refuses it."""
        self.offsets: dict[tuple[str, int], int] = {}
        self.lock = threading.RLock()
        self.on_poll: Callable[[], None] = lambda: None

    # confluent_kafka.Producer.produce(topic, value, key, partition, on_delivery,
    # callback, timestamp, headers)
    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = -1, on_delivery: Callback | None = None,
                callback: Callback | None = None, timestamp: int = 0,
                headers: Any = None) -> None:
        with self.lock:
            if self.capacity is not None and len(self) >= self.capacity:
                raise BufferError("Local: Queue full")
            cb = on_delivery or callback or self.default_cb
            self.queued.append(Queued(topic, max(partition, 0), value, key, cb))

    def answer(self, n: int | None = None) -> None:
        """The broker answers the first ``n`` queued records (all by default)."""
        with self.lock:
            n = len(self.queued) if n is None else n
            for q in self.queued[:n]:
                err = self.fail(q)
                if err is None:
                    self.log.append(q)
                self.reports.append((q, err))
            del self.queued[:n]

    def poll(self, timeout: float = 0.0) -> int:
        self.on_poll()
        with self.lock:
            if self.auto:
                self.answer()
            served, self.reports = self.reports, []
        for q, err in served:
            tp = (q.topic, q.partition)
            offset = -1
            if err is None:
                offset = self.offsets.get(tp, 0)
                self.offsets[tp] = offset + 1
            q.cb(err, Msg(q.topic, q.partition, offset, q.value, q.key))
        if not served and timeout:
            time.sleep(min(timeout, 0.01))
        return len(served)

    def flush(self, timeout: float = 0.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            self.poll(0.0)
            if not len(self) or time.monotonic() >= deadline:
                return len(self)
            time.sleep(0.005)

    def purge(self, in_queue: bool = True, in_flight: bool = False,
              blocking: bool = True) -> None:
        with self.lock:
            err = ck.KafkaError(ck.KafkaError._PURGE_QUEUE, "Local: Purged in queue")
            self.reports += [(q, err) for q in self.queued]
            self.queued = []

    def __len__(self) -> int:
        with self.lock:
            return len(self.queued) + len(self.reports)


def seam_over_fake(*, auto: bool = True, capacity: int | None = None,
                   **kw: Any) -> tuple[Producer, FakeClient]:
    """``fake_producer`` without pytest's monkeypatch (stateful tests build producers
    between steps): the seam's client factory is swapped for the construction only.
    """
    made: list[FakeClient] = []

    def construct(kind: str, factory: Any, conf: dict[str, Any]) -> FakeClient:
        made.append(FakeClient(conf["on_delivery"], auto=auto, capacity=capacity))
        return made[-1]

    real = seam.construct  # type: ignore[attr-defined]
    seam.construct = construct  # type: ignore[attr-defined,assignment]
    try:
        p = Producer(KafkaSettings(brokers="fake:1"), **kw)
    finally:
        seam.construct = real  # type: ignore[attr-defined]
    return p, made[0]


def fake_producer(monkeypatch: pytest.MonkeyPatch, *, auto: bool = True,
                  capacity: int | None = None, **kw: Any) -> tuple[Producer, FakeClient]:
    """A seam ``Producer`` (``kw``: its arguments) over a ``FakeClient``."""
    made: list[FakeClient] = []

    def construct(kind: str, factory: Any, conf: dict[str, Any]) -> FakeClient:
        c = FakeClient(conf["on_delivery"], auto=auto, capacity=capacity)
        made.append(c)
        return c

    monkeypatch.setattr(seam, "construct", construct)
    p = Producer(KafkaSettings(brokers="fake:1"), **kw)
    return p, made[0]


def too_large() -> ck.KafkaError:
    """What a destination with a smaller ``max.message.bytes`` answers."""
    return ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
