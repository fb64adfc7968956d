"""Partitions whose fetch position left the source log, until their log start is known.

With ``auto.offset.reset=error`` the client stops a partition whose position the broker no
longer has (retention or DeleteRecords under a lagging egress, or a truncated or recreated
partition) instead of jumping silently. Egress must then learn the partition's log start to
report the exact lost range and fetch on from there. This module keeps one entry per such
partition and the read of its log start; the poll loop applies what it finds.

The read never touches the group consumer: it is a ListOffsets request on the admin client
(``Admin.log_start``), which runs on that client's own thread and returns a future, so a
consumer stuck in the partition's error state cannot hold it up and no pool thread waits for
it (RELIABILITY.md, "A log-start read that never returns"). Each read has a hard deadline
here, whatever the client does with its own: a read that has not answered after
``READ_PATIENCE`` is abandoned and asked again, one outstanding read per partition. A
partition whose log start stays unknown for ``STALLED_AFTER`` is *stalled*: one ERROR naming
the partition, what was tried and the last answer; counted in
``egress_log_start_stalled_partitions``; the process reports not ready (``/readyz``) until
every stalled partition has its log start again, which ends the stall by itself.

Entries belong to a writer. An event for the partition's current writer while its read is
pending changes nothing; an event for a new writer (the partition was released and assigned
again) replaces a stale entry; release and loss drop the entry (``forget``). A read that
finishes for a writer that no longer owns the partition is dropped unused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from egress.partition_writer import PartitionWriter

log = logging.getLogger(__name__)

READ_TIMEOUT = 10.0
"""The overall deadline handed to the client for one read (leader lookup included)."""
READ_PATIENCE = 15.0
"""Seconds one read may stay unanswered before it is abandoned and asked again."""
RETRY_DELAY = 1.0
"""Seconds between a failed read (or a refused restart) and the next one."""
STALLED_AFTER = 60.0
"""Seconds without a log start after which the partition is reported stalled."""

LogStartRead = Callable[[str, int], "Future[int]"]
"""Starts a read of a partition's log start and returns at once (``Admin.log_start``)."""


@dataclass
class OutOfRange:
    """One partition whose position left the log, waiting for its log start."""

    writer: PartitionWriter
    position: int
    """The fetch position the broker no longer has."""
    since: float
    """``clock()`` when the position was reported."""
    read: Future[int] | None = None
    """The outstanding read (``None`` between a failure and the next try)."""
    asked: float = 0.0
    """``clock()`` when ``read`` was started."""
    retry_at: float = 0.0
    attempts: int = 0
    last_error: str = ""
    stalled: bool = False
    low: int | None = field(default=None)
    """The log start, once read."""


def read_state(o: OutOfRange, now: float) -> str:
    """What to do with an entry now (pure): ``"known"`` (its log start is read),
    ``"done"`` (the outstanding read answered: collect it), ``"wait"``, ``"ask"`` (no read
    outstanding and its retry time came) or ``"abandon"`` (the outstanding read outlived
    ``READ_PATIENCE``).
    """
    if o.low is not None:
        return "known"
    if o.read is None:
        return "ask" if now >= o.retry_at else "wait"
    if o.read.done():
        return "done"
    return "abandon" if now - o.asked > READ_PATIENCE else "wait"


def is_stalled(o: OutOfRange, now: float) -> bool:
    """A partition is stalled once its log start stayed unknown ``STALLED_AFTER`` (pure)."""
    return o.low is None and now - o.since >= STALLED_AFTER


