"""A realistic, reproducible sample of Kafka records for the demo, tests and benchmarks.

Records look like sensor readings: keyed by sensor (a few null keys), JSON-ish text
values of varying size, tombstones (null value) and empty values, headers with duplicate
names, binary and null values, and explicit CreateTime timestamps.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from replicator.core.kafka import DeliveryReport, Producer
from replicator.core.settings import KafkaSettings

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class SampleRecord:
    """One record to produce."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    timestamp_ms: int

    @property
    def raw_size(self) -> int:
        """Key + value + header bytes."""
        return (len(self.key or b"") + len(self.value or b"")
                + sum(len(k) + len(v or b"") for k, v in self.headers))


_WORDS = ("temperature", "humidity", "pressure", "status", "ok", "warn", "reading", "unit",
          "celsius", "battery", "firmware", "location", "north", "south", "calibrated")


def sample_records(count: int, partitions: int, *, seed: int = 7, value_size: int = 400,
                   start_ms: int | None = None) -> Iterator[SampleRecord]:
    """``count`` records spread round-robin over ``partitions``, deterministic per ``seed``."""
    rnd = random.Random(seed)
    base = int(time.time() * 1000) if start_ms is None else start_ms
    filler = " ".join(rnd.choice(_WORDS) for _ in range(value_size // 4 + 64)).encode()
    for i in range(count):
        roll = rnd.random()
        key = None if roll < 0.02 else f"sensor-{rnd.randrange(5000):05d}".encode()
        if roll > 0.97:
            value: bytes | None = None          # tombstone
        elif 0.95 < roll <= 0.96:
            value = b""                         # empty, not null
        else:
            n = max(16, int(rnd.gauss(value_size, value_size / 4)))
            off = rnd.randrange(max(1, len(filler) - n))
            value = b'{"seq":%d,"data":"%s"}' % (i, filler[off:off + n])
        headers: list[Header] = [("trace-id", rnd.randbytes(8).hex().encode())]
        if i % 10 == 0:
            headers += [("source", b"plant-a"), ("source", b"plant-b")]   # duplicate names
        if i % 17 == 0:
            headers.append(("checksum", rnd.randbytes(4)))                # binary value
        if i % 23 == 0:
            headers.append(("optional", None))                            # null value
        yield SampleRecord(i % partitions, key, value, headers, base + i)


@dataclass
class ProduceResult:
    """What ``produce_sample`` wrote."""

    records: int = 0
    raw_bytes: int = 0
    last_offsets: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def produce_sample(kafka: KafkaSettings, topic: str, records: Iterator[SampleRecord], *,
                   on_progress: Callable[[int], None] | None = None,
                   overrides: dict[str, Any] | None = None) -> ProduceResult:
    """Produce records and wait for every delivery report (failures land in ``errors``).

    Raises:
        KafkaFatalError: the client refused a record.
    """
    result = ProduceResult()

    def delivered(report: DeliveryReport) -> None:
        if report.error is not None:
            result.errors.append(f"{topic}[{report.partition}]: {report.reason}")
            return
        p = report.partition
        result.last_offsets[p] = max(result.last_offsets.get(p, -1), report.offset)

    producer = Producer(kafka, overrides={"linger.ms": 20, **(overrides or {})},
                        on_delivery=delivered)
    t0 = time.monotonic()
    for n, r in enumerate(records, 1):
        producer.produce(topic, r.value, r.key, partition=r.partition,
                         timestamp=r.timestamp_ms, headers=r.headers)
        result.records += 1
        result.raw_bytes += r.raw_size
        if n % 1000 == 0:
            producer.poll(0)
            if on_progress is not None:
                on_progress(n)
    remaining = producer.flush(60)
    result.seconds = time.monotonic() - t0
    if remaining:
        result.errors.append(f"{remaining} record(s) not delivered within 60 s")
    if on_progress is not None:
        on_progress(result.records)
    return result
