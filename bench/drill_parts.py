"""The moving parts of ``failover_drill.py``: bucket replication at a stated delay, a
producer that logs every acknowledged record, a source consumer group that commits as it
reads, and the reads of the destination the drill's figures come from.

Applications here use confluent-kafka directly: they stand for the users' producers and
consumers, not for the replicator's code.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replicator.core.errors import ObjectNotFound
from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectStore
from replicator.ops.sync import is_replicated_key

log = logging.getLogger(__name__)

QUIET = {"log_level": 2, "log.connection.close": False}
"""librdkafka logs only critical events: after the kill every client would log each
refused reconnection to the dead broker."""


class DelayedReplication:
    """Stands in for S3 replication between the two regions' buckets.

    Lists the source bucket every ``poll`` seconds; each object S3 replication copies
    (segments, ``_topic.json``, group exports, heartbeats: ``replicator.ops.sync``) is
    copied to the destination bucket ``delay`` seconds after this copier first saw it (so
    up to ``delay + poll`` after it was written), oldest first. A rewritten object
    (``_topic.json``, a group export) is copied once per version, each ``delay`` after that
    version appeared. The destination bucket's notifications turn each PUT into the S3
    event ingress reads from its queue, as a replica written by S3 replication does.

    With egress's ``[egress.mirror]`` on (``failover_drill.py --mirror``), each segment
    reaches the destination bucket twice: egress's own copy at once, and this copier's
    ``delay`` later (S3 replication kept as the backstop, writing the same key and bytes
    once more: a second S3 event for the same segment).

    ``halt()`` is the region going down with its bucket: nothing pending is copied.
    ``drain()`` is the bucket surviving (or coming back): everything it holds is copied now.
    """

    def __init__(self, source: ObjectStore, destination: ObjectStore, prefix: str,
                 delay: float, poll: float = 0.2) -> None:
        self.source = source
        self.destination = destination
        self.prefix = prefix
        self.delays = (delay,)
        self.poll = poll
        # (key, etag, copy number) -> (when to copy, the version's bytes). A rewritten
        # object's bytes are read when the version is first seen (S3 replicates each version of a
        # versioned bucket: a later rewrite does not hold back the earlier version's copy);
        # a segment's (never rewritten) when it is copied.
        self.due: dict[tuple[str, str, int], tuple[float, bytes | None]] = {}
        self.seen: set[tuple[str, str]] = set()
        self.late: list[float] = []
        """Per object copied on schedule: seconds past its due time (a loaded machine)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="replication")

    def start(self) -> DelayedReplication:
        self._thread.start()
        return self

    def halt(self) -> None:
        """Stop copying (what is pending stays in the source bucket)."""
        self._stop.set()
        self._thread.join(30)

    def drain(self) -> list[str]:
        """Copy everything the source bucket holds and the destination lacks, at once;
        return the keys copied (those whose copy was pending when the copier halted)."""
        self._scan(time.monotonic())
        keys = [item[0] for item in self._in_order(float("inf"))
                if self._copy(item) and item[2] == 0]
        self.due.clear()
        return keys

    def _in_order(self, now: float) -> list[tuple[str, str, int]]:
        return sorted((i for i, (t, _) in self.due.items() if t <= now),
                      key=lambda i: self.due[i][0])

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                self._scan(now)
                for item in self._in_order(now):
                    if self._stop.is_set():
                        return
                    self._copy(item)
                    self.late.append(time.monotonic() - self.due.pop(item)[0])
            except Exception as e:  # noqa: BLE001 - the moto server went away at the end
                log.warning("replication pass failed: %s", e)
            self._stop.wait(self.poll)

    def _scan(self, now: float) -> None:
        for info in self.source.list(self.prefix + "/"):
            item = (info.key, info.etag)
            if item in self.seen or not is_replicated_key(info.key, self.prefix):
                continue
            self.seen.add(item)
            data = None
            if SegmentKey.try_parse(info.key) is None:
                try:
                    data, etag = self.source.get_with_etag(info.key)
                except ObjectNotFound:
                    continue
                self.seen.add((info.key, etag))
            for n, delay in enumerate(self.delays):
                self.due[(*item, n)] = (now + delay, data)

    def _copy(self, item: tuple[str, str, int]) -> bool:
        """Copy one version; False when a segment went since it was listed."""
        data = self.due[item][1]
        if data is None:
            try:
                data = self.source.get(item[0])
            except ObjectNotFound:
                return False
        self.destination.put(item[0], data)
        return True


@dataclass
class Acked:
    """One record the source cluster acknowledged."""

    partition: int
    offset: int
    produced_at: float
    acked_at: float


