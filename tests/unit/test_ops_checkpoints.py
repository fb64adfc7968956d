"""``checkpoints show`` report: checkpoint, newest segment end and lag per partition."""

from __future__ import annotations

from datetime import UTC, datetime

from replicator.core.keys import SegmentKey
from replicator.core.settings import IngressSettings
from replicator.core.storage import MemoryObjectStore
from replicator.core.wire import Checkpoint
from replicator.ops.checkpoints import checkpoint_report

NOW = datetime(2026, 11, 21, tzinfo=UTC)


def test_rows_per_partition_with_lag() -> None:
    ingress = IngressSettings.model_validate({
        "sqs_queue": "q", "sources": [{"region": "us-east-1", "topic": "t",
                                       "destination_topic": "t.copy"}]})
    store = MemoryObjectStore()
    for p, start, end in ((0, 0, 99), (0, 100, 199), (1, 0, 49), (1, 0, 49)):
        store.put(SegmentKey("data", "us-east-1", "t", p, 0, start, end).to_key(), b"x")
    store.put(SegmentKey("data", "eu-west-1", "t", 5, 0, 0, 9).to_key(), b"other region")
    cps = {"us-east-1:t:0:t.copy": Checkpoint(149, "seg", NOW, origin=7),
           "us-east-1:t:0": Checkpoint(3, "seg", NOW),           # taken over: not shown
           "us-east-1:t:2": Checkpoint(9, "seg", NOW, lost=(3, 4)),   # earlier version
           "us-east-1:t:3:elsewhere": Checkpoint(5, "seg", NOW),  # another deployment's
           "us-east-1:other:0": Checkpoint(1, "seg", NOW)}
    rows = checkpoint_report(ingress, "data", store, cps)
    assert [(r.partition, r.checkpoint, r.latest_segment_end, r.lag) for r in rows] == [
        (0, 149, 199, 50), (1, None, 49, 50), (2, 9, None, None)]
    assert rows[0].destination_topic == "t.copy"
    assert rows[2].as_dict()["last_lost_range"] == [3, 4]
    # Every checkpoint field is shown.
    assert rows[0].as_dict() == {
        "region": "us-east-1", "topic": "t", "partition": 0, "destination_topic": "t.copy",
        "checkpoint": 149, "updated_at": NOW.isoformat(), "latest_segment_end": 199,
        "lag": 50, "last_lost_range": None, "segment": "seg", "origin": 7, "refused": None}
    assert (rows[1].segment, rows[1].origin) == (None, None)
