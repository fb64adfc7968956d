"""A topic deleted and created again while egress, with `start = "latest"`, is down, on
Apache Kafka (docs/configuration.md, "Where replication starts"; docs/architecture.md,
"Topic incarnations"). Kafka deletes a deleted topic's group offsets with it, so the new
topic's partitions have no commit: `latest` is for seeding a deployment, and a new
incarnation of a topic already archived is copied from its oldest record. Found by an
adversarial review: `latest` applied again, and the records produced to the new topic
before egress came back were never archived.
"""

from __future__ import annotations

import json

import pytest

from egress.controller import Egress
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, Producer
from replicator.core.keys import SegmentKey
from replicator.core.wire import TopicMetadata
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    running_egress,
    topic_id_of,
    wait_for,
)
from tests.integration.test_egress import segment_keys

pytestmark = pytest.mark.apache


def produce(pipe: Pipeline, tag: str, n: int) -> None:
    p = Producer(pipe.source_kafka)
    for i in range(n):
        p.produce(pipe.topic, value=f"{tag}{i}".encode(), partition=0)
    assert p.flush(30) == 0


def live_segments(pipe: Pipeline) -> list[SegmentKey]:
    """Partition 0's segments of the live incarnation (under ``_incarnations/``)."""
    prefix = f"data/{SOURCE_REGION}/{pipe.topic}/_incarnations/"
    keys = [SegmentKey.try_parse(o.key) for o in pipe.store.list(prefix)]
    return sorted((k for k in keys if k is not None and k.partition == 0),
                  key=lambda k: k.start)


def test_latest_copies_a_recreated_topic_from_its_oldest_record(pipe: Pipeline) -> None:
    admin = Admin(pipe.source_kafka)
    pipe.create_source(1)
    first_id = topic_id_of(admin, pipe.topic)
    produce(pipe, "history", 20)
    settings = pipe.egress_settings(max_segment_messages=5, start="latest")

    def first_positions() -> dict[str, int]:
        try:
            meta = json.loads(pipe.store.get(f"data/{SOURCE_REGION}/{pipe.topic}/_topic.json"))
        except ReplicatorError:
            return {}
        return dict(meta.get("first_positions") or {})

    def archived() -> int:
        return sum(k.end - k.start + 1 for k in segment_keys(pipe.store, pipe.topic, 0))

    with running_egress(Egress(settings, store=pipe.store)):
        wait_for(lambda: first_positions() == {"0": 20}, 90, "the start at the end of the log")
        produce(pipe, "old", 10)
        wait_for(lambda: archived() == 10, 90, "the first topic's new records archived")
    # Egress is down (an offline upgrade, a crash loop) while the topic is recreated and
    # producers go on writing to the new one.
    admin.delete_topics([pipe.topic])

    def created_again() -> bool:
        try:
            return admin.create_topic(pipe.topic, 1)
        except ReplicatorError:
            return False           # still being deleted
    wait_for(created_again, 60, "the topic created again")
    wait_for(lambda: admin.topic_id(pipe.topic) not in (None, first_id), 30, "the new id")
    produce(pipe, "new", 10)
    with running_egress(Egress(settings, store=pipe.store)):
        produce(pipe, "after", 10)
        wait_for(lambda: sum(k.end - k.start + 1 for k in live_segments(pipe)) >= 10, 90,
                 "the new topic's records in segments")
        wait_for(lambda: sum(k.end - k.start + 1 for k in live_segments(pipe)) >= 20, 60,
                 "every record of the new topic in segments")
    meta = TopicMetadata.parse(
        pipe.store.get(f"data/{SOURCE_REGION}/{pipe.topic}/_topic.json"), where="t")
    live = meta.incarnations[-1]
    assert live.topic_id != first_id
    # The new topic's records, all of them: 0-19 ("new" then "after").
    assert live_segments(pipe)[0].start == 0, (
        f"the new incarnation's archive begins at {live_segments(pipe)[0].start}; "
        f"first positions {live.first_positions}")
    assert sum(k.end - k.start + 1 for k in live_segments(pipe)) == 20
