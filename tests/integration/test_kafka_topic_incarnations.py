"""A source topic deleted and created again while egress and ingress run, on Apache Kafka.

The new topic (a new topic id, offsets from 0 again) is archived in its own location, so
no object of the first one changes; ingress replays its records after every record of
the first one into the same destination partitions (docs/architecture.md, "Topic
incarnations").
"""

from __future__ import annotations

import logging
from collections import defaultdict

import pytest

from egress.controller import Egress
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, Producer, read_to_end
from replicator.core.wire import TopicMetadata
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    running_egress,
    running_ingress,
    topic_id_of,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 2
OLD, NEW = 30, 25


def produce(pipe: Pipeline, tag: str, n: int) -> None:
    p = Producer(pipe.source_kafka)
    for part in range(PARTITIONS):
        for i in range(n):
            p.produce(pipe.topic, value=f"{tag}-{part}-{i}".encode(), partition=part)
    assert p.flush(30) == 0
    assert not p.take_failures()


def destination(pipe: Pipeline) -> dict[int, list[bytes | None]]:
    out: dict[int, list[bytes | None]] = defaultdict(list)
    for m in read_to_end(pipe.dest_kafka, pipe.dest_topic, timeout=30):
        part = m.partition()
        assert part is not None
        out[part].append(m.value())
    return dict(out)


def archive(pipe: Pipeline) -> dict[str, tuple[str, bytes]]:
    prefix = f"data/{SOURCE_REGION}/{pipe.topic}/"
    return {o.key: (o.etag, pipe.store.get(o.key)) for o in pipe.store.list(prefix)
            if not o.key.endswith(("_topic.json", "_incarnations.json"))
            and "/_groups/" not in o.key}


def test_a_recreated_source_topic_is_replayed_after_the_old_one(
        pipe: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    admin = Admin(pipe.source_kafka)
    pipe.create_source(PARTITIONS)
    first_id = topic_id_of(admin, pipe.topic)
    produce(pipe, "old", OLD)
    egress = Egress(pipe.egress_settings(max_segment_messages=10), store=pipe.store)
    with caplog.at_level(logging.WARNING), running_egress(egress), \
            running_ingress(pipe.ingress_settings()) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing) == {p: OLD - 1 for p in
                                                          range(PARTITIONS)},
                 60, "the first topic replayed")
        before = archive(pipe)
        assert before and all("/_incarnations/" not in k for k in before)
        admin.delete_topics([pipe.topic])

        def created_again() -> bool:
            try:
                return admin.create_topic(pipe.topic, PARTITIONS)
            except ReplicatorError:
                return False           # still being deleted
        wait_for(created_again, 60, "the topic created again")
        wait_for(lambda: admin.topic_id(pipe.topic) not in (None, first_id), 30,
                 "the new topic id")
        second_id = admin.topic_id(pipe.topic)
        produce(pipe, "new", NEW)
        wait_for(lambda: ing.metrics.total("replicator_ingress_topic_incarnations_total")
                 == PARTITIONS and pipe.checkpoint_offsets(ing) == {
                     p: NEW - 1 for p in range(PARTITIONS)}, 90,
                 "the new topic replayed after the old one")
        assert ing.metrics.total("replicator_ingress_messages_lost_total") == 0
        assert ing.metrics.total("replicator_ingress_messages_skipped_total") == 0
    got = destination(pipe)
    for part in range(PARTITIONS):
        assert got[part] == [f"old-{part}-{i}".encode() for i in range(OLD)] + \
            [f"new-{part}-{i}".encode() for i in range(NEW)]
    after = archive(pipe)
    assert {k: after[k] for k in before} == before       # no object of the first changed
    new_keys = sorted(set(after) - set(before))
    assert new_keys and all(f"/{pipe.topic}/_incarnations/" in k for k in new_keys)
    meta = TopicMetadata.parse(
        pipe.store.get(f"data/{SOURCE_REGION}/{pipe.topic}/_topic.json"), where="t")
    assert [i.topic_id for i in meta.incarnations] == [first_id, second_id]
    assert meta.incarnations[1].previous_ends == {p: OLD - 1 for p in range(PARTITIONS)}
    moved = [r.getMessage() for r in caplog.records if "created again" in r.getMessage()
             and r.name == "ingress.incarnations"]
    assert len(moved) == PARTITIONS and all(str(second_id) in m for m in moved)
