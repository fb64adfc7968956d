"""Topic incarnations in the orders that used to overwrite an archived segment: an egress of
an earlier release dropping the chain from ``_topic.json``, an idle topic recreated after
an upgrade, two members recording different first ids (docs/architecture.md, "Topic
incarnations").
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from egress.incarnation_chain import merge
from egress.metrics import EgressMetrics
from egress.rotation import CloseReason
from egress.topic_meta import TopicMetadataPublisher
from formats.segment_io import open_segment
from replicator.core.errors import ReplicatorError
from replicator.core.keys import PartitionRef, SegmentKey
from replicator.core.metrics import Metrics
from replicator.core.retry import RetryPolicy
from replicator.core.storage import ObjectStore
from replicator.core.wire import Incarnation, TopicMetadata
from tests.unit.egress.fakes import Harness, RecordingStore, SourceAdmin, messages, records

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TOPIC_JSON = "data/r1/t/_topic.json"
BASE_5_9 = "data/r1/t/0/0/00000000000000000005-00000000000000000009"


def publisher(admin: SourceAdmin, store: ObjectStore) -> TopicMetadataPublisher:
    pub = TopicMetadataPublisher(
        ["t"], admin, store, prefix="data", region="r1", metrics=EgressMetrics(Metrics()),
        wall=lambda: NOW, retry_policy=RetryPolicy(attempts=2, initial=timedelta(0)),
        interval=timedelta(minutes=1))
    pub.check()
    return pub


def segment(h: Harness, offsets: range, size: int = 5) -> None:
    h.writer.append(messages(records(offsets, size=size)), now=0.0)
    h.writer.close(CloseReason.AGE)
    h.settle()


def chain(store: ObjectStore) -> list[tuple[str, str]]:
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    return [(i.topic_id, i.label) for i in meta.incarnations]


def footer_id(store: ObjectStore, key: str) -> str | None:
    with open_segment(store, SegmentKey.parse(key)) as r:
        return r.metadata.topic_id


def old_release_rewrites(store: ObjectStore) -> None:
    """What an egress of the release before incarnations writes at start: the same file,
    no ``incarnations``, ``topic_id`` or ``partitions_at_start``."""
    doc = json.loads(store.get(TOPIC_JSON))
    for k in ("incarnations", "topic_id", "partitions_at_start"):
        doc.pop(k, None)
    store.put(TOPIC_JSON, json.dumps(doc).encode())


def archive_a_then_b(store: RecordingStore, admin: SourceAdmin) -> TopicMetadataPublisher:
    """IdA archived 0-9 at the documented shape, then recreated as IdB: 0-4 archived."""
    pub = publisher(admin, store)
    h = Harness(store=store, first_positions=pub.record_first_position, incarnations=pub)
    try:
        segment(h, range(5))
        segment(h, range(5, 10))
        admin.id = "IdB"
        segment(h, range(5), size=7)
    finally:
        h.close()
    assert chain(store) == [("IdA", ""), ("IdB", "IdB")]
    return pub


def test_an_egress_of_an_earlier_release_cannot_make_the_live_topic_take_the_first_shape(
) -> None:
    store = RecordingStore()
    admin = SourceAdmin()
    running = archive_a_then_b(store, admin)
    before = store.get(BASE_5_9)
    old_release_rewrites(store)
    assert chain(store) == []
    # A member of this release still running seals another partition: it finds the chain.
    running.seal(PartitionRef("data", "r1", "t", 0, "IdB"), 0)
    old_release_rewrites(store)
    # A new process of this release: the live topic IdB resumes from its commit at 5.
    pub = publisher(admin, store)
    assert chain(store) == [("IdA", ""), ("IdB", "IdB")]
    h = Harness(store=store, first_positions=pub.record_first_position, incarnations=pub,
                expected=5)
    try:
        segment(h, range(5, 10), size=9)
    finally:
        h.close()
    assert store.get(BASE_5_9) == before and footer_id(store, BASE_5_9) == "IdA"
    assert "data/r1/t/_incarnations/IdB/0/0/00000000000000000005-00000000000000000009" \
        in store.keys()  # noqa: SIM118
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert meta.incarnations[1].previous_ends == {0: 9}
    assert meta.incarnations[1].first_positions == {0: 0}


def test_a_recreated_topic_without_commit_starts_at_its_oldest_record_after_an_earlier_release(
) -> None:
    # IdA archived 0-4 and the chain is pinned; an egress of an earlier release rewrites
    # _topic.json without it; the topic is recreated as IdB (its commit is IdA's, ignored).
    # Before this process's check restores the chain (S3 failing at start), the assignment
    # asks the bucket where IdB starts: _incarnations.json says IdB is new, so from its
    # oldest record, never IdA's end (5) at the documented shape.
    store = RecordingStore()
    admin = SourceAdmin()
    pub = publisher(admin, store)
    h = Harness(store=store, first_positions=pub.record_first_position, incarnations=pub)
    try:
        segment(h, range(5))
    finally:
        h.close()
    old_release_rewrites(store)
    admin.id = "IdB"
    fresh = TopicMetadataPublisher(
        ["t"], admin, store, prefix="data", region="r1", metrics=EgressMetrics(Metrics()),
        wall=lambda: NOW, retry_policy=RetryPolicy(attempts=2, initial=timedelta(0)),
        interval=timedelta(minutes=1))
    assert fresh.archived_start(PartitionRef("data", "r1", "t", 0), "IdB") == "earliest"
    assert fresh.archived_start(PartitionRef("data", "r1", "t", 0), "IdA") == 5


def test_the_first_id_is_written_once_whoever_records_it_later() -> None:
    store = RecordingStore()
    admin = SourceAdmin()
    publisher(admin, store)              # records IdA (at start, no segment yet)
    old_release_rewrites(store)
    # Another member, the topic recreated meanwhile: IdB is never given the first shape.
    admin.id = "IdB"
    other = publisher(admin, store)
    assert other.incarnation("t", "IdB") == "IdB"
    assert chain(store) == [("IdA", ""), ("IdB", "IdB")]


def test_an_idle_topic_recreated_after_an_upgrade_is_a_later_incarnation() -> None:
    store = RecordingStore()
    admin = SourceAdmin(tid=None)              # the earlier release: no ids
    old = publisher(admin, store)
    h = Harness(store=store, first_positions=old.record_first_position)
    try:
        segment(h, range(10))
    finally:
        h.close()
    key = "data/r1/t/0/0/00000000000000000000-00000000000000000009"
    before = store.get(key)
    admin.id = "IdA"                     # upgraded; the topic stays idle: no segment named
    publisher(admin, store)
    assert chain(store) == [("IdA", "")]
    admin.id = "IdB"                     # deleted and created again
    pub = publisher(admin, store)
    h = Harness(store=store, first_positions=pub.record_first_position, incarnations=pub)
    try:
        segment(h, range(10), size=9)
    finally:
        h.close()
    assert store.get(key) == before
    assert chain(store) == [("IdA", ""), ("IdB", "IdB")]
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert meta.incarnations[1].previous_ends == {0: 9}


def test_a_base_footer_naming_another_id_keeps_the_shape_for_it() -> None:
    # _topic.json lost its chain before _incarnations.json existed (written by the
    # release before it): the footer at the documented shape says whose it is.
    store = RecordingStore()
    admin = SourceAdmin()
    archive_a_then_b(store, admin)
    store.delete("data/r1/t/_incarnations.json")
    old_release_rewrites(store)
    pub = publisher(admin, store)        # IdB live
    assert pub.incarnation("t", "IdB") == "IdB"
    assert chain(store) == [("IdA", ""), ("IdB", "IdB")]


def test_later_incarnations_without_any_chain_stop_naming_with_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    store = RecordingStore()
    admin = SourceAdmin(tid=None)
    old = publisher(admin, store)
    h = Harness(store=store, first_positions=old.record_first_position)
    try:
        segment(h, range(10))            # no id in its footer
    finally:
        h.close()
    store.put("data/r1/t/_incarnations/IdB/0/0/00000000000000000000-00000000000000000004",
              b"x")
    admin.id = "IdC"
    pub = publisher(admin, store)        # logs the error; records nothing
    assert chain(store) == []
    with pytest.raises(ReplicatorError):
        pub.incarnation("t", "IdC")
    assert any(r.levelname == "ERROR" and "chain" in r.getMessage() for r in caplog.records)


def test_merge_keeps_the_pinned_first_entry() -> None:
    a, b = Incarnation("A", "", {}, {}), Incarnation("B", "B", {0: 9}, {0: 0})
    assert merge((a,), (Incarnation("B", ""),)) == (a, Incarnation("B", "B"))
    assert merge((a, Incarnation("B", "B")), (b,)) == (a, b)
    assert merge((), (b,)) == (b,)


def test_each_incarnation_records_its_partition_count() -> None:
    store = RecordingStore()
    admin = SourceAdmin(partitions=4)
    pub = publisher(admin, store)
    admin.id, admin.partitions = "IdB", 2       # recreated with fewer partitions
    pub.check()
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert [(i.topic_id, i.partitions) for i in meta.incarnations] == [("IdA", 4), ("IdB", 2)]
    assert (meta.partitions, meta.partitions_ever) == (2, 4)


def test_an_earlier_releases_chain_gets_the_earlier_count_when_the_id_changes() -> None:
    # _topic.json of the release before counts: the live entry has none, the file says 4.
    store = RecordingStore()
    store.put(TOPIC_JSON, TopicMetadata(4, {}, "t", "r1", NOW, {},
                                        (Incarnation("IdA", ""),)).encode())
    admin = SourceAdmin(tid="IdB", partitions=2)
    publisher(admin, store)
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert [(i.topic_id, i.partitions) for i in meta.incarnations] == [("IdA", 4), ("IdB", 2)]


def test_a_writer_recording_the_new_id_first_keeps_the_earlier_count() -> None:
    store = RecordingStore()
    store.put(TOPIC_JSON, TopicMetadata(4, {}, "t", "r1", NOW, {},
                                        (Incarnation("IdA", ""),)).encode())
    admin = SourceAdmin(tid="IdA", partitions=4)
    pub = TopicMetadataPublisher(
        ["t"], admin, store, prefix="data", region="r1", metrics=EgressMetrics(Metrics()),
        wall=lambda: NOW, retry_policy=RetryPolicy(attempts=2, initial=timedelta(0)),
        interval=timedelta(minutes=1))
    assert pub.incarnation("t", "IdB") == "IdB"  # before any check saw the new count
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert meta.incarnations[0].partitions == 4


class GatedStore(RecordingStore):
    """Holds the first put of ``_topic.json`` until released; counts the puts."""

    def __init__(self) -> None:
        super().__init__()
        import threading
        self.gate = threading.Event()
        self.held = threading.Event()
        self.meta_puts = 0

    def put(self, key: str, data: bytes, **kw: object) -> object:  # type: ignore[override]
        if key == TOPIC_JSON and self.held.is_set():
            self.meta_puts += 1
            if self.meta_puts == 1:
                self.gate.wait(10)
        return super().put(key, data, **kw)


def test_seals_of_many_partitions_are_written_together() -> None:
    import threading
    store = GatedStore()
    admin = SourceAdmin(partitions=16)
    pub = publisher(admin, store)
    admin.id = "IdB"
    assert pub.incarnation("t", "IdB") == "IdB"
    store.held.set()
    threads = [threading.Thread(target=pub.seal,
                                args=(PartitionRef("data", "r1", "t", p, "IdB"), 0))
               for p in range(16)]
    for t in threads:
        t.start()
    for _ in range(1000):                             # the first seal's put is held
        if store.meta_puts:
            break
        threading.Event().wait(0.01)
    for _ in range(1000):                             # every other seal queues behind it
        if sum(t.is_alive() for t in threads) == 16 and \
                len(pub._pending_seals.get("t", {})) >= 15:
            break
        threading.Event().wait(0.01)
    store.gate.set()
    for t in threads:
        t.join(10)
    meta = TopicMetadata.parse(store.get(TOPIC_JSON), where="_topic.json")
    assert sorted(meta.incarnations[1].previous_ends) == list(range(16))
    assert store.meta_puts <= 2                       # the held one, then all the others


def test_a_writer_that_reads_no_id_never_writes_the_first_incarnations_shape() -> None:
    store = RecordingStore()
    admin = SourceAdmin()
    archive_a_then_b(store, admin)
    admin.id = None                              # a describe that gives no id
    pub = publisher(admin, store)                # a fresh process
    h = Harness(store=store, first_positions=pub.record_first_position, incarnations=pub,
                expected=10)
    try:
        segment(h, range(10, 15))
        assert h.writer.failed is not None       # held back: rewinds and tries again
    finally:
        h.close()
    assert not any(k.startswith("data/r1/t/0/0/00000000000000000010") for k in store.keys())  # noqa: SIM118


@pytest.mark.parametrize("topic_json", ["rewritten by an earlier release", "deleted"])
def test_a_fresh_writer_without_an_id_finds_the_chain_without_topic_json(
        topic_json: str) -> None:
    # The chain lists later incarnations only in _incarnations.json: _topic.json was
    # rewritten without them (an egress of an earlier release) or is not there.
    store = RecordingStore()
    admin = SourceAdmin()
    archive_a_then_b(store, admin)
    if topic_json == "deleted":
        store.delete(TOPIC_JSON)
    else:
        old_release_rewrites(store)
    admin.id = None
    pub = publisher(admin, store)                # a fresh process
    h = Harness(store=store, first_positions=pub.record_first_position, incarnations=pub,
                expected=10)
    try:
        segment(h, range(10, 15))
        assert h.writer.failed is not None       # held back
    finally:
        h.close()
    assert not any(k.startswith("data/r1/t/0/0/00000000000000000010") for k in store.keys())  # noqa: SIM118
