"""One read of a source topic's ``_topic.json`` shared by the process's replay workers.

Every replay worker of a topic reads the topic's incarnation chain from ``_topic.json``
when it lists its segments (``ingress.incarnations.Lineage``). With one worker per
partition, each listing cycle would GET the same object once per worker; this cache keeps
what one read returned for ``ttl`` seconds (the chain's own re-read interval, so a worker
sees nothing older than it did reading alone), and the workers of the cycle share it. A
failed read is not kept: the next worker reads again (and the session retries as before).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import read_topic_meta
from replicator.core.wire import TopicMetadata


class TopicMetaCache:
    """``_topic.json`` of each source topic, read at most once per ``ttl`` seconds.

    Thread-safe: workers run on the scheduler's pool threads; readers of one topic that
    arrive while it is being read wait for that read instead of sending their own.
    """

    def __init__(self, store: ObjectStore, ttl: float,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.ttl = ttl
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._topic_locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._read: dict[tuple[str, str, str], tuple[float, TopicMetadata | None]] = {}

    def read(self, prefix: str, region: str, topic: str) -> TopicMetadata | None:
        """The topic's ``_topic.json`` as read less than ``ttl`` seconds ago, else read now
        (``None`` while egress has not written it).

        Raises:
            ReplicatorError: the object cannot be read or parsed (nothing is kept).
        """
        key = (prefix, region, topic)
        with self._lock:
            lock = self._topic_locks.setdefault(key, threading.Lock())
        with lock:
            kept = self._read.get(key)
            now = self._monotonic()
            if kept is not None and now - kept[0] < self.ttl:
                return kept[1]
            meta = read_topic_meta(self.store, prefix, region, topic)
            self._read[key] = (now, meta)
            return meta
