"""Active-active with the origin marker: regions A and B both produce to one topic name and
replicate it both ways (docs/architecture.md, "Origin marker"; docs/topologies.md).

Region A is the session's source broker, region B its destination broker; each region has
its bucket and queue. Each egress writes its segments straight into the other region's
bucket (what S3 replication of its own bucket does, without the lag), whose notifications
reach that region's ingress. Ingress marks what it replays
(``mark_origin = true``), egress skips what was replicated from the other region
(``skip_origins``): each region ends with both regions' records exactly once, in order per
source partition, and nothing comes back. With the skip off, records go round.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from itertools import pairwise
from typing import Any

from egress.controller import Egress
from replicator.core.kafka import Admin, Producer, read_to_end
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import KafkaSettings, Settings, load_settings
from replicator.core.sqs import SqsQueue, make_sqs_client
from replicator.devstack.aws import create_bucket, create_queue, set_bucket_notifications
from tests.conftest import FAST_GROUP_CONFIG, RECENT_MS, unique_name
from tests.integration.pipeline import (
    CREDS,
    DEST_REGION,
    SOURCE_REGION,
    Pipeline,
    running_egress,
    running_ingress,
    wait_for,
)

A, B = SOURCE_REGION, DEST_REGION
HEADER = "replicator.origin"
PARTITIONS = 2
PER_REGION = 60


class Region:
    """One region of the pair: its broker, its bucket and queue, its settings."""

    def __init__(self, pipe: Pipeline, name: str, brokers: str, bucket: str, queue: str,
                 *, skip: bool) -> None:
        self.pipe, self.name, self.brokers, self.skip = pipe, name, brokers, skip
        self.bucket, self.queue = bucket, queue
        self.other = B if name == A else A
        self.peer_bucket = ""
        """The other region's bucket, where this region's egress writes (replication
        with no lag)."""
        self.kafka = KafkaSettings(brokers=brokers, config=dict(FAST_GROUP_CONFIG))

    def _base(self, bucket: str) -> dict[str, Any]:
        return {"region": self.name,
                "s3": {"bucket": bucket, "endpoint_url": self.pipe.moto, **CREDS},
                "kafka": {"brokers": self.brokers, "config": dict(FAST_GROUP_CONFIG)},
                "metrics": {"port": 0}}

    def egress_settings(self) -> Settings:
        return load_settings(data={**self._base(self.peer_bucket), "egress": {
            "group_id": self.pipe.egress_group, "shutdown_timeout": "10s",
            "topic_metadata_interval": "1s",
            "skip_origins": [self.other] if self.skip else [],
            "topics": {self.pipe.topic: {"max_segment_messages": 25,
                                         "max_segment_age": "500ms"}}}}, environ={})

    def ingress_settings(self) -> Settings:
        return load_settings(data={**self._base(self.bucket), "ingress": {
            "group_id": self.pipe.ingress_group, "sqs_queue": self.queue,
            "segment_events_topic": self.pipe.events_topic,
            "checkpoint_topic": self.pipe.checkpoint_topic, "batch_size": 20,
            "sqs_wait_time": "1s", "topic_check_interval": "1s", "rescan_interval": "30s",
            "revoke_timeout": "10s", "mark_origin": True,
            "sources": [{"region": self.other, "topic": self.pipe.topic,
                         "lost_segment_timeout": "60s", "first_segment_delay": "2s"}]}},
            environ={})

    def store(self) -> S3ObjectStore:
        """This region's bucket (the other region's segments)."""
        return S3ObjectStore(make_s3_client(endpoint_url=self.pipe.moto, region=self.name,
                                            **CREDS), self.bucket)

    def produce(self) -> None:
        p = Producer(self.kafka)
        for i in range(PER_REGION):
            # One header of the application's own: it must arrive before the marker.
            p.produce(self.pipe.topic, key=f"{self.name}-{i}".encode(),
                      value=f"{self.name}-{i}".encode(), partition=i % PARTITIONS,
                      timestamp=RECENT_MS + i, headers=[("app", b"x")])
        p.flush(30)

    def read(self) -> list[Any]:
        return list(read_to_end(self.kafka, self.pipe.topic, timeout=30))


@contextmanager
def _both_ways(pipe: Pipeline, *, skip: bool) -> Iterator[tuple[Region, Region, list[Egress]]]:
    # Region B is the pipeline's bucket and queue (us-west-1); region A gets its own in
    # us-east-1 (S3 notifies queues of the bucket's region only).
    bucket_a, queue_a = unique_name("bucket-a"), unique_name("queue-a")
    s3 = make_s3_client(endpoint_url=pipe.moto, region=A, **CREDS)
    sqs = make_sqs_client(endpoint_url=pipe.moto, region=A, **CREDS)
    create_bucket(s3, bucket_a, A)
    create_queue(sqs, queue_a)
    set_bucket_notifications(s3, bucket_a, SqsQueue(sqs, queue_a).arn, prefix="data/")
    a = Region(pipe, A, pipe.source_brokers, bucket_a, queue_a, skip=skip)
    b = Region(pipe, B, pipe.dest_brokers, pipe.bucket, pipe.queue, skip=skip)
    a.peer_bucket, b.peer_bucket = b.bucket, a.bucket
    for r in (a, b):
        assert Admin(r.kafka).create_topic(pipe.topic, PARTITIONS)
    with ExitStack() as stack:
        egresses = [stack.enter_context(running_egress(Egress(r.egress_settings(),
                                                              store=peer.store())))
                    for r, peer in ((a, b), (b, a))]
        for r in (a, b):
            stack.enter_context(running_ingress(r.ingress_settings()))
        yield a, b, egresses


def _values(msgs: list[Any]) -> Counter[bytes]:
    return Counter(m.value() for m in msgs)


def _skipped_or_looping(egress: Egress, region: Region) -> Callable[[], bool]:
    def done() -> bool:
        skipped = egress.metrics.total("egress_origin_skipped_total", origin=region.other)
        return skipped >= PER_REGION or max(_values(region.read()).values()) > 1
    return done


def _touching(region: Region) -> bool:
    """The segments of the other region, in this region's bucket, touch."""
    store = region.store()
    for p in range(PARTITIONS):
        prefix = PartitionRef("data", region.other, region.pipe.topic, p).segments_prefix()
        keys = sorted((k.start, k.end) for o in store.list(prefix)
                      if (k := SegmentKey.try_parse(o.key)) is not None)
        if any(nxt[0] != prev[1] + 1 for prev, nxt in pairwise(keys)):
            return False
    return True


