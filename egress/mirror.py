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
* before a topic's segment, the topic's ``_incarnations.json`` and ``_topic.json`` are copied
  when egress wrote them since their last copy (``metadata_written``; always before the
  first segment of a topic after start): a mirrored segment never reaches the destination
  before the metadata that records where its partition's history begins (ingress would
  otherwise start a partition without a checkpoint at that segment). When the metadata
  copy fails the segment is not copied either (a failure, like any); the next one retries;
* ``close`` waits up to ``shutdown_timeout`` for the queued copies, then abandons those not
  started (counted in the dropped metric, logged once with their number); copies already
  sent finish or fail on their own within the client's short timeouts (``READ_TIMEOUT``,
  ``MAX_ATTEMPTS``), on daemon threads that never hold the process's exit.

In the destination, the copy and the later replica are the same key and bytes: ingress
replays the segment once and ignores the second event (below its checkpoint).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from egress.metrics import EgressMetrics
from replicator.core.errors import ObjectNotFound
from replicator.core.keys import SegmentKey, chain_key, topic_meta_key
from replicator.core.storage import ObjectStore

if TYPE_CHECKING:
    from replicator.core.s3 import S3ObjectStore
    from replicator.core.settings import Settings

log = logging.getLogger(__name__)

class MetadataNotCopied(Exception):
    """The topic's metadata could not be copied before its segment (the segment is not
    copied either).
    """


CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 15.0
MAX_ATTEMPTS = 2
"""The mirror client's timeouts and attempts: a stalled destination region costs a copy at
most ~2 x (3 + 15) s, and never holds the process's exit (the workers are daemon threads)."""


