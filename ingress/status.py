"""What a replay worker reports about its partition when a session ends badly, and the
data of those states (``ingress.replay_state``): a record the destination refuses
(``REFUSED``), fencings in a row and whether that counts as stalled (``FENCED``), the last
failure (``RESTARTING``), each with its log line, metrics and backoff. A durable
checkpoint past them (``checkpointed``) clears them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ingress.metrics import IngressMetrics
from ingress.worker_config import FENCED_STALL, refusal_backoff, session_backoff
from replicator.core.errors import NotAuthorized, ProducerFenced, RecordRefused
from replicator.core.wire import Checkpoint, Refusal

log = logging.getLogger(__name__)

QUIET_RETRIABLE = 60.0
"""Seconds retriable session failures in a row are WARNINGs (a group coordinator or a
leader moving with one node of the cluster restarting: routine), before they are ERRORs."""


class PartitionStatus:
    """The reports of one worker's partition (thread-safe enough: set by the worker's
    step, read by the controller).

    Args:
        where: names the partition in log lines.
        metrics: the ingress metrics.
        labels: the partition's labels.
    """

    def __init__(self, where: str, metrics: IngressMetrics, labels: dict[str, str], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.where = where
        self.clock = clock
        self.failing_since: float | None = None
        """When the sessions' current run of failures began (``None``: the last one
        checkpointed)."""
        self.metrics = metrics
        self.labels = labels
        self.refused: RecordRefused | None = None
        """The record the destination refuses, while the partition is stopped at it."""
        self.refusal: Refusal | None = None
        """The refused record as checkpoints record it (also learnt from a checkpoint that
        records one): a session replays it alone, after everything before it is durable,
        and every checkpoint below it carries it."""
        self.fenced_in_a_row = 0
        self.stalled = False
        self.failed: BaseException | None = None
        self.backoff = session_backoff()
        self.refusal_backoff = refusal_backoff()

    def fenced(self, e: ProducerFenced) -> float:
        """The producer was fenced. While the controller still owns the partition (it
        stops this worker on revoke), that is not a new owner: a transaction outlived
        ``transaction.timeout.ms`` (the coordinator aborted it and bumped the epoch) or a
        former owner's late init. A new session fences in turn, reads the committed
        checkpoint and goes on; after ``FENCED_STALL`` fencings in a row without progress
        the partition is reported stalled (ERROR, metric, /readyz) while retrying.
        Returns the delay before the new session.
        """
        delay = self.backoff.next()
        self.fenced_in_a_row += 1
        self.metrics.worker_errors.labels(**self.labels, kind="fenced").inc()
        if self.fenced_in_a_row >= FENCED_STALL and not self.stalled:
            log.error("%s: STALLED: the producer was fenced %d times in a row although this "
                      "process owns the partition (another live instance with the same "
                      "transactional.id, i.e. the same ingress.instance_id?); retrying "
                      "every %.0fs at most: %s", self.where, self.fenced_in_a_row, delay, e)
            # After the log line: whoever sees the metric finds the line too.
            self.stalled = True
            self.metrics.partition_stalled.labels(**self.labels).set(1)
        else:
            log.warning("%s: producer fenced (a transaction that outlived "
                        "transaction.timeout.ms, or a former owner); new session in %.1fs: %s",
                        self.where, delay, e)
        return delay

    def record_refused(self, e: RecordRefused) -> float:
        """The destination refused a record of this partition for good: the partition
        stops at it (the session restarts from the checkpoint below it and replays it
        alone, so nothing after it is produced and nothing is skipped), reported (ERROR,
        ``…_partition_refused``, ``…_records_refused_total``), and tried again on a slow
        backoff, or at once when the destination topic's configs change
        (``ReplayWorker.retry_refused``). Other partitions go on. Returns the delay before
        the next session.
        """
        delay = self.refusal_backoff.next()
        self.refused = e
        if e.offset is not None:
            self.refusal = Refusal(e.offset, e.size, e.setting or "", e.reason)
        self.metrics.records_refused.labels(**self.labels).inc()
        self.metrics.partition_refused.labels(**self.labels).set(1)
        log.error("%s: STOPPED at a record the destination refuses: %s. Nothing after it "
                  "is produced; retrying in %.0fs, or when the destination topic's configs "
                  "change (raise its max.message.bytes, grant the write, ...)", self.where,
                  e, delay)
        return delay

    def session_failed(self, e: BaseException, kind: str) -> float:
        """A session failed (``kind``: retriable, fatal, unexpected); returns the delay.

        Retriable failures are WARNINGs while they have lasted less than
        ``QUIET_RETRIABLE`` without a checkpoint in between (one node of the destination
        restarting moves group coordinators and leaders: the sessions fail and are redone
        from their checkpoints, nothing lost), ERRORs after; the others, and a missing
        grant (``NotAuthorized``), at once.
        """
        delay = self.backoff.next()
        now = self.clock()
        if self.failing_since is None:
            self.failing_since = now
        lasted = now - self.failing_since
        # A missing grant is no routine event: it waits for an operator, so ERROR at once.
        quiet = kind == "retriable" and lasted < QUIET_RETRIABLE \
            and not isinstance(e, NotAuthorized)
        log.log(logging.WARNING if quiet else logging.ERROR,
                "%s: replay session failed (%s), restarting from the checkpoint in %.1fs%s: "
                "%s", self.where, kind, delay,
                f" (failing for {lasted:.0f}s)" if lasted >= 1 else "", e)
        self.metrics.worker_errors.labels(**self.labels, kind=kind).inc()
        self.failed = e
        return delay

    def retry_refused(self) -> bool:
        """The destination topic's configs changed: True if the partition is stopped at a
        refused record (its backoff starts again from its first delay).
        """
        if self.refused is None:
            return False
        self.refusal_backoff.reset()
        return True

    @property
    def refused_at(self) -> int | None:
        """The source offset of the refused record, if any."""
        refusal = self.refusal
        return None if refusal is None else refusal.offset

    def checkpointed(self, cp: Checkpoint) -> None:
        """``cp`` is durable: a refusal it has passed, fencings and failures are over."""
        self.failing_since = None
        refusal = self.refusal
        if refusal is not None and cp.refused is None and cp.offset >= refusal.offset:
            if self.refused is not None:
                log.info("%s: replicating again past the refused record (checkpoint %d)",
                         self.where, cp.offset)
                self.metrics.partition_refused.labels(**self.labels).set(0)
            self.refused = None
            self.refusal = None
            self.refusal_backoff.reset()
        elif self.refused is not None and self.refused.offset is None and cp.refused is None:
            self.refused = None         # a refusal that named no record: any progress
            self.refusal_backoff.reset()
            self.metrics.partition_refused.labels(**self.labels).set(0)
        if self.fenced_in_a_row or self.stalled:
            if self.stalled:
                log.info("%s: replaying again after being fenced", self.where)
                self.metrics.partition_stalled.labels(**self.labels).set(0)
            self.fenced_in_a_row = 0
            self.stalled = False