class OutOfRangePartitions:
    """The partitions stopped out of range, keyed by ``(topic, partition)``.

    Args:
        read: starts a log-start read (non-blocking).
        stalled_gauge: the region's child of ``egress_log_start_stalled_partitions``.
        failures: the region's child of ``egress_log_start_read_failures_total``.
    """

    def __init__(self, read: LogStartRead, stalled_gauge: Any, failures: Any) -> None:
        self._read = read
        self._stalled_gauge = stalled_gauge
        self._failures = failures
        self.entries: dict[tuple[str, int], OutOfRange] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.entries)

    @property
    def stalled(self) -> int:
        """Partitions reported stalled now."""
        return sum(o.stalled for o in self.entries.values())

    def report(self, key: tuple[str, int], writer: PartitionWriter, position: int,
               now: float) -> bool:
        """The client stopped ``key`` at ``position`` (it is no longer in the log).

        Returns:
            ``True`` when a new read starts; ``False`` when this writer's read is already
            under way (the same event again).
        """
        o = self.entries.get(key)
        if o is not None and o.writer is writer:
            return False
        if o is not None:
            log.info("%s: dropping the log-start read of an earlier assignment", writer.name)
            self._drop(key)
        o = OutOfRange(writer, position, since=now)
        self.entries[key] = o
        self._ask(key, o, now)
        return True

    def forget(self, keys: Iterable[tuple[str, int]]) -> None:
        """The partitions were released or lost: their entries end with their writers."""
        for k in keys:
            if k in self.entries:
                self._drop(k)

    def done(self, key: tuple[str, int]) -> None:
        """The partition was restarted at its log start."""
        self._drop(key)

    def retry(self, key: tuple[str, int], now: float, error: str) -> None:
        """The restart at the known log start was refused: read again after a delay."""
        o = self.entries[key]
        o.low, o.read = None, None
        o.retry_at, o.last_error = now + RETRY_DELAY, error

    def settle(self, now: float, writers: Mapping[tuple[str, int], PartitionWriter]
               ) -> list[tuple[tuple[str, int], OutOfRange]]:
        """Advance every read; return the entries whose log start is known and whose
        writer still owns the partition (the caller restarts them, then ``done``).
        """
        ready = []
        for key, o in list(self.entries.items()):
            if writers.get(key) is not o.writer:
                self._drop(key)        # released without ``forget`` (never kept alive)
                continue
            state = read_state(o, now)
            if state == "done":
                self._collect(o, now)
                state = read_state(o, now)
            if state == "abandon":
                self._failures.inc()
                o.attempts += 1
                o.last_error = f"no answer within {READ_PATIENCE:.0f} s"
                log.warning("%s: the log start was not read within %.0f s; asking again",
                            o.writer.name, READ_PATIENCE)
                self._ask(key, o, now)
            elif state == "ask":
                self._ask(key, o, now)
            elif state == "known":
                ready.append((key, o))
            self._update_stall(o, now)
        return ready

    # --- internals --------------------------------------------------------------------

    def _ask(self, key: tuple[str, int], o: OutOfRange, now: float) -> None:
        if o.read is not None:
            o.read.cancel()            # abandoned: its answer is no longer wanted
        o.asked = now
        o.read = self._read(*key)

    def _collect(self, o: OutOfRange, now: float) -> None:
        assert o.read is not None
        read, o.read = o.read, None
        error = read.exception()
        if error is None:
            o.low = read.result()
            return
        self._failures.inc()
        o.attempts += 1
        o.last_error = str(error)
        o.retry_at = now + RETRY_DELAY
        log.warning("%s: reading its log start failed, retrying in %.0f s: %s",
                    o.writer.name, RETRY_DELAY, error)

    def _update_stall(self, o: OutOfRange, now: float) -> None:
        if o.stalled or not is_stalled(o, now):
            return
        o.stalled = True
        self._stalled_gauge.inc()
        log.error("%s: stopped at offset %d for %.0f s: its fetch position left the source "
                  "log and its log start could not be read (%d ListOffsets requests to the "
                  "partition leader, each with a %.0f s deadline; last: %s). The partition "
                  "is not replicating and /readyz is false; it goes on by itself once the "
                  "log start is read. Check the source cluster's health and this "
                  "process's access to the partition leader.",
                  o.writer.name, o.position, now - o.since, o.attempts + 1, READ_TIMEOUT,
                  o.last_error or "none answered")

    def _drop(self, key: tuple[str, int]) -> None:
        o = self.entries.pop(key)
        if o.read is not None:
            o.read.cancel()
        if o.stalled:
            self._stalled_gauge.dec()
            log.info("%s: no longer stalled (%s)", o.writer.name,
                     "log start read" if o.low is not None else "released")