class SegmentMirror:
    """Copies published segments into the destination bucket on a few daemon threads.

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
        self._lock = threading.Condition()
        self._queue: collections.deque[tuple[SegmentKey, str, float]] = collections.deque()
        self._pending = 0
        self._closing = False
        self._abandon = False
        self._pending_gauge = metrics.mirror_pending.labels(region)
        self._written: dict[tuple[str, str, str], int] = {}
        """(prefix, region, topic) -> how many metadata writes egress reported (a topic
        not listed counts 1: its metadata was never copied by this process)."""
        self._copied: dict[tuple[str, str, str], int] = {}
        """... and up to which of them the metadata is known to be in the destination."""
        self._topic_locks: dict[tuple[str, str, str], threading.Lock] = {}
        # Daemon threads, not a ThreadPoolExecutor: concurrent.futures joins its workers at
        # interpreter exit, so one copy stalled on a slow destination would hold the
        # process's exit past shutdown_timeout.
        self._threads = [threading.Thread(target=self._run, name=f"egress-mirror-{i}",
                                          daemon=True) for i in range(max(1, threads))]
        for t in self._threads:
            t.start()

    @property
    def pending(self) -> int:
        """Copies queued or running now."""
        with self._lock:
            return self._pending

    def metadata_written(self, prefix: str, region: str, topic: str) -> None:
        """Egress wrote (or settled) the topic's ``_topic.json``: the next segment copy of
        the topic copies the metadata first (``TopicMetadataPublisher.on_written``).
        """
        t = (prefix, region, topic)
        with self._lock:
            self._written[t] = self._written.get(t, 1) + 1

    def submit(self, key: SegmentKey) -> bool:
        """Queue the copy of a published segment; ``False`` when it was not queued (the
        queue is full, or the mirror is closing). Never blocks, never raises.
        """
        name = key.to_key()
        with self._lock:
            if self._closing:
                return False
            full = self._pending >= self.max_pending
            if not full:
                self._pending += 1
                self._pending_gauge.set(self._pending)
                self._queue.append((key, name, self.clock()))
                self._lock.notify()
        if full:
            log.warning("mirror: %d copies into s3://%s are pending already ([egress.mirror] "
                        "max_pending): segment %s is not mirrored (S3 replication delivers "
                        "it)", self.max_pending, self.destination.bucket, name)
            self.m.mirror_dropped.labels(self.region, key.topic).inc()
            return False
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if not self._queue:
                    return
                key, name, queued_at = self._queue.popleft()
                abandoned = self._abandon
            if abandoned:
                self.m.mirror_dropped.labels(self.region, key.topic).inc()
                self._done()
                continue
            self._copy(key, name, queued_at)

    def _copy(self, key: SegmentKey, name: str, queued_at: float) -> None:
        try:
            self._metadata_first(key)
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

    def _metadata_first(self, key: SegmentKey) -> None:
        """Copy the topic's ``_incarnations.json`` and ``_topic.json`` before its segment
        when egress wrote them since the last such copy (or this process never copied
        them): a mirrored segment never reaches the destination before the metadata that
        says where its partition's history begins. Raises when a copy fails (the segment
        is then not copied either; the next one tries again).
        """
        t = (key.prefix, key.region, key.topic)
        with self._lock:
            lock = self._topic_locks.setdefault(t, threading.Lock())
        with lock:
            with self._lock:
                written = self._written.get(t, 1)
                if self._copied.get(t, 0) >= written:
                    return
            for meta in (chain_key(*t), topic_meta_key(*t)):
                try:
                    self.destination.copy_from(self.source, meta)
                except ObjectNotFound:
                    continue     # not written (no incarnation chain yet)
                except Exception as e:
                    raise MetadataNotCopied(f"its topic's metadata {meta} could not be "
                                            f"copied first: {e}") from e
            with self._lock:
                self._copied[t] = max(self._copied.get(t, 0), written)

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
            self._lock.notify_all()
            while self._pending and time.monotonic() < deadline:
                self._lock.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            left = self._pending
            self._abandon = True
            self._lock.notify_all()
        # Queued copies are taken by the workers, which see the abandon flag and drop them
        # (counted); a copy already sent finishes or fails within the client's timeouts,
        # on a daemon thread that never holds the process's exit.
        if left:
            log.warning("mirror: %d segment copies into s3://%s were still pending after "
                        "%.1fs at shutdown and are abandoned (S3 replication delivers them)",
                        left, self.destination.bucket, timeout)
        return left


def mirror_destination(settings: Settings) -> S3ObjectStore | None:
    """The destination bucket of ``settings.egress.mirror`` (``None`` when it is off): an
    ``S3ObjectStore`` with the mirror's client, sent to the destination region (the
    ``[s3]`` static keys when given, otherwise the AWS credential chain; short timeouts).
    ``replicator doctor`` asks it too.
    """
    mirror = settings.egress.mirror if settings.egress is not None else None
    if mirror is None:
        return None
    from replicator.core.s3 import S3ObjectStore, make_s3_client

    s3 = settings.s3
    key, secret = s3.static_keys()
    client = make_s3_client(
        endpoint_url=mirror.endpoint_url, region=mirror.region,
        access_key_id=key, secret_access_key=secret,
        max_pool_connections=mirror.threads + 1, connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT, max_attempts=MAX_ATTEMPTS - 1)  # botocore: retries
    return S3ObjectStore(client, mirror.bucket)


def make_mirror(settings: Settings, source: ObjectStore, metrics: EgressMetrics,
                storage_class: str | None) -> SegmentMirror | None:
    """The mirror of ``settings.egress.mirror`` (``None`` when it is off), its destination
    ``mirror_destination``'s.
    """
    destination = mirror_destination(settings)
    mirror = settings.egress.mirror if settings.egress is not None else None
    if destination is None or mirror is None:
        return None
    log.info("mirror: each segment is also copied into s3://%s (%s) as soon as it is "
             "published", mirror.bucket, mirror.region)
    return SegmentMirror(source, destination, metrics=metrics, region=settings.region,
                         threads=mirror.threads, max_pending=mirror.max_pending,
                         storage_class=storage_class)
