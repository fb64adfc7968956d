"""The low-RPO mode (``egress.mirror``): each published segment copied into the destination
bucket on a bounded pool that the offset commit never waits for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from egress.metrics import EgressMetrics
from egress.mirror import CONNECT_TIMEOUT, MAX_ATTEMPTS, READ_TIMEOUT, SegmentMirror
from egress.rotation import CloseReason
from replicator.core.errors import StorageError, StorageFatalError
from replicator.core.keys import SegmentKey, chain_key, topic_meta_key
from replicator.core.metrics import Metrics
from replicator.core.storage import MemoryObjectStore, ObjectStore
from tests.unit.egress.fakes import Harness, messages, records


class Destination(MemoryObjectStore):
    """The destination bucket: copies can be held (a slow region) or refused."""

    def __init__(self) -> None:
        super().__init__("dest")
        self.hold = threading.Event()
        self.hold.set()
        self.started = threading.Semaphore(0)
        self.error: Exception | None = None
        self.meta_error: Exception | None = None
        self.order: list[str] = []

    def copy_from(self, source: ObjectStore, key: str, *,
                  storage_class: str | None = None) -> None:
        self.order.append(key)
        if key.endswith(".json"):        # the topic's metadata: see test_metadata_*
            if self.meta_error is not None:
                raise self.meta_error
            super().copy_from(source, key, storage_class=storage_class)
            return
        self.started.release()
        assert self.hold.wait(10)
        if self.error is not None:
            raise self.error
        super().copy_from(source, key, storage_class=storage_class)


def key(start: int) -> SegmentKey:
    return SegmentKey("data", "r1", "t", 0, 0, start, start + 9)


def total(metrics: Metrics, name: str) -> float:
    return metrics.total(f"replicator_egress_mirror_{name}")


@pytest.fixture
def h() -> Iterator[tuple[Harness, Destination, SegmentMirror]]:
    harness = Harness()
    dest = Destination()
    mirror = SegmentMirror(harness.store, dest, metrics=harness.m, region="r1", threads=1,
                           max_pending=4)
    harness.ctx = replace(harness.ctx, mirror=mirror.submit)
    harness.writer.ctx = harness.ctx
    yield harness, dest, mirror
    dest.hold.set()
    mirror.close(5)
    harness.close()


def segment(h: Harness, start: int) -> None:
    h.writer.append(messages(records(range(start, start + 3))), now=0.0)
    h.writer.close(CloseReason.AGE)


def wait_until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def wait_idle(mirror: SegmentMirror) -> None:
    assert mirror.close(10) == 0


def test_each_published_segment_is_copied_with_identical_bytes(
        h: tuple[Harness, Destination, SegmentMirror]) -> None:
    harness, dest, mirror = h
    segment(harness, 0)
    segment(harness, 3)
    harness.settle()
    wait_idle(mirror)
    assert harness.commits == [3, 6]
    finals = harness.final_keys()
    assert len(finals) == 2 and dest.keys() == finals
    for k in finals:
        assert dest.get(k) == harness.store.get(k)
        assert dest.head(k).storage_class == "STANDARD"      # level 0's class
    assert total(harness.metrics, "copies_total") == 2
    assert harness.metrics.total("replicator_egress_mirror_copy_seconds_count") == 2
    assert total(harness.metrics, "failures_total") == 0


def test_the_commit_does_not_wait_for_a_copy_that_hangs(
        h: tuple[Harness, Destination, SegmentMirror]) -> None:
    harness, dest, mirror = h
    dest.hold.clear()                    # the destination region does not answer
    segment(harness, 0)
    harness.settle()
    assert dest.started.acquire(timeout=10)
    assert harness.commits == [3] and dest.keys() == []
    assert mirror.pending == 1
    dest.hold.set()
    wait_idle(mirror)
    assert dest.keys() == harness.final_keys()


@pytest.mark.parametrize("error", [StorageError("destination endpoint timed out"),
                                   StorageFatalError("AccessDenied"), RuntimeError("bug")])
def test_a_failed_copy_is_a_warning_with_the_key_and_counted_nothing_else(
        h: tuple[Harness, Destination, SegmentMirror], error: Exception,
        caplog: pytest.LogCaptureFixture) -> None:
    harness, dest, mirror = h
    dest.error = error
    with caplog.at_level(logging.WARNING, logger="egress.mirror"):
        segment(harness, 0)
        harness.settle()
        wait_idle(mirror)
    final = harness.final_keys()
    assert harness.commits == [3] and len(final) == 1 and dest.keys() == []
    assert harness.writer.failed is None                       # the partition goes on
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(final[0] in w and str(error) in w for w in warnings)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert harness.metrics.value("replicator_egress_mirror_failures_total",
                                 {"region": "r1", "topic": "t"}) == 1
    assert total(harness.metrics, "copies_total") == 0


def test_a_full_queue_drops_the_copy_with_a_warning_rather_than_block(
        caplog: pytest.LogCaptureFixture) -> None:
    source, dest = MemoryObjectStore("src"), Destination()
    metrics = Metrics()
    mirror = SegmentMirror(source, dest, metrics=EgressMetrics(metrics), region="r1",
                           threads=1, max_pending=2)
    for start in (0, 10, 20):
        source.put(key(start).to_key(), b"seg%d" % start)
    dest.hold.clear()
    try:
        assert mirror.submit(key(0)) and mirror.submit(key(10))     # one running, one queued
        with caplog.at_level(logging.WARNING, logger="egress.mirror"):
            assert not mirror.submit(key(20))                       # returns at once
        assert any(key(20).to_key() in r.getMessage() and "max_pending" in r.getMessage()
                   for r in caplog.records)
        assert total(metrics, "dropped_total") == 1
        assert metrics.value("replicator_egress_mirror_pending", {"region": "r1"}) == 2
    finally:
        dest.hold.set()
    assert mirror.close(10) == 0
    assert dest.keys() == [key(0).to_key(), key(10).to_key()]
    assert total(metrics, "copies_total") == 2
    assert metrics.value("replicator_egress_mirror_pending", {"region": "r1"}) == 0
    assert not mirror.submit(key(20))                               # closed: not taken


def test_shutdown_abandons_the_queued_copies_after_its_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    source, dest = MemoryObjectStore("src"), Destination()
    metrics = Metrics()
    mirror = SegmentMirror(source, dest, metrics=EgressMetrics(metrics), region="r1",
                           threads=1, max_pending=10)
    dest.hold.clear()                    # the destination hangs: one copy runs, two queue
    for start in (0, 10, 20):
        source.put(key(start).to_key(), b"seg%d" % start)
        assert mirror.submit(key(start))
    assert dest.started.acquire(timeout=10)
    with caplog.at_level(logging.WARNING, logger="egress.mirror"):
        assert mirror.close(0.2) == 3
    assert any("3 segment copies" in r.getMessage() and "abandoned" in r.getMessage()
               for r in caplog.records)
    dest.hold.set()                      # the copy already sent finishes by itself ...
    wait_until(lambda: mirror.pending == 0)
    assert dest.keys() == [key(0).to_key()]    # ... the queued ones never start
    assert total(metrics, "copies_total") == 1
    assert total(metrics, "dropped_total") == 2


def test_shutdown_waits_for_pending_copies_within_its_timeout() -> None:
    source, dest = MemoryObjectStore("src"), Destination()
    metrics = Metrics()
    mirror = SegmentMirror(source, dest, metrics=EgressMetrics(metrics), region="r1",
                           threads=2, max_pending=10)
    for start in range(0, 100, 10):
        source.put(key(start).to_key(), b"x" * start)
        assert mirror.submit(key(start))
    assert mirror.close(10) == 0
    assert len(dest.keys()) == 10
    assert total(metrics, "copies_total") == 10


def test_the_destination_client_is_the_destination_regions() -> None:
    from egress.mirror import make_mirror
    from replicator.core.settings import load_settings

    base = {"region": "us-east-1", "s3": {"bucket": "src-bucket"},
            "kafka": {"brokers": "k:9092"}, "egress": {"topics": {"t": {}}}}
    m = EgressMetrics(Metrics())
    off = load_settings(data=base, environ={})
    assert make_mirror(off, MemoryObjectStore("src"), m, None) is None
    on = load_settings(data={**base, "egress": {"topics": {"t": {}}, "mirror": {
        "bucket": "dest-bucket", "region": "us-west-2", "endpoint_url": "http://127.0.0.1:9",
        "threads": 3, "max_pending": 5}}}, environ={})
    mirror = make_mirror(on, MemoryObjectStore("src"), m, "STANDARD_IA")
    assert mirror is not None
    try:
        dest: Any = mirror.destination
        assert dest.bucket == "dest-bucket"
        assert dest.client.meta.region_name == "us-west-2"
        assert dest.client.meta.endpoint_url == "http://127.0.0.1:9"
        assert (mirror.max_pending, mirror.storage_class) == (5, "STANDARD_IA")
        # Short timeouts, few attempts: a stalled destination costs a copy seconds, not
        # botocore's 60 s read timeout x 3 attempts.
        config = dest.client.meta.config
        assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT,
                                                                 READ_TIMEOUT)
        assert config.retries["total_max_attempts"] == MAX_ATTEMPTS <= 2
        assert READ_TIMEOUT <= 15
    finally:
        mirror.close(0)


META = topic_meta_key("data", "r1", "t")
CHAIN = chain_key("data", "r1", "t")


def test_metadata_is_copied_before_the_topics_first_segment_and_after_each_write() -> None:
    """A mirrored segment never reaches the destination before the ``_topic.json`` that
    records where its partition's history begins: ingress starting a partition without a
    checkpoint at the mirrored segment would report the positions below it NOT replayed
    when the first segment's copy was dropped and S3 replication is slow."""
    source, dest = MemoryObjectStore("src"), Destination()
    metrics = Metrics()
    mirror = SegmentMirror(source, dest, metrics=EgressMetrics(metrics), region="r1",
                           threads=2, max_pending=10)
    source.put(CHAIN, b"chain-1")
    source.put(META, b"meta-1")
    for start in (0, 10, 20):
        source.put(key(start).to_key(), b"seg%d" % start)
    assert mirror.submit(key(0))
    wait_until(lambda: mirror.pending == 0)
    assert dest.order == [CHAIN, META, key(0).to_key()]
    assert mirror.submit(key(10))                 # no write since: the segment alone
    wait_until(lambda: mirror.pending == 0)
    assert dest.order[3:] == [key(10).to_key()]
    source.put(META, b"meta-2")                   # egress records another first position
    mirror.metadata_written("data", "r1", "t")
    assert mirror.submit(key(20))
    assert mirror.close(10) == 0
    assert dest.order[4:] == [CHAIN, META, key(20).to_key()]
    assert dest.get(META) == b"meta-2" and dest.get(CHAIN) == b"chain-1"
    assert total(metrics, "copies_total") == 3


