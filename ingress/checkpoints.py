"""Checkpoints (SPEC 3.3): the last source position replayed per source partition.

Key ``{source_region}:{source_topic}:{partition}``, JSON value
``{"offset": <last source offset produced>, "segment": "<key>", "updated_at": "<RFC 3339>"}``
on a log-compacted topic. A declared-lost range also moves the checkpoint (to its last
position) so that a restart does not wait for it again; such a record carries
``"lost": [first, last]`` and the segment that follows the range.

Only the replay worker's durability method writes checkpoints (through its producer, in
the same transaction as the records in exactly-once mode). ``CheckpointStore`` reads them.
"""

from __future__ import annotations

import json
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ingress.events import json_object
from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import read_to_end
from replicator.core.metrics import Metrics
from replicator.core.settings import KafkaSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    """Progress of one source partition."""

    offset: int
    segment: str
    updated_at: datetime
    lost: tuple[int, int] | None = None
    origin: int | None = None
    """Where the partition's first replay started without a checkpoint (the start of the
    earliest segment then known). A segment below it that arrives later was never
    replayed: the worker reports it as skipped."""

    def encode(self) -> bytes:
        """The JSON value written to the checkpoint topic."""
        doc: dict[str, Any] = {
            "offset": self.offset,
            "segment": self.segment,
            "updated_at": self.updated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        if self.lost is not None:
            doc["lost"] = list(self.lost)
        if self.origin is not None:
            doc["origin"] = self.origin
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> Checkpoint:
        """Parse a checkpoint value.

        Raises:
            ValueError: naming what is wrong.
        """
        doc = json_object(value, "checkpoint", if_null="checkpoint value is null (tombstone)")
        offset = doc.get("offset")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"checkpoint offset must be a non-negative int, got {offset!r}")
        segment = doc.get("segment", "")
        if not isinstance(segment, str):
            raise ValueError(f"checkpoint segment must be a string, got {segment!r}")
        try:
            updated = datetime.fromisoformat(str(doc.get("updated_at")).replace("Z", "+00:00"))
        except ValueError as e:
            raise ValueError(f"checkpoint updated_at is not RFC 3339: "
                             f"{doc.get('updated_at')!r}") from e
        lost = doc.get("lost")
        lost_t = (int(lost[0]), int(lost[1])) if isinstance(lost, list) and len(lost) == 2 \
            else None
        origin = doc.get("origin")
        origin_i = origin if isinstance(origin, int) and not isinstance(origin, bool) \
            and origin >= 0 else None
        return cls(offset, segment, updated, lost_t, origin_i)


class CheckpointStore(ABC):
    """Reads the latest committed checkpoint of a source partition."""

    @abstractmethod
    def load(self, key: str) -> Checkpoint | None:
        """The latest valid checkpoint under ``key`` (``{region}:{topic}:{partition}``).

        Invalid records are logged at ERROR and counted, and never win over a valid one.

        Raises:
            KafkaRetriableError: the topic could not be read to its end in time.
        """


class MemoryCheckpointStore(CheckpointStore):
    """A dict of checkpoints (unit tests)."""

    def __init__(self) -> None:
        self.values: dict[str, list[bytes | None]] = {}
        self._lock = threading.Lock()

    def append(self, key: str, value: bytes | None) -> None:
        """Record a written value (what a sink's commit does)."""
        with self._lock:
            self.values.setdefault(key, []).append(value)

    def load(self, key: str) -> Checkpoint | None:
        with self._lock:
            values = list(self.values.get(key, []))
        return latest_valid(key, values, None)


def latest_valid(key: str, values: list[bytes | None], metrics: Any | None) -> Checkpoint | None:
    """The last decodable value of ``values`` (in log order); bad ones are logged and
    skipped, a tombstone (``None``) clears what came before."""
    best: Checkpoint | None = None
    for v in values:
        if v is None:
            # A tombstone deletes the checkpoint (an operator resetting a partition).
            best = None
            continue
        try:
            cp = Checkpoint.decode(v)
        except ValueError as e:
            log.error("invalid checkpoint record for %s ignored: %s", key, e)
            if metrics is not None:
                metrics.labels(key=key).inc()
            continue
        best = cp
    return best


