"""The low-RPO mode (``[egress.mirror]``): each published segment copied at once into the
destination region's bucket.

Right after a segment is published under its final key (step 2 of the durability method,
``egress.partition_writer``), ``SegmentMirror.submit`` queues one server-side copy of that
key into the destination bucket, sent to the destination region's endpoint
(``ObjectStore.copy_from``). The copy is best effort by design: S3 replication into the
destination bucket stays on and delivers every segment anyway, so

* ``submit`` never blocks and never raises: the offset commit does not wait for the copy,
  and a destination region that is down or slow never stalls the source's replication;
* at most ``max_pending`` copies are queued or running (memory: one key each); a segment
  published while that many wait is not mirrored (WARNING with its key,
  ``replicator_egress_mirror_dropped_total``);
* a failed copy is logged at WARNING with its key and counted
  (``replicator_egress_mirror_failures_total``), never retried here (botocore's own
  retries apply): its replica arrives through S3 replication;
* ``close`` waits up to ``shutdown_timeout`` for the queued copies, then abandons those not
  started (counted in the dropped metric, logged once with their number); copies already
  sent finish or fail on their own within the client's timeouts.

In the destination, the copy and the later replica are the same key and bytes: ingress
replays the segment once and ignores the second event (below its checkpoint).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from egress.metrics import EgressMetrics
from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectStore

if TYPE_CHECKING:
    from replicator.core.settings import Settings

log = logging.getLogger(__name__)


class SegmentMirror:
    """Copies published segments into the destination bucket on a small bounded pool.

    Args:
        source: this region's bucket (where segments are published).
        destination: the destination region's bucket, its store's client sent to that
            region's endpoint.
        metrics: the egress metrics (``mirror_*``).
        region: this process's region (the metrics' ``region`` label).
        threads: copies running at once.
        max_pending: copies queued or running at most.
        storage_class: the storage class of the copies (level 0's).
        clock: monotonic seconds (the copy latency histogram).
    """

    def __init__(self, source: ObjectStore, destination: ObjectStore, *,
                 metrics: EgressMetrics, region: str, threads: int = 2,
                 max_pending: int = 1000, storage_class: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.destination = destination
        self.m = metrics
        self.region = region
        self.max_pending = max_pending
        self.storage_class = storage_class
        self.clock = clock
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="egress-mirror")
        self._lock = threading.Condition()
        self._pending = 0
        self._closing = False
        self._abandon = False
        self._pending_gauge = metrics.mirror_pending.labels(region)

    @property
    def pending(self) -> int:
        """Copies queued or running now."""
        with self._lock:
            return self._pending

    def submit(self, key: SegmentKey) -> bool:
        """Queue the copy of a published segment; ``False`` when it was not queued (the
        queue is full, or the mirror is closing). Never blocks, never raises.
        """
        name = key.to_key()
        with self._lock:
            if self._closing:
                return False
            if self._pending >= self.max_pending:
                full = True
            else:
                full = False
                self._pending += 1
                self._pending_gauge.set(self._pending)
        if full:
            log.warning("mirror: %d copies into s3://%s are pending already ([egress.mirror] "
                        "max_pending): segment %s is not mirrored (S3 replication delivers "
                        "it)", self.max_pending, self.destination.bucket, name)
            self.m.mirror_dropped.labels(self.region, key.topic).inc()
            return False
        try:
            self._pool.submit(self._copy, key, name, self.clock())
        except RuntimeError:        # the pool was shut down meanwhile
            self._done()
            return False
        return True

    def _copy(self, key: SegmentKey, name: str, queued_at: float) -> None:
        try:
            with self._lock:
                abandoned = self._closing and self._abandon
            if abandoned:
                self.m.mirror_dropped.labels(self.region, key.topic).inc()
                return
            self.destination.copy_from(self.source, name, storage_class=self.storage_class)
        except Exception as e:  # noqa: BLE001 - whatever the failure: logged, counted, never raised
            # ObjectNotFound too: published a moment ago and gone (compaction merged it;
            # its output is replicated).
            self._failed(key, name, e)
        else:
            self.m.mirror_copies.labels(self.region, key.topic).inc()
            self.m.mirror_seconds.labels(self.region).observe(self.clock() - queued_at)
        finally:
            self._done()

    def _failed(self, key: SegmentKey, name: str, error: BaseException) -> None:
        log.warning("mirror: copying segment %s into s3://%s failed (S3 replication delivers "
                    "it): %s", name, self.destination.bucket, error)
        self.m.mirror_failures.labels(self.region, key.topic).inc()

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
            self._pending_gauge.set(self._pending)
            self._lock.notify_all()

    def close(self, timeout: float) -> int:
        """Stop taking copies, wait up to ``timeout`` seconds for the pending ones, then
        abandon those not started. Returns how many were still pending (abandoned, or
        running on past the wait); idempotent.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            self._closing = True
            while self._pending and time.monotonic() < deadline:
                self._lock.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            left = self._pending
            self._abandon = True
        # Queued copies still run, see the abandon flag and return at once (counted as
        # dropped); a copy already sent finishes or fails within the client's timeouts.
        self._pool.shutdown(wait=False)
        if left:
            log.warning("mirror: %d segment copies into s3://%s were still pending after "
                        "%.1fs at shutdown and are abandoned (S3 replication delivers them)",
                        left, self.destination.bucket, timeout)
        return left


def make_mirror(settings: Settings, source: ObjectStore, metrics: EgressMetrics,
                storage_class: str | None) -> SegmentMirror | None:
    """The mirror of ``settings.egress.mirror`` (``None`` when it is off), its destination
    an ``S3ObjectStore`` with a client for the destination region (the ``[s3]`` static keys
    when given, otherwise the AWS credential chain).
    """
    mirror = settings.egress.mirror if settings.egress is not None else None
    if mirror is None:
        return None
    from replicator.core.s3 import S3ObjectStore, make_s3_client

    s3 = settings.s3
    client = make_s3_client(
        endpoint_url=mirror.endpoint_url, region=mirror.region,
        access_key_id=s3.access_key_id.get_secret_value() if s3.access_key_id else None,
        secret_access_key=(s3.secret_access_key.get_secret_value()
                           if s3.secret_access_key else None),
        max_pool_connections=mirror.threads + 1)
    destination = S3ObjectStore(client, mirror.bucket)
    log.info("mirror: each segment is also copied into s3://%s (%s) as soon as it is "
             "published", mirror.bucket, mirror.region)
    return SegmentMirror(source, destination, metrics=metrics, region=settings.region,
                         threads=mirror.threads, max_pending=mirror.max_pending,
                         storage_class=storage_class)