def test_a_failed_metadata_copy_keeps_the_segment_out_until_one_succeeds(
        caplog: pytest.LogCaptureFixture) -> None:
    source, dest = MemoryObjectStore("src"), Destination()
    metrics = Metrics()
    mirror = SegmentMirror(source, dest, metrics=EgressMetrics(metrics), region="r1",
                           threads=1, max_pending=10)
    source.put(META, b"meta")                     # no _incarnations.json: skipped
    for start in (0, 10):
        source.put(key(start).to_key(), b"seg%d" % start)
    dest.meta_error = StorageError("destination endpoint timed out")
    with caplog.at_level(logging.WARNING, logger="egress.mirror"):
        assert mirror.submit(key(0))
        wait_until(lambda: total(metrics, "failures_total") == 1)
    assert dest.keys() == []
    assert any(key(0).to_key() in r.getMessage() and "metadata" in r.getMessage()
               for r in caplog.records)
    dest.meta_error = None
    assert mirror.submit(key(10))
    assert mirror.close(10) == 0
    assert dest.keys() == sorted([META, key(10).to_key()])
    assert dest.order.index(META) < dest.order.index(key(10).to_key())


EXIT_CHILD = r'''
import threading
from egress.metrics import EgressMetrics
from egress.mirror import SegmentMirror
from replicator.core.keys import SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.storage import MemoryObjectStore

class Hangs(MemoryObjectStore):
    def copy_from(self, source, key, *, storage_class=None):
        print("copy sent", flush=True)
        threading.Event().wait()      # a destination region that never answers

src = MemoryObjectStore("src")
k = SegmentKey("data", "r1", "t", 0, 0, 0, 9)
src.put(k.to_key(), b"x")
m = SegmentMirror(src, Hangs("dst"), metrics=EgressMetrics(Metrics()), region="r1")
m.submit(k)
while m.pending and not m.close(0.2):
    pass
print("closed", flush=True)
'''


