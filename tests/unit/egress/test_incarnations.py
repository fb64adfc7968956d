"""A source topic deleted and created again: its segments never overwrite the earlier one's.

The first incarnation archived keeps the documented key shape; a later one (a new topic id)
goes below ``{topic}/_incarnations/{id}/``, and ``_topic.json`` lists both, with where the
earlier one's segments of each partition end (docs/architecture.md, "Topic incarnations").
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from egress.metrics import EgressMetrics
from egress.rotation import CloseReason
from egress.topic_meta import TopicMetadataPublisher, with_incarnation
from formats.segment_io import open_segment
from replicator.core.keys import SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.retry import RetryPolicy
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.egress.fakes import Harness, SourceAdmin, messages, records

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def harness(admin: SourceAdmin) -> tuple[Harness, TopicMetadataPublisher, Metrics]:
    h = Harness()
    metrics = Metrics()
    pub = TopicMetadataPublisher(
        ["t"], admin, h.store, prefix="data", region="r1", metrics=EgressMetrics(metrics),
        wall=lambda: NOW, retry_policy=RetryPolicy(attempts=2, initial=timedelta(0)),
        interval=timedelta(minutes=1))
    pub.check()
    h.close()
    h = Harness(store=h.store, first_positions=pub.record_first_position, incarnations=pub)
    return h, pub, metrics


def segment(h: Harness, offsets: range) -> None:
    h.writer.append(messages(records(offsets)), now=0.0)
    h.writer.close(CloseReason.AGE)


def snapshot(h: Harness) -> dict[str, bytes]:
    return {k: h.store.get(k) for k in h.final_keys() if not k.endswith("_topic.json")}


def test_a_recreated_topic_never_overwrites_the_earlier_incarnations_segments() -> None:
    admin = SourceAdmin()
    h, _, metrics = harness(admin)
    try:
        segment(h, range(5))
        segment(h, range(5, 10))
        h.settle()
        before = snapshot(h)
        assert sorted(before) == ["data/r1/t/0/0/00000000000000000000-00000000000000000004",
                                  "data/r1/t/0/0/00000000000000000005-00000000000000000009"]
        # Deleted and created again: a new id, offsets restart at 0 (the same range as the
        # first segment: the same key without incarnations).
        admin.id = "IdB"
        segment(h, range(5))
        h.settle()
        after = snapshot(h)
        assert {k: after[k] for k in before} == before          # not one byte changed
        new = "data/r1/t/_incarnations/IdB/0/0/00000000000000000000-00000000000000000004"
        assert sorted(set(after) - set(before)) == [new]
        with open_segment(h.store, SegmentKey.parse(new)) as r:
            assert r.metadata.topic_id == "IdB"
        with open_segment(h.store, SegmentKey.parse(sorted(before)[0])) as r:
            assert r.metadata.topic_id == "IdA"
        meta = TopicMetadata.parse(h.store.get("data/r1/t/_topic.json"), where="t")
        assert [(i.topic_id, i.label) for i in meta.incarnations] == [("IdA", ""),
                                                                     ("IdB", "IdB")]
        assert meta.incarnations[1].previous_ends == {0: 9}
        assert meta.incarnations[1].first_positions == {0: 0}
        assert json.loads(h.store.get("data/r1/t/_topic.json"))["topic_id"] == "IdB"
        assert metrics.total("egress_topic_incarnations_total") == 1
    finally:
        h.close()


def test_segments_of_the_earlier_topic_still_closing_keep_its_id() -> None:
    admin = SourceAdmin()
    h, _, _ = harness(admin)
    try:
        segment(h, range(5))
        h.settle()
        segment(h, range(5, 10))           # closing, not durable yet
        admin.id = "IdB"                   # the topic is recreated meanwhile
        segment(h, range(3))               # offsets went back: a reset
        h.settle()
        assert sorted(snapshot(h)) == [
            "data/r1/t/0/0/00000000000000000000-00000000000000000004",
            "data/r1/t/0/0/00000000000000000005-00000000000000000009",
            "data/r1/t/_incarnations/IdB/0/0/00000000000000000000-00000000000000000002"]
    finally:
        h.close()


def test_a_segment_waits_while_the_topic_has_no_id_after_a_reset() -> None:
    admin = SourceAdmin()
    h, _, _ = harness(admin)
    try:
        segment(h, range(5))
        h.settle()
        admin.id = None                    # deleted, not created again yet
        segment(h, range(2))
        h.settle()
        assert h.writer.failed is not None  # rewinds and tries again: never the base keys
        assert sorted(snapshot(h)) == [
            "data/r1/t/0/0/00000000000000000000-00000000000000000004"]
    finally:
        h.close()


def test_the_first_id_recorded_owns_the_documented_shape() -> None:
    assert with_incarnation((), "A", NOW) == (Incarnation("A", "", created_at=NOW),)
    one = (Incarnation("A", ""),)
    assert with_incarnation(one, "A", NOW) is None
    assert with_incarnation(one, "B+/x==", NOW) == (
        Incarnation("A", ""), Incarnation("B+/x==", "B-_x", created_at=NOW))


def test_topic_metadata_with_incarnations_round_trips() -> None:
    meta = TopicMetadata(2, {}, "t", "r1", NOW, {0: 0},
                         (Incarnation("A", ""), Incarnation("B", "B", {0: 9, 1: None},
                                                            {0: 0}, NOW)))
    assert TopicMetadata.parse(meta.encode(), where="x") == meta
    assert TopicMetadata.parse(TopicMetadata(2).encode(), where="x").incarnations == ()


def test_a_topic_recreated_twice_leaves_no_hole_in_the_chain() -> None:
    # The second topic never had a record in this partition: its entry is filled when the
    # third one's first segment is sealed, so ingress can move through it.
    admin = SourceAdmin()
    h, pub, _ = harness(admin)
    try:
        segment(h, range(5))
        h.settle()
        admin.id = "IdB"
        pub.incarnation("t", "IdB")            # another partition's segment named it
        admin.id = "IdC"
        segment(h, range(3))
        h.settle()
        meta = TopicMetadata.parse(h.store.get("data/r1/t/_topic.json"), where="t")
        assert [i.label for i in meta.incarnations] == ["", "IdB", "IdC"]
        assert meta.incarnations[1].previous_ends == {0: 4}
        assert meta.incarnations[2].previous_ends == {0: None}
        assert meta.incarnations[2].first_positions == {0: 0}
    finally:
        h.close()


def test_a_broker_without_topic_ids_keeps_the_documented_shape() -> None:
    for no_id in (None, "", "None", "AAAAAAAAAAAAAAAAAAAAAA"):
        admin = SourceAdmin()
        admin.id = no_id
        h, pub, _ = harness(admin)
        try:
            assert pub.topic_id("t") is None
            segment(h, range(3))
            h.settle()
            assert sorted(snapshot(h)) == [
                "data/r1/t/0/0/00000000000000000000-00000000000000000002"]
            meta = TopicMetadata.parse(h.store.get("data/r1/t/_topic.json"), where="t")
            assert meta.incarnations == ()
        finally:
            h.close()
