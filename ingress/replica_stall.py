"""Destination partitions with fewer in-sync replicas than their ``min.insync.replicas``:
the destination refuses their records (NOT_ENOUGH_REPLICAS), and ingress stalls.

With ``acks=all`` a broker accepts a record only while the partition has at least
``min.insync.replicas`` replicas in sync (two of three nodes down: one). The refusal is
retriable: librdkafka retries it unseen until the message times out, so a transaction
waiting for its records' acknowledgements looks merely slow. ``ReplicaStallWatch`` asks
the destination, while a transaction's records stay unacknowledged, how many replicas of
its partitions are in sync (``under_min_isr``), and while some are below the minimum:

* one ERROR naming each such partition, its in-sync replicas and the minimum (again at
  most once per ``repeat`` while it lasts);
* ``replicator_ingress_destination_stalled{topic,partition,reason="not_enough_replicas"}``
  is 1.

Nothing is lost: the transaction is never committed without its records; it commits (or is
aborted and redone from its checkpoint) once the replicas are back, by itself. Then the
gauge goes back to 0 with one INFO.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from replicator.core.errors import ReplicatorError

log = logging.getLogger(__name__)

REASON = "not_enough_replicas"
CHECK_AFTER = 3.0
"""Seconds a transaction's records may stay unacknowledged before the destination is asked."""
CHECK_EVERY = 5.0
"""Seconds between two questions while they stay unacknowledged."""


@dataclass(frozen=True)
class Replicas:
    """A destination partition's in-sync replicas and the minimum its topic requires."""

    topic: str
    partition: int
    in_sync: int
    replicas: int
    min_in_sync: int


def under_min_isr(r: Replicas) -> bool:
    """True when the destination refuses the partition's records with ``acks=all``."""
    return r.in_sync < r.min_in_sync