def test_both_regions_end_with_every_record_once_and_nothing_loops(pipe: Pipeline) -> None:
    want = {f"{r}-{i}".encode() for r in (A, B) for i in range(PER_REGION)}
    with _both_ways(pipe, skip=True) as (a, b, egresses):
        a.produce()
        b.produce()
        wait_for(lambda: set(_values(a.read())) == want and set(_values(b.read())) == want,
                 45, "both regions' records in both regions")
        # Each egress has seen the other region's records come in and left them out (had
        # it copied them, they would be on their way back: the wait ends then too, and
        # the counts below fail).
        for e, r in zip(egresses, (a, b), strict=True):
            wait_for(_skipped_or_looping(e, r), 30,
                     f"{r.name}'s egress skipping the records replicated from {r.other}")
        # Whatever was written to the bucket is replayed by now: nothing more arrives.
        wait_for(lambda: all(sum(1 for _ in r.read()) == 2 * PER_REGION for r in (a, b)),
                 10, "no extra records")
        for region in (a, b):
            msgs = region.read()
            assert _values(msgs) == Counter(want), region.name   # each exactly once
            own = [m for m in msgs if m.value().startswith(region.name.encode())]
            came = [m for m in msgs if not m.value().startswith(region.name.encode())]
            assert {tuple(m.headers() or ()) for m in own} == {(("app", b"x"),)}
            assert {tuple(m.headers() or ()) for m in came} == \
                {(("app", b"x"), (HEADER, region.other.encode()))}
            # Per source partition, in the source's order.
            order: dict[int, list[int]] = defaultdict(list)
            for m in came:
                assert m.partition() == int(m.value().rsplit(b"-", 1)[1]) % PARTITIONS
                order[m.partition()].append(int(m.value().rsplit(b"-", 1)[1]))
            assert all(seq == sorted(seq) for seq in order.values()), order
        # Skipped records are holes: every region's segments still touch, so neither
        # ingress nor compaction sees a gap.
        assert _touching(a) and _touching(b)


def test_without_the_skip_records_go_round(pipe: Pipeline) -> None:
    # The guard checked: the same topology with skip_origins empty copies replicated
    # records back, so records arrive twice (and would keep circling).
    with _both_ways(pipe, skip=False) as (a, _b, _):
        a.produce()
        wait_for(lambda: max(_values(a.read()).values(), default=0) >= 2, 45,
                 "region A's records coming back to A")
        back = [m for m in a.read() if (m.headers() or []).count((HEADER, B.encode()))]
        assert back and all((HEADER, A.encode()) in (m.headers() or []) for m in back)
