"""The ``SegmentEvents`` seam: the segment-events topic, written by the SQS relay and read
by every ingress instance in full (no shared group), so an event received by one instance
reaches the worker wherever it runs, and events survive rebalances and restarts.
"""

from __future__ import annotations

import logging
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence

from ingress.events import SegmentEvent, decode_event, encode_event
from ingress.metrics import IngressMetrics
from replicator.core.errors import KafkaRetriableError, TopicError
from replicator.core.kafka import Consumer, Producer
from replicator.core.settings import KafkaSettings

log = logging.getLogger(__name__)


class SegmentEvents(ABC):
    """Publish segment events durably; read all of them back."""

    @abstractmethod
    def publish(self, events: Sequence[SegmentEvent]) -> None:
        """Write events and wait until every one is acknowledged.

        Raises:
            KafkaRetriableError: some event was not acknowledged (publish again).
        """

    @abstractmethod
    def poll(self, timeout: float) -> list[SegmentEvent]:
        """Events read since the last call (from the beginning of the topic at first)."""

    @abstractmethod
    def close(self) -> None:
        """Release clients; idempotent."""


class MemorySegmentEvents(SegmentEvents):
    """A list with a read cursor (unit tests)."""

    def __init__(self) -> None:
        self.log: list[SegmentEvent] = []
        self._read = 0
        self.fail_publish = 0
        self._lock = threading.Lock()

    def publish(self, events: Sequence[SegmentEvent]) -> None:
        if self.fail_publish > 0:
            self.fail_publish -= 1
            raise KafkaRetriableError("injected publish failure")
        with self._lock:
            self.log.extend(events)

    def poll(self, timeout: float) -> list[SegmentEvent]:
        with self._lock:
            out = self.log[self._read:]
            self._read = len(self.log)
        return out

    def close(self) -> None:
        return


class KafkaSegmentEvents(SegmentEvents):
    """The segment-events topic on the destination cluster.

    The producer is idempotent (``acks=all``); ``publish`` flushes and checks delivery
    reports. The reader is a per-process consumer assigned to every partition from the
    beginning (the topic's retention bounds what it replays); it never commits.
    """

    def __init__(self, kafka_settings: KafkaSettings, topic: str, metrics: IngressMetrics, *,
                 timeout: float = 30.0) -> None:
        self.kafka_settings = kafka_settings
        self.topic = topic
        self.metrics = metrics
        self.timeout = timeout
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None

    def publish(self, events: Sequence[SegmentEvent]) -> None:
        if not events:
            return
        if self._producer is None:
            self._producer = Producer(self.kafka_settings, overrides={"linger.ms": 5},
                                      name=self.topic)
        p = self._producer
        for ev in events:
            key, value = encode_event(ev)
            p.produce(self.topic, value, key)
        left = p.flush(self.timeout)
        failed = p.take_failures()
        if left or failed:
            detail = failed[0].reason if failed else f"{left} not acknowledged in time"
            raise KafkaRetriableError(f"publish {len(events)} segment event(s) to "
                                      f"{self.topic}: {detail}")

    def start_reader(self) -> None:
        """Assign every partition of the topic from the beginning.

        Raises:
            TopicError: the topic does not exist.
        """
        c = Consumer(self.kafka_settings,
                     f"replicator.segment-events-reader.{uuid.uuid4().hex}",
                     # Bounds how long a new event waits in a broker-side fetch.
                     {"enable.partition.eof": False, "fetch.wait.max.ms": 100})
        parts = c.partitions_of(self.topic, timeout=self.timeout)
        if not parts:
            c.close()
            raise TopicError(f"segment events topic {self.topic} is missing")
        c.assign_from_beginning(self.topic, parts)
        self._consumer = c
        log.info("reading segment events from %s (%d partition(s)) from the beginning",
                 self.topic, len(parts))

    def poll(self, timeout: float) -> list[SegmentEvent]:
        if self._consumer is None:
            self.start_reader()
        assert self._consumer is not None
        fetched = self._consumer.fetch(1000, timeout)
        for err in fetched.errors:
            log.warning("reading segment events: %s", err)
        out: list[SegmentEvent] = []
        for run in fetched.runs.values():
            for msg in run:
                try:
                    out.append(decode_event(msg.value()))
                except ValueError as e:
                    log.error("invalid segment event at %s[%s]@%s ignored: %s", msg.topic(),
                              msg.partition(), msg.offset(), e)
                    self.metrics.events_invalid.inc()
        self.metrics.events_read.inc(len(out))
        return out

    def close(self) -> None:
        c, self._consumer = self._consumer, None
        if c is not None:
            c.close()
        p, self._producer = self._producer, None
        if p is not None:
            p.flush(5.0)