@dataclass
class AckedProducer:
    """Produces keyed records (key = a sequence number) at ``rate`` records per second
    round-robin over ``partitions`` with ``acks=all`` and idempotence, and logs every
    record whose delivery the broker acknowledged, with the times."""

    brokers: str
    topic: str
    partitions: int
    rate: float
    value_size: int = 200
    acked: dict[int, Acked] = field(default_factory=dict)
    produced: int = 0
    failed: int = 0

    def __post_init__(self) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({"bootstrap.servers": self.brokers, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "message.timeout.ms": 15000, **QUIET})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="producer")
        self._sent_at: dict[int, float] = {}

    def start(self) -> AckedProducer:
        self._thread.start()
        return self

    def stop(self, serve_seconds: float = 1.0) -> None:
        """Stop producing; serve the delivery reports already received for a moment (the
        broker is dead: nothing more can be acknowledged)."""
        self._stop.set()
        self._thread.join(10)
        deadline = time.monotonic() + serve_seconds
        while time.monotonic() < deadline:
            self._producer.poll(0.05)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        seq = int(msg.key())
        if err is not None:
            self.failed += 1
            return
        self.acked[seq] = Acked(msg.partition(), msg.offset(), self._sent_at[seq],
                                time.time())

    def _run(self) -> None:
        value = (b"x" * self.value_size)
        t0 = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            while self.produced < due and not self._stop.is_set():
                seq = self.produced
                self._sent_at[seq] = time.time()
                try:
                    self._producer.produce(self.topic, value, b"%012d" % seq,
                                           partition=seq % self.partitions,
                                           on_delivery=self._on_delivery)
                except BufferError:
                    break
                self.produced += 1
            self._producer.poll(0)
            self._stop.wait(0.01)


class SourceApp:
    """A consumer group of the source cluster: reads the topic and commits its position
    every ``commit_every`` seconds (what egress exports)."""

    def __init__(self, brokers: str, topic: str, group: str, commit_every: float = 1.0) -> None:
        from confluent_kafka import Consumer

        self.group = group
        self._consumer = Consumer({"bootstrap.servers": brokers, "group.id": group,
                                   "auto.offset.reset": "earliest",
                                   "enable.auto.commit": False, **QUIET})
        self._consumer.subscribe([topic])
        self.commit_every = commit_every
        self.commits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="source-app")

    def start(self) -> SourceApp:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            self._consumer.consume(500, 0.1)
            if time.monotonic() - last >= self.commit_every:
                last = time.monotonic()
                try:
                    self._consumer.commit(asynchronous=False)
                    self.commits += 1
                except Exception:  # noqa: BLE001 - nothing consumed yet, or the broker died
                    pass


def read_all(brokers: str, topic: str, partitions: int, timeout: float = 60
             ) -> list[tuple[int, int, int]]:
    """Every record of ``topic`` (read_committed) as (partition, offset, key as int)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": brokers, "group.id": "drill-reader",
                  "enable.auto.commit": False, "isolation.level": "read_committed", **QUIET})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), 60)[1]
                for p in range(partitions)}
        # read_committed stops at the last stable offset; with no open transaction (ingress
        # idle after catch-up) that is the high watermark, whose last position may be a
        # commit marker: stop at the end or when a partition has nothing more to give.
        c.assign([TopicPartition(topic, p, 0) for p in ends if ends[p] > 0])
        out: list[tuple[int, int, int]] = []
        position = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + timeout
        idle = 0
        while any(position[p] < ends[p] - 1 for p in ends) and time.monotonic() < deadline:
            batch = c.consume(1000, 0.5)
            idle = 0 if batch else idle + 1
            if idle >= 6:   # 3 s without a record: the rest are transaction markers
                break
            for m in batch:
                if m.error() is None:
                    rec = _record(m)
                    out.append(rec)
                    position[rec[0]] = rec[1] + 1
        return out
    finally:
        c.close()


def _record(m: Any) -> tuple[int, int, int]:
    """(partition, offset, key as int) of a drill record."""
    return int(m.partition()), int(m.offset()), int(m.key())


@dataclass
class FirstRead:
    """What a consumer of the destination saw when it started (the end of the RTO)."""

    assigned_at: float | None = None
    first_record_at: float | None = None
    first: dict[int, tuple[int, int]] = field(default_factory=dict)   # p -> (offset, key)
    committed: dict[int, int] = field(default_factory=dict)


def start_consumer(brokers: str, topic: str, group: str, wait_after_assign: float,
                   now: Callable[[], float] = time.time) -> FirstRead:
    """Start a member of ``group`` on ``topic`` as an application would after the failover
    (subscribe, read_committed, no auto-commit) and note when it was assigned and when it
    read its first record; then keep reading briefly for one record of every partition.
    """
    from confluent_kafka import Consumer

    seen = FirstRead()

    def on_assign(consumer: Any, parts: Any) -> None:
        seen.assigned_at = now()

    c = Consumer({"bootstrap.servers": brokers, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "fetch.wait.max.ms": 50, **QUIET})
    try:
        c.subscribe([topic], on_assign=on_assign)
        deadline = time.monotonic() + 60
        settle: float | None = None
        while time.monotonic() < deadline:
            for m in c.consume(100, 0.05):
                if m.error() is not None:
                    continue
                if seen.first_record_at is None:
                    seen.first_record_at = now()
                p, offset, key = _record(m)
                seen.first.setdefault(p, (offset, key))
            if seen.assigned_at is not None and settle is None:
                settle = time.monotonic() + wait_after_assign
            if settle is not None and time.monotonic() > settle:
                break
        for tp in c.committed(c.assignment(), timeout=10):
            if tp.offset >= 0:
                seen.committed[tp.partition] = tp.offset
        return seen
    finally:
        c.close()
