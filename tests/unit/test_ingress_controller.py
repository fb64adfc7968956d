"""Controller placement logic with in-memory seams (no broker): which workers run where."""

from __future__ import annotations

import json
import time
from typing import Any, cast

from ingress.checkpoints import MemoryCheckpointStore
from ingress.controller import Ingress
from ingress.segment_events import MemorySegmentEvents
from ingress.sink import MemorySink
from replicator.core.settings import load_settings
from replicator.core.storage import MemoryObjectStore
from tests.unit.test_ingress_topics import FakeAdmin


class FakeConsumer:
    def __init__(self) -> None:
        self.subscriptions: list[list[str]] = []

    def subscribe(self, topics: list[str], **kw: Any) -> None:
        self.subscriptions.append(topics)

    def unsubscribe(self) -> None:
        self.subscriptions.append([])

    def close(self) -> None:
        return


def subscriptions(ing: Ingress) -> list[list[str]]:
    return cast(FakeConsumer, ing.consumer).subscriptions


def make(sources: list[dict[str, Any]]) -> tuple[Ingress, MemoryObjectStore, FakeAdmin]:
    settings = load_settings(data={
        "region": "us-west-1", "s3": {"bucket": "b"}, "kafka": {"brokers": "x:1"},
        "metrics": {"port": 0},
        "ingress": {"sqs_queue": "q", "sources": sources, "rescan_interval": "1h"}},
        environ={})
    store = MemoryObjectStore("b")
    admin = FakeAdmin()
    checkpoints = MemoryCheckpointStore()
    ing = Ingress(settings, store=store, events=MemorySegmentEvents(), checkpoints=checkpoints,
                  admin=admin, make_sink=lambda src, topic, p: MemorySink(checkpoints))
    ing.consumer = FakeConsumer()  # type: ignore[assignment]
    return ing, store, admin


def meta(store: MemoryObjectStore, region: str, topic: str, partitions: int) -> None:
    store.put(f"data/{region}/{topic}/_topic.json",
              json.dumps({"partitions": partitions}).encode())


def test_two_sources_aggregated_into_one_topic() -> None:
    ing, store, admin = make([
        {"region": "us-east-1", "topic": "t", "destination_topic": "all"},
        {"region": "eu-west-1", "topic": "t", "destination_topic": "all"}])
    try:
        ing._check_topics()
        assert subscriptions(ing) == []  # nothing known yet: nothing subscribed
        meta(store, "us-east-1", "t", 2)
        meta(store, "eu-west-1", "t", 4)
        ing._check_topics()
        assert admin.topics == {"all": 4}  # created for the larger source
        assert not any(st.stopped for st in ing.sources.values())
        assert subscriptions(ing) == [["all"]]
    finally:
        ing.close()


def test_placement_follows_assignment_and_partition_counts() -> None:
    ing, store, admin = make([
        {"region": "us-east-1", "topic": "t", "destination_topic": "all"},
        {"region": "eu-west-1", "topic": "u", "destination_topic": "all"}])
    try:
        admin.topics["all"] = 4
        admin.can_grow = False
        meta(store, "us-east-1", "t", 2)
        meta(store, "eu-west-1", "u", 4)
        ing._check_topics()
        assert subscriptions(ing) == [["all"]]
        ing.assigned = {("all", 1), ("all", 3)}
        ing._reconcile()
        assert sorted(ing.workers) == [("eu-west-1", "u", 1), ("eu-west-1", "u", 3),
                                       ("us-east-1", "t", 1)]
        ing.assigned = {("all", 3)}
        ing._reconcile()
        assert sorted(ing.workers) == [("eu-west-1", "u", 3)]
    finally:
        ing.close()


def test_source_with_too_few_destination_partitions_stops_and_resumes() -> None:
    ing, store, admin = make([{"region": "us-east-1", "topic": "t"}])
    try:
        admin.topics["t"] = 2
        meta(store, "us-east-1", "t", 3)
        ing._check_topics()
        ing._check_topics()
        st = ing.sources[("us-east-1", "t")]
        assert st.stopped == "t has 2 partition(s), the source 3"
        assert ing.metrics.value("replicator_ingress_source_errors_total",
                                 {"region": "us-east-1", "topic": "t",
                                  "reason": "partitions"}) == 1  # counted once
        assert subscriptions(ing) == []
        admin.topics["t"] = 3  # an operator added partitions
        ing._check_topics()
        assert st.stopped is None and subscriptions(ing) == [["t"]]
        assert ing.metrics.value("replicator_ingress_source_stopped",
                                 {"region": "us-east-1", "topic": "t"}) == 0
    finally:
        ing.close()


