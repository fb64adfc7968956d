"""The offset-map writer records the destination topic's incarnation in every entry, and
looks it up again when the destination's offsets go back (a recreated topic).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from ingress.metrics import IngressMetrics
from ingress.offset_map import OffsetMapWriter
from ingress.rows import Rows
from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import DeliveryReport
from replicator.core.metrics import Metrics
from replicator.core.offset_map import OffsetMapEntry
from replicator.core.wire import Checkpoint, checkpoint_key


@dataclass(eq=False)
class FakeBatch:
    topic: str
    partition: int
    key: str
    checkpoint: Checkpoint
    rows: Rows | None


def batch(first: int, n: int) -> FakeBatch:
    offsets = list(range(first, first + n))
    rows = Rows(offsets, [0] * n, [None] * n, [b"v"] * n, [None] * n, start=first)
    return FakeBatch("dest", 0, checkpoint_key("eu", "orders", 0, "dest"),
                     Checkpoint(offsets[-1], "seg", datetime(2026, 1, 1, tzinfo=UTC)), rows)


def write(w: OffsetMapWriter, b: FakeBatch, dest_first: int) -> list[OffsetMapEntry]:
    assert b.rows is not None
    listener = w.on_ends(b)
    listener(0, DeliveryReport("dest", 0, dest_first))
    listener(len(b.rows) - 1, DeliveryReport("dest", 0, dest_first + len(b.rows) - 1))
    out: list[bytes | None] = []
    w.produce([b], lambda topic, value, key=None: out.append(value))
    return [OffsetMapEntry.decode(v, where="t") for v in out]


def test_entries_carry_the_destination_topic_id_looked_up_again_when_offsets_go_back(
        ) -> None:
    ids = ["A"]
    calls: list[str] = []

    def topic_id(topic: str) -> str:
        calls.append(topic)
        return ids[0]

    now = [0.0]
    w = OffsetMapWriter("om", IngressMetrics.create(Metrics()), topic_ids=topic_id,
                        clock=lambda: now[0])
    assert write(w, batch(0, 10), 0)[0].incarnation == "A"
    assert write(w, batch(10, 10), 11)[0].incarnation == "A"
    assert calls == ["dest"]                      # cached
    # The topic deleted and created again: its offsets start over. A broker may still
    # answer with the old id for a moment: no id then (unmapped, never mixed with A's).
    assert write(w, batch(20, 10), 0)[0].incarnation is None
    ids[0] = "B"
    assert write(w, batch(30, 10), 11)[0].incarnation == "B"
    assert write(w, batch(40, 10), 22)[0].incarnation == "B"
    assert calls == ["dest"] * 3                  # asked per batch only while in doubt
    now[0] = OffsetMapWriter.ID_TTL
    ids[0] = "C"
    assert write(w, batch(50, 10), 33)[0].incarnation == "C"  # and once a minute
    # Offsets back with the same id for a whole ID_TTL (an unclean leader election): the
    # id is trusted again.
    assert write(w, batch(60, 10), 0)[0].incarnation is None
    now[0] += OffsetMapWriter.ID_TTL
    assert write(w, batch(70, 10), 11)[0].incarnation == "C"


def test_an_unreadable_id_leaves_the_entry_without_one() -> None:
    calls: list[str] = []

    def topic_id(topic: str) -> str:
        calls.append(topic)
        raise KafkaRetriableError("describe topic dest: timed out")

    w = OffsetMapWriter("om", IngressMetrics.create(Metrics()), topic_ids=topic_id,
                        clock=lambda: 0.0)
    [e] = write(w, batch(0, 10), 0)
    assert e.incarnation is None and e.count == 10
    write(w, batch(10, 10), 11)
    assert calls == ["dest"]            # asked again after ID_TTL, not for every batch
