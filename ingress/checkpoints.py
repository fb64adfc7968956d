"""Reading checkpoints: the last source position replayed per source partition.

The key and JSON value (``Checkpoint``) are encoded in ``replicator.core.wire``
(docs/architecture.md, "Checkpoints"); they live on a log-compacted topic.

Only the replay worker's durability method writes checkpoints (through its producer, in
the same transaction as the records in exactly-once mode). ``CheckpointStore`` reads them.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Literal

from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import read_to_end
from replicator.core.metrics import Metrics
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint

log = logging.getLogger(__name__)


class CheckpointStore(ABC):
    """Reads the latest committed checkpoint of a source partition."""

    def load(self, key: str) -> Checkpoint | None:
        """The latest valid checkpoint under ``key``.

        Invalid records are logged at ERROR and counted, and never win over a valid one.

        Raises:
            KafkaRetriableError: the topic could not be read to its end in time.
        """
        return self.load_for(key, None)[0]

    @abstractmethod
    def load_for(self, key: str, legacy: str | None) -> tuple[Checkpoint | None, bool]:
        """The checkpoint of ``key`` (``{region}:{topic}:{partition}:{destination}``), or
        on upgrade the one under ``legacy`` (the key of earlier versions, without the
        destination), by the rule of ``resolve``. The flag is True when it came from
        ``legacy`` (the caller writes it under ``key`` at once, so the upgrade happens once).

        Raises:
            KafkaRetriableError: the topic could not be read to its end in time.
        """


def resolve(key: str, legacy: str | None, by_key: Mapping[str, list[bytes | None]],
            metrics: Any | None) -> tuple[Checkpoint | None, bool]:
    """Which checkpoint a source partition replayed into one destination resumes from.

    1. Any record under ``key`` (the key with the destination): its latest valid value
       (none after a tombstone: an operator's reset is kept).
    2. Otherwise the latest valid value under ``legacy`` (written by a version whose key
       had no destination), but only if it can belong to this deployment: no record
       exists under ``legacy:<another destination>``. When one does, another deployment
       replaying the same source into another topic already shares this checkpoint topic,
       so the legacy value may be its progress: it is not used (WARNING; the partition
       starts without a checkpoint, replaying more, never skipping).
    """
    if key in by_key or legacy is None or legacy not in by_key:
        return latest_valid(key, list(by_key.get(key, [])), metrics), False
    others = sorted(k for k in by_key if k.startswith(legacy + ":") and k != key)
    if others:
        log.warning("checkpoint %s of an earlier version is NOT used for %s: other "
                    "destinations (%s) share this checkpoint topic, so it may be theirs; "
                    "starting without a checkpoint", legacy, key, ", ".join(others))
        return None, False
    cp = latest_valid(legacy, list(by_key[legacy]), metrics)
    if cp is not None:
        log.info("checkpoint %s of an earlier version (offset %d) is taken over as %s",
                 legacy, cp.offset, key)
    return cp, cp is not None


class MemoryCheckpointStore(CheckpointStore):
    """A dict of checkpoints (unit tests)."""

    def __init__(self) -> None:
        self.values: dict[str, list[bytes | None]] = {}
        self._lock = threading.Lock()

    def append(self, key: str, value: bytes | None) -> None:
        """Record a written value (what a sink's commit does)."""
        with self._lock:
            self.values.setdefault(key, []).append(value)

    def load_for(self, key: str, legacy: str | None) -> tuple[Checkpoint | None, bool]:
        with self._lock:
            values = {k: list(v) for k, v in self.values.items()}
        return resolve(key, legacy, values, None)


def latest_valid(key: str, values: list[bytes | None], metrics: Any | None) -> Checkpoint | None:
    """The last decodable value of ``values`` (in log order); bad ones are logged and
    skipped, a tombstone (``None``) clears what came before.
    """
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

    def load_for(self, key: str, legacy: str | None) -> tuple[Checkpoint | None, bool]:
        want = key.encode()
        old = None if legacy is None else legacy.encode()
        by_key: dict[str, list[bytes | None]] = {}
        for k, v in self._read_records(
                lambda k: k == want or (old is not None
                                        and (k == old or k.startswith(old + b":")))):
            by_key.setdefault(k.decode(errors="replace"), []).append(v)
        return resolve(key, legacy, by_key, self._invalid)

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

    def _read_records(self, want: Callable[[bytes], bool] | None
                      ) -> list[tuple[bytes, bytes | None]]:
        """Committed ``(key, value)`` records whose key ``want`` accepts (or every
        record, when ``want`` is None), in log order.

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

    def _scan(self, want: Callable[[bytes], bool] | None, isolation: Literal["read_committed",
                                                           "read_uncommitted"],
              need: dict[int, int] | None = None
              ) -> tuple[list[tuple[bytes, bytes | None]], dict[int, int]]:
        """Read the topic to its end; return matching records and, per partition, the
        offset after the last matching record. With ``need``, a partition counts as read
        only once its end-of-partition offset reaches ``need[p]``.
        """
        values: list[tuple[bytes, bytes | None]] = []
        last: dict[int, int] = {}
        try:
            for msg in read_to_end(self.kafka_settings, self.topic, isolation=isolation,
                                   ends_at_least=need, timeout=self.timeout, on_error="log",
                                   what="checkpoint topic",
                                   overrides={"fetch.wait.max.ms": 10}):
                key = msg.key()
                if key is not None and (want is None or want(key)):
                    values.append((key, msg.value()))
                    p, off = msg.partition(), msg.offset()
                    if p is not None and off is not None:
                        last[p] = max(last.get(p, 0), off + 1)
        except KafkaRetriableError as e:
            raise KafkaRetriableError(f"{e} (an open transaction of another writer holds "
                                      "the stable offset back)") from e
        return values, last