def test_a_stalled_partition_makes_readyz_false() -> None:
    ing, store, admin = make([{"region": "us-east-1", "topic": "t"}])
    try:
        admin.topics["t"] = 1
        meta(store, "us-east-1", "t", 1)
        ing._check_topics()
        ing._started = True
        ing.assigned = {("t", 0)}
        ing._reconcile()
        assert ing.ready()
        ing.workers[("us-east-1", "t", 0)].status.stalled = True
        assert not ing.ready() and ing.stalled() == [("us-east-1", "t", 0)]
        ing.workers[("us-east-1", "t", 0)].status.stalled = False
        assert ing.ready()
    finally:
        ing.close()


def replaying_unacknowledged(revoke_timeout: str) -> tuple[Ingress, MemorySink]:
    """An at-least-once process replaying one 100-record segment into ``t[0]`` while the
    broker does not acknowledge (slow, or cut off): 20 records or more stay queued."""
    from formats.base import SegmentMetadata, WriterOptions
    from formats.records import Record, records_to_batch
    from formats.registry import get_format
    from formats.segment_io import SegmentUpload, publish_segment
    from replicator.core.keys import SegmentKey

    settings = load_settings(data={
        "region": "us-west-1", "s3": {"bucket": "b"}, "kafka": {"brokers": "x:1"},
        "metrics": {"port": 0},
        "ingress": {"sqs_queue": "q", "sources": [{"region": "us-east-1", "topic": "t",
                                                    "first_segment_delay": "0s"}],
                    "rescan_interval": "1h", "revoke_timeout": revoke_timeout,
                    "batch_size": 10, "delivery": "at-least-once"}}, environ={})
    store = MemoryObjectStore("b")
    key = SegmentKey("data", "us-east-1", "t", 0, 0, 0, 99)
    up = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    up.write_batch(records_to_batch([Record(o, 1, b"k", b"v", (), 1) for o in range(100)]))
    publish_segment(store, up.finish(SegmentMetadata.for_key(key, 100)).key, key)
    admin = FakeAdmin()
    admin.topics["t"] = 1
    checkpoints = MemoryCheckpointStore()
    sink = MemorySink(checkpoints, transactional=False, ack_per_poll=0)
    ing = Ingress(settings, store=store, events=MemorySegmentEvents(), checkpoints=checkpoints,
                  admin=admin, make_sink=lambda src, topic, p: sink)
    ing.consumer = FakeConsumer()  # type: ignore[assignment]
    try:
        meta(store, "us-east-1", "t", 1)
        ing._check_topics()
        ing.assigned = {("t", 0)}
        ing._reconcile()
        deadline = time.monotonic() + 5
        while len(sink.in_flight) < 20:
            assert time.monotonic() < deadline, sink.in_flight
            time.sleep(0.01)
    except BaseException:
        ing.close()
        raise
    return ing, sink


def test_a_worker_that_misses_the_revoke_deadline_is_purged_before_release() -> None:
    """At-least-once: the idempotent producer of a worker still busy at the revoke deadline
    must deliver nothing once the partition is released (was: its queued records were
    still delivered beside the new owner's)."""
    ing, sink = replaying_unacknowledged("300ms")
    try:
        ing.assigned = set()
        ing._reconcile()          # the revoke: the worker waits for acknowledgements
        # The partition is released now. The old producer must not deliver anything more
        # even once the broker answers again.
        sink.ack_per_poll = None
        time.sleep(0.5)
        assert sink.committed == []
    finally:
        ing.close()


def test_lost_at_least_once_partitions_are_purged_at_once_not_after_the_deadline() -> None:
    """A member whose session expired may have been replaced already: its at-least-once
    records still queued must not reach the partition during ``revoke_timeout`` (was: lost
    partitions were handled like a revoke, waiting up to the deadline for
    acknowledgements while the new owner wrote the same partition)."""
    from replicator.core.kafka import TopicPartition

    ing, sink = replaying_unacknowledged("30s")
    try:
        began = time.monotonic()
        ing._on_lost(cast(Any, ing.consumer), [TopicPartition("t", 0)])
        assert time.monotonic() - began < 15, "waited for the revoke deadline"
        assert ing.workers == {} and ing.assigned == set()
        sink.ack_per_poll = None   # the broker answers again: nothing may be delivered
        time.sleep(0.5)
        assert sink.committed == []
    finally:
        ing.close()