def test_a_copy_hanging_on_the_destination_does_not_hold_the_process_exit() -> None:
    """Egress's exit is bounded by ``shutdown_timeout``, not by a copy in flight: the
    mirror's workers are daemon threads (``concurrent.futures`` joins its workers at
    interpreter exit, which made a stalled destination hold the exit for the client's
    timeouts x attempts). The copy here never returns: without daemon threads the child
    never exits and ``subprocess.run`` raises ``TimeoutExpired``."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", EXIT_CHILD], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "copy sent" in done.stdout and "closed" in done.stdout


def test_a_metadata_write_during_its_copy_is_copied_again_before_the_next_segment() -> None:
    """Egress records a first position while the mirror copies the previous ``_topic.json``
    (which may have read the old bytes): the next segment of the topic waits for that copy
    and then copies the metadata again, never after the old copy alone."""
    class SlowMeta(Destination):
        def __init__(self) -> None:
            super().__init__()
            self.meta_hold = threading.Event()
            self.meta_started = threading.Event()

        def copy_from(self, source: ObjectStore, key: str, *,
                      storage_class: str | None = None) -> None:
            if key == META and not self.meta_hold.is_set():
                data = source.get(key)              # reads the old bytes ...
                self.meta_started.set()
                assert self.meta_hold.wait(10)      # ... and lands after the write
                self.order.append(key)
                MemoryObjectStore.put(self, key, data)
                return
            super().copy_from(source, key, storage_class=storage_class)

    source, dest = MemoryObjectStore("src"), SlowMeta()
    mirror = SegmentMirror(source, dest, metrics=EgressMetrics(Metrics()), region="r1",
                           threads=2, max_pending=10)
    source.put(META, b"meta-1")
    for start in (0, 10):
        source.put(key(start).to_key(), b"seg%d" % start)
    assert mirror.submit(key(0))
    assert dest.meta_started.wait(10)
    source.put(META, b"meta-2")                   # the first position of partition 0's ...
    mirror.metadata_written("data", "r1", "t")
    assert mirror.submit(key(10))                 # ... next segment
    dest.meta_hold.set()
    assert mirror.close(10) == 0
    assert dest.get(META) == b"meta-2"
    assert dest.order[:dest.order.index(key(10).to_key())].count(META) == 2
