"""``replicator topics``: per region, which topics are replicated and how far.

* For an egress config (``egress_report``): the selected topics (the explicit tables and
  what ``[egress.select]`` matches now: the CLI passes them in), their partition counts,
  the egress group's committed positions, the partitions' ends and the lag between them.
* For an ingress config (``ingress_report``): the sources (named, or found by a
  ``topic_pattern`` exactly as ingress finds them), their destination topics, partition
  counts (``_topic.json``), how many partitions have a checkpoint, the lag between the
  checkpoints and the newest segments in the bucket (``replicator.ops.checkpoints``), the
  newest egress heartbeat (``replicator.core.heartbeats``) and the partitions stopped at a
  record their destination refuses (the checkpoint's ``refused``).
* For either, the byte-rate limits of the process (``throttles``): what egress reads from
  the source cluster, what ingress produces into the destination.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from replicator.core.errors import ReplicatorError
from replicator.core.heartbeats import read_heartbeats
from replicator.core.kafka import OFFSET_INVALID, Admin, Consumer, TopicPartition
from replicator.core.settings import IngressSettings, KafkaSettings, Settings
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import read_topic_meta
from replicator.core.units import format_size
from replicator.core.wire import Checkpoint, rfc3339
from replicator.ops.checkpoints import checkpoint_report, configured_sources


def throttles(settings: Settings) -> dict[str, int]:
    """``max_bytes_per_second`` of each service the config has (0: unlimited), by
    service: ``egress`` (read from the source), ``ingress`` (produced into the
    destination).
    """
    out = {}
    if settings.egress is not None:
        out["egress"] = settings.egress.max_bytes_per_second
    if settings.ingress is not None:
        out["ingress"] = settings.ingress.max_bytes_per_second
    return out


def describe_rate(rate: int) -> str:
    """A ``max_bytes_per_second`` for humans: ``unlimited`` or ``10.0 MiB/s`` (per
    process).
    """
    return "unlimited" if rate == 0 else f"{format_size(rate)}/s per process"


@dataclass
class EgressTopic:
    """One selected source topic: partitions, committed positions, ends, lag."""

    region: str
    topic: str
    partitions: int | None
    """``None``: the topic does not exist (an explicit table waits for it)."""
    committed: dict[int, int | None] = field(default_factory=dict)
    """Partition → the egress group's committed position (``None``: no commit yet)."""
    ends: dict[int, int] = field(default_factory=dict)
    """Partition → the offset after its last record."""

    @property
    def lag(self) -> int | None:
        """Records after the committed positions (a partition without a commit counts from
        its start).
        """
        if self.partitions is None:
            return None
        return sum(max(0, end - (self.committed.get(p) or 0)) for p, end in self.ends.items())

    @property
    def state(self) -> str:
        if self.partitions is None:
            return "missing"
        if not any(c is not None for c in self.committed.values()):
            return "no commit yet"
        return "replicating" if self.lag == 0 else "behind"

    def as_dict(self) -> dict[str, Any]:
        return {"region": self.region, "topic": self.topic, "partitions": self.partitions,
                "state": self.state, "lag": self.lag,
                "committed": {str(p): c for p, c in sorted(self.committed.items())},
                "ends": {str(p): e for p, e in sorted(self.ends.items())}}


def egress_report(region: str, kafka: KafkaSettings, group_id: str,
                  selected: Sequence[str], timeout: float = 10.0) -> list[EgressTopic]:
    """The selected topics of an egress config, read from its cluster (no group join).

    Raises:
        ReplicatorError: the cluster cannot be reached.
    """
    admin = Admin(kafka, timeout=timeout)
    rows = [EgressTopic(region, t, admin.partition_count(t)) for t in sorted(selected)]
    tps = [TopicPartition(r.topic, p) for r in rows for p in range(r.partitions or 0)]
    if not tps:
        return rows
    consumer = Consumer(kafka, group_id, {"enable.auto.commit": False})
    try:
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in consumer.committed(tps, timeout)}
        ends = {(tp.topic, tp.partition): consumer.watermarks(tp, timeout=timeout)[1]
                for tp in tps}
    finally:
        consumer.close()
    for r in rows:
        for p in range(r.partitions or 0):
            c = committed.get((r.topic, p), OFFSET_INVALID)
            r.committed[p] = c if c >= 0 else None
            r.ends[p] = ends[(r.topic, p)]
    return rows


@dataclass
class IngressSource:
    """One source of an ingress config: where it goes and how far it is replayed."""

    region: str
    topic: str
    destination: str
    found_by: str
    """``topic`` (named) or the ``topic_pattern`` that selected it."""
    partitions: int | None
    """From ``_topic.json`` (``None``: egress has not written it yet)."""
    checkpointed: int = 0
    """Partitions with a checkpoint."""
    lag: int = 0
    """Positions between the checkpoints and the ends of the newest segments."""
    heartbeat: datetime | None = None
    """The newest egress heartbeat in the bucket (``None``: egress writes none for it)."""
    refused: dict[int, str] = field(default_factory=dict)
    """Partitions stopped at a record the destination refuses -> which record and why."""

    @property
    def state(self) -> str:
        if self.partitions is None:
            return "waiting for _topic.json"
        if self.refused:
            return "stopped at a refused record: " + "; ".join(
                f"[{p}] {why}" for p, why in sorted(self.refused.items()))
        if self.checkpointed == 0:
            return "no checkpoint yet"
        return "replicating" if self.lag == 0 else "behind"

    def as_dict(self) -> dict[str, Any]:
        return {"region": self.region, "topic": self.topic, "destination": self.destination,
                "found_by": self.found_by, "partitions": self.partitions,
                "checkpointed_partitions": self.checkpointed, "lag": self.lag,
                "state": self.state,
                "heartbeat_at": None if self.heartbeat is None else rfc3339(self.heartbeat),
                "refused": {str(p): why for p, why in sorted(self.refused.items())}}


def ingress_report(ingress: IngressSettings, prefix: str, store: ObjectStore,
                   checkpoints: Mapping[str, Checkpoint]) -> list[IngressSource]:
    """The sources of an ingress config with their replication state.

    Raises:
        ReplicatorError: the bucket cannot be read.
    """
    rows: dict[tuple[str, str], IngressSource] = {}
    named = {(s.region, s.topic) for s in ingress.sources if s.topic is not None}
    for src in configured_sources(ingress, prefix, store):
        pattern = None if (src.region, src.name) in named else next(
            (p.topic_pattern for p in ingress.sources if p.topic_pattern is not None
             and p.region == src.region and p.matches(src.name)), None)
        try:
            meta = read_topic_meta(store, prefix, src.region, src.name)
        except ReplicatorError:
            meta = None
        beats = read_heartbeats(store, prefix, src.region, src.name)
        rows[(src.region, src.name)] = IngressSource(
            src.region, src.name, src.destination,
            "topic" if pattern is None else f"topic_pattern {pattern!r}",
            None if meta is None else meta.partitions,
            heartbeat=max((hb.written_at for hb in beats), default=None))
    for cp in checkpoint_report(ingress, prefix, store, checkpoints):
        row = rows.get((cp.region, cp.topic))
        if row is None:
            continue
        row.checkpointed += cp.checkpoint is not None
        row.lag += cp.lag or 0
        r = cp.refused
        if r is not None and cp.checkpoint is not None and r.offset > cp.checkpoint:
            row.refused[cp.partition] = (
                f"offset {r.offset} ({r.size if r.size is not None else '?'} bytes; "
                f"destination {r.setting}): {r.reason}")
    return sorted(rows.values(), key=lambda r: (r.region, r.topic))