def test_hundreds_of_idle_partitions_run_on_a_bounded_pool_and_replay_when_segments_come(
        ) -> None:
    """No Python thread per owned partition: 240 idle workers add only the replay pool's
    threads, and each replays its segment once its event arrives."""
    import threading

    from formats.base import SegmentMetadata, WriterOptions
    from formats.records import Record, records_to_batch
    from formats.registry import get_format
    from formats.segment_io import SegmentUpload, publish_segment
    from ingress.events import SegmentEvent
    from replicator.core.keys import SegmentKey

    n = 240
    settings = load_settings(data={
        "region": "us-west-1", "s3": {"bucket": "b"}, "kafka": {"brokers": "x:1"},
        "metrics": {"port": 0},
        "ingress": {"sqs_queue": "q", "sources": [{"region": "us-east-1", "topic": "t",
                                                    "first_segment_delay": "0s"}],
                    "rescan_interval": "1h", "max_parallel_replays": 4}}, environ={})
    store = MemoryObjectStore("b")
    admin = FakeAdmin()
    admin.topics["t"] = n
    checkpoints = MemoryCheckpointStore()
    sinks: dict[int, MemorySink] = {}

    def make_sink(src: Any, topic: str, p: int) -> MemorySink:
        return sinks.setdefault(p, MemorySink(checkpoints))

    ing = Ingress(settings, store=store, events=MemorySegmentEvents(), checkpoints=checkpoints,
                  admin=admin, make_sink=make_sink)
    ing.consumer = FakeConsumer()  # type: ignore[assignment]
    peak = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.005):
            peak[0] = max(peak[0], threading.active_count())

    sampler = threading.Thread(target=sample)
    before = threading.active_count() + 1          # with the sampler
    sampler.start()
    try:
        meta(store, "us-east-1", "t", n)
        ing._check_topics()
        ing.assigned = {("t", p) for p in range(n)}
        ing._reconcile()
        assert len(ing.workers) == n
        fmt = get_format("parquet")
        for p in range(n):
            key = SegmentKey("data", "us-east-1", "t", p, 0, 0, 9)
            up = SegmentUpload(store, fmt, "temp", WriterOptions())
            up.write_batch(records_to_batch([Record(o, 1, b"k", b"v%d" % p, (), 1)
                                             for o in range(10)]))
            publish_segment(store, up.finish(SegmentMetadata.for_key(key, 10)).key, key)
            ing._dispatch(SegmentEvent("created", key))
        deadline = time.monotonic() + 60
        while not all(len(s.committed) == 10 for s in sinks.values()) or len(sinks) < n:
            assert time.monotonic() < deadline, sum(len(s.committed) for s in sinks.values())
            time.sleep(0.05)
        assert all([r[0] for r in s.committed] == list(range(10)) for s in sinks.values())
        # The pool, plus one read-ahead thread per replay in progress (max_parallel_replays).
        assert peak[0] - before <= ing.scheduler.size + 4, (peak[0], before)
        assert ing.scheduler.size == 4 + 4
    finally:
        sampling.set()
        sampler.join(5)
        ing.close()


def test_a_failed_checkpoint_reader_makes_healthz_false() -> None:
    """Was: a checkpoint reader ended by an error left /healthz true while every session of
    every partition failed for the life of the process; unhealthy, it is restarted."""
    class Reader:
        failed = False

        def close(self) -> None:
            return

    ing, _store, _admin = make([{"region": "us-east-1", "topic": "t"}])
    reader = Reader()
    ing._checkpoint_reader = cast(Any, reader)
    try:
        assert ing.healthy()
        reader.failed = True
        assert not ing.healthy() and not ing.ready()
    finally:
        ing.close()


def test_a_worker_stopped_without_a_revoke_gives_up_its_epoch() -> None:
    """Exactly-once: a worker stopped while its partition stays owned (its source no longer
    wanted, the partition count changed) must lose its ownership epoch, and the worker
    started for the same partition later must get another. Was: both had the grant's
    epoch, so a batch of the stopped worker still waiting in a transaction could commit
    beside the new worker's."""
    ing, store, admin = make([{"region": "us-east-1", "topic": "t"}])
    try:
        admin.topics["t"] = 1
        meta(store, "us-east-1", "t", 1)
        ing._check_topics()
        ing._started = True
        ing.assigned = {("t", 0)}
        ing.ownership.grant([("t", 0)])
        epochs: list[int | None] = []
        real = ing.ownership.epoch

        def epoch(tp: tuple[str, int]) -> int | None:
            epochs.append(real(tp))
            return epochs[-1]

        ing.ownership.epoch = epoch  # type: ignore[method-assign]
        ing._reconcile()
        assert len(epochs) == 1 and epochs[0] is not None
        st = ing.sources[("us-east-1", "t")]
        st.stopped = "stopped by the test"
        ing._reconcile()                        # stopped, the partition still owned
        assert ing.workers == {}
        assert not ing.ownership.owns(("t", 0), epochs[0])
        st.stopped = None
        ing._reconcile()                        # a new worker for the same partition
        assert len(epochs) == 2 and epochs[1] is not None and epochs[1] != epochs[0]
        assert ing.ownership.owns(("t", 0), epochs[1])
        assert not ing.ownership.owns(("t", 0), epochs[0])
    finally:
        ing.close()