class ReplicaSource(Protocol):
    """How the watch asks the destination (the Kafka seam's ``Admin``, or a fake)."""

    def partition_replicas(self, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition: (in-sync replicas, replicas)."""
        ...

    def effective_topic_config(self, topic: str) -> dict[str, str]: ...


def stalled_gauge(metrics: Any) -> Any:
    """Register ``replicator_ingress_destination_stalled`` in ``metrics`` (a ``Metrics``)."""
    return metrics.gauge(
        "ingress_destination_stalled",
        "1 while a destination partition refuses ingress's records because fewer of its "
        "replicas are in sync than its min.insync.replicas (reason not_enough_replicas): "
        "ingress waits, loses nothing, and resumes by itself once the replicas are back.",
        ("topic", "partition", "reason"))


class ReplicaStallWatch:
    """Finds and reports destination partitions below ``min.insync.replicas``.

    Args:
        admin: the destination (built on first use: ``make_admin``).
        gauge: ``stalled_gauge``'s gauge.
        repeat: while a partition stays below, its ERROR is repeated at most this often.
    """

    def __init__(self, make_admin: Callable[[], ReplicaSource], gauge: Any, *,
                 repeat: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._make_admin = make_admin
        self._admin: ReplicaSource | None = None
        self.gauge = gauge
        self.repeat = repeat
        self.clock = clock
        self._stalled: dict[tuple[str, int], float] = {}
        """Stalled partitions and when their ERROR was last logged."""
        self._since: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    @property
    def stalled(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._stalled)

    @staticmethod
    def _min(admin: ReplicaSource, topic: str) -> int:
        # Asked each time (only while records stay unacknowledged): the setting may change.
        return int(admin.effective_topic_config(topic).get("min.insync.replicas", "1"))

    def ask(self, partitions: Iterable[tuple[str, int]]) -> list[Replicas]:
        """How many replicas of each of ``partitions`` are in sync. A destination that
        does not answer gives nothing (the reachability check reports that).
        """
        if self._admin is None:
            self._admin = self._make_admin()
        admin = self._admin
        wanted = set(partitions)
        out: list[Replicas] = []
        for topic in sorted({t for t, _ in wanted}):
            try:
                per = admin.partition_replicas(topic)
                least = self._min(admin, topic)
            except (ReplicatorError, TimeoutError, ValueError) as e:
                # A question that fails says nothing about replicas.
                log.debug("replicas of %s unknown: %s", topic, e)
                continue
            for p, (isr, n) in sorted(per.items()):
                if (topic, p) in wanted:
                    out.append(Replicas(topic, p, isr, n, least))
        return out

    def check(self, partitions: Iterable[tuple[str, int]]) -> list[Replicas]:
        """Ask about ``partitions`` (a transaction's, its records unacknowledged), report
        those below the minimum, clear those back above it; return those below.
        """
        found = self.ask(partitions)
        below = [r for r in found if under_min_isr(r)]
        self.clear([(r.topic, r.partition) for r in found if not under_min_isr(r)])
        now = self.clock()
        report: list[Replicas] = []
        with self._lock:
            for r in below:
                tp = (r.topic, r.partition)
                last = self._stalled.get(tp)
                if last is None:
                    self._since[tp] = now
                    self.gauge.labels(r.topic, str(r.partition), REASON).set(1)
                if last is None or now - last >= self.repeat:
                    self._stalled[tp] = now
                    report.append(r)
        if report:
            log.error(
                "destination refuses ingress's records (NOT_ENOUGH_REPLICAS): %s; Kafka "
                "accepts a record only while min.insync.replicas replicas are in sync, so "
                "ingress waits for the destination's brokers to come back and loses nothing "
                "(its transactions commit, or are redone from their checkpoints, once they "
                "are); bring the destination's brokers back",
                ", ".join(f"{r.topic}[{r.partition}] has {r.in_sync} of {r.replicas} "
                          f"replica(s) in sync, min.insync.replicas={r.min_in_sync}"
                          for r in report))
        return below

    def clear(self, partitions: Iterable[tuple[str, int]]) -> None:
        """``partitions`` accept records again (their transaction committed, or enough
        replicas are in sync): gauge to 0, one INFO each.
        """
        back = []
        with self._lock:
            for tp in partitions:
                if self._stalled.pop(tp, None) is not None:
                    since = self._since.pop(tp, self.clock())
                    self.gauge.labels(tp[0], str(tp[1]), REASON).set(0)
                    back.append((tp, self.clock() - since))
        for (t, p), secs in back:
            log.info("destination %s[%d] accepts ingress's records again after %.0fs "
                     "(enough replicas in sync)", t, p, secs)


class UnacknowledgedWatch:
    """At-least-once: the shared producer's sinks whose records stay unacknowledged.

    The transaction loop asks ``ReplicaStallWatch`` while one flush waits; the
    at-least-once path has no such wait, only workers asking their sink how much is still
    outstanding (``ingress.acks``). ``note`` is told, on each such question, how many of a
    sink's records are unanswered and how many have ended so far: a sink whose records
    stayed unanswered with no progress for ``after`` seconds has its partition asked about
    (at most once per ``every`` over all sinks, by one thread at a time: the others go on
    waiting); progress, or nothing unanswered, clears its partition.

    Args:
        watch: reports (ERROR, gauge) the partitions below ``min.insync.replicas``.
    """

    def __init__(self, watch: ReplicaStallWatch, *, after: float = CHECK_AFTER,
                 every: float = CHECK_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.watch = watch
        self.after = after
        self.every = every
        self.clock = clock
        self._waiting: dict[object, tuple[tuple[str, int], int, float]] = {}
        """Per sink: its partition, its records ended, and since when none has ended."""
        self._next = 0.0
        self._lock = threading.Lock()
        self._asking = threading.Lock()

    def note(self, sink: object, tp: tuple[str, int], unanswered: int, ended: int) -> None:
        """``sink`` (writing ``tp``) has ``unanswered`` records not acknowledged, after
        ``ended`` records ended (acknowledged or failed) in all.
        """
        now = self.clock()
        with self._lock:
            before = self._waiting.pop(sink, None)
            moved = before is not None and before[1] != ended
            if unanswered:
                since = now if before is None or moved else before[2]
                self._waiting[sink] = (tp, ended, since)
            waiting = sorted({w[0] for w in self._waiting.values() if now - w[2] >= self.after})
            due = bool(waiting) and now >= self._next
            if due:
                self._next = now + self.every
        if before is not None and (moved or not unanswered):
            self.watch.clear([tp])      # the partition took records: not refusing them
        if due and self._asking.acquire(blocking=False):
            try:
                self.watch.check(waiting)
            finally:
                self._asking.release()

    def forget(self, sink: object) -> None:
        """``sink``'s session ended (its partition's next session is noted afresh)."""
        with self._lock:
            self._waiting.pop(sink, None)
