"""``replicator checkpoints show``: how far ingress has replayed each source partition.

For every configured source and partition: every field of the checkpoint (the last source
offset produced, its segment, when, the last range declared lost, where the first replay
started, a record the destination refuses), the end of the newest segment in the
destination bucket, and the lag between them in offset positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replicator.core.keys import SegmentKey, topic_prefix
from replicator.core.settings import IngressSettings, IngressSourceSettings
from replicator.core.storage import ObjectStore
from replicator.core.topic_sets import discover, region_topics, replicator_topics
from replicator.core.wire import Checkpoint, Refusal, checkpoint_key, parse_checkpoint_key


@dataclass(frozen=True)
class CheckpointRow:
    """One source partition."""

    region: str
    topic: str
    partition: int
    destination_topic: str
    checkpoint: int | None
    updated_at: str | None
    latest_segment_end: int | None
    lost: tuple[int, int] | None
    segment: str | None = None
    origin: int | None = None
    refused: Refusal | None = None
    """The record the destination refuses: the partition is stopped at it."""

    @property
    def lag(self) -> int | None:
        """Positions segmented but not yet replayed (``None`` when nothing is segmented)."""
        if self.latest_segment_end is None:
            return None
        done = -1 if self.checkpoint is None else self.checkpoint
        return max(0, self.latest_segment_end - done)

    def as_dict(self) -> dict[str, Any]:
        return {"region": self.region, "topic": self.topic, "partition": self.partition,
                "destination_topic": self.destination_topic, "checkpoint": self.checkpoint,
                "updated_at": self.updated_at, "latest_segment_end": self.latest_segment_end,
                "lag": self.lag, "last_lost_range": None if self.lost is None
                else list(self.lost), "segment": self.segment, "origin": self.origin,
                "refused": None if self.refused is None else self.refused.as_json()}


def configured_sources(ingress: IngressSettings, prefix: str,
                       store: ObjectStore) -> list[IngressSourceSettings]:
    """The named sources, plus the topics their ``topic_pattern`` entries select now (as
    ingress discovers them: ``replicator.core.topic_sets``).
    """
    named = [s for s in ingress.sources if s.topic is not None]
    patterns = [s for s in ingress.sources if s.topic_pattern is not None]
    if not patterns:
        return named
    topics = {r: region_topics(store, prefix, r) for r in {p.region for p in patterns}}
    return named + discover(patterns, topics, named, replicator_topics(ingress)).sources


def checkpoint_report(ingress: IngressSettings, prefix: str, store: ObjectStore,
                      checkpoints: Mapping[str, Checkpoint]) -> list[CheckpointRow]:
    """Rows for every partition that has a segment or a checkpoint, per configured source."""
    rows = []
    for src in configured_sources(ingress, prefix, store):
        # Per incarnation of the topic (deleted and created again): the end shown is the
        # one of the incarnation the checkpoint is in.
        ends: dict[tuple[int, str], int] = {}
        for info in store.list(topic_prefix(prefix, src.region, src.name)):
            k = SegmentKey.try_parse(info.key)
            if k is not None:
                at = (k.partition, k.incarnation)
                ends[at] = max(ends.get(at, -1), k.end)
        # This deployment's key names the destination; a key of an earlier version (no
        # destination) is shown until ingress has taken it over.
        with_checkpoint = {parsed[2] for parsed in map(parse_checkpoint_key, checkpoints)
                           if parsed is not None and parsed[:2] == (src.region, src.name)
                           and parsed[3] in (None, src.destination)}
        for p in sorted({part for part, _ in ends} | with_checkpoint):
            cp = checkpoints.get(checkpoint_key(src.region, src.name, p, src.destination),
                                 checkpoints.get(checkpoint_key(src.region, src.name, p)))
            end = ends.get((p, "" if cp is None else cp.incarnation))
            rows.append(CheckpointRow(
                src.region, src.name, p, src.destination,
                None if cp is None else cp.offset,
                None if cp is None else cp.updated_at.isoformat(),
                end, None if cp is None else cp.lost,
                None if cp is None else cp.segment, None if cp is None else cp.origin,
                None if cp is None else cp.refused))
    return rows