class KafkaCheckpointStore(CheckpointStore):
    """Reads the checkpoint topic with ``read_committed``, from the beginning to its end.

    Each ``load`` uses a fresh, group-less consumer assigned to every partition of the
    topic and stops at partition EOF (for ``read_committed`` that is the last stable
    offset, so an open transaction of a fenced producer is waited for, not read past).
    The topic is log-compacted, so it holds about one record per source partition.
    """

    def __init__(self, kafka_settings: KafkaSettings, topic: str, metrics: Metrics, *,
                 timeout: float = 60.0) -> None:
        self.kafka_settings = kafka_settings
        self.topic = topic
        self.timeout = timeout
        self._invalid = metrics.counter(
            "ingress_checkpoints_invalid_total",
            "Checkpoint records that could not be parsed (ignored).", ["key"])

    def load(self, key: str) -> Checkpoint | None:
        values = self._read(key.encode())
        return latest_valid(key, values, self._invalid)

    def load_all(self) -> dict[str, Checkpoint]:
        """The latest valid checkpoint of every key in the topic (operator tools)."""
        by_key: dict[str, list[bytes | None]] = {}
        for k, v in self._read_records(None):
            by_key.setdefault(k.decode(errors="replace"), []).append(v)
        out = {}
        for key, values in by_key.items():
            cp = latest_valid(key, values, self._invalid)
            if cp is not None:
                out[key] = cp
        return out

    def _read(self, want: bytes) -> list[bytes | None]:
        return [v for _k, v in self._read_records(want)]

    def _read_records(self, want: bytes | None) -> list[tuple[bytes, bytes | None]]:
        """Committed ``(key, value)`` records for ``want`` (or every key), in log order.

        The checkpoint topic's partitions are shared by every worker, and a read_committed
        reader stops at the last stable offset: while *another* worker's transaction is open,
        a checkpoint committed after it started is not visible yet. Stopping there would
        hand a new owner a stale checkpoint and make it replay a committed batch. So:

        1. read_uncommitted to the end: per partition, the offset after the last record for
           ``want`` (every record, when ``want`` is None), committed or not;
        2. read_committed until each partition's stable end has passed that offset, i.e.
           every transaction that could hold a newer checkpoint has committed or aborted.
        """
        need = self._scan(want, "read_uncommitted")[1]
        return self._scan(want, "read_committed", need)[0]

    def _scan(self, want: bytes | None, isolation: Literal["read_committed",
                                                           "read_uncommitted"],
              need: dict[int, int] | None = None
              ) -> tuple[list[tuple[bytes, bytes | None]], dict[int, int]]:
        """Read the topic to its end; return matching records and, per partition, the
        offset after the last matching record. With ``need``, a partition counts as read
        only once its end-of-partition offset reaches ``need[p]``."""
        values: list[tuple[bytes, bytes | None]] = []
        last: dict[int, int] = {}
        try:
            for msg in read_to_end(self.kafka_settings, self.topic, isolation=isolation,
                                   ends_at_least=need, timeout=self.timeout, on_error="log",
                                   what="checkpoint topic",
                                   overrides={"fetch.wait.max.ms": 10}):
                key = msg.key()
                if key is not None and (want is None or key == want):
                    values.append((key, msg.value()))
                    p, off = msg.partition(), msg.offset()
                    if p is not None and off is not None:
                        last[p] = max(last.get(p, 0), off + 1)
        except KafkaRetriableError as e:
            raise KafkaRetriableError(f"{e} (an open transaction of another writer holds "
                                      "the stable offset back)") from e
        return values, last
