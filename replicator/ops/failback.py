"""``replicator failback record-start``: where the DR region's own writes begin.

A failback sends home what was written in the DR region after the failover, and only that:
the failback egress must start, per partition of each destination topic, at the first
offset written there after ingress stopped (docs/runbooks.md, "Failback"). That number is
the partition's end once ingress has stopped and before anything else writes: this module
reads it, refuses when it is not final yet, and renders it as the CSV
``kafka-consumer-groups.sh --reset-offsets --from-file`` reads (``topic,partition,offset``).

Refused (the number would be wrong):

* ingress still has members in its group: it may write more replicated records;
* a partition's last stable offset is below its high watermark: a transaction (of an
  ingress that was killed) is still open, and its records, if committed, are replicated ones.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replicator.core.errors import FatalError
from replicator.core.kafka import Admin, Consumer, TopicPartition
from replicator.core.settings import IngressSettings, KafkaSettings
from replicator.core.storage import ObjectStore
from replicator.ops.checkpoints import configured_sources


class NotFinal(FatalError):
    """The destination's ends can still move (the message says why)."""


@dataclass(frozen=True)
class StartRow:
    """One destination partition: the first offset the DR region writes."""

    topic: str
    partition: int
    start: int
    """The high watermark once ingress stopped: the first offset written after it."""
    stable: int
    """The last stable offset (read_committed end) at the same time."""
    sources: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "first_dr_offset": self.start,
                "last_stable_offset": self.stable, "sources": list(self.sources)}


def destination_starts(kafka: KafkaSettings, ingress: IngressSettings, prefix: str,
                       store: ObjectStore, *, timeout: float = 30.0) -> list[StartRow]:
    """The rows of every configured source's destination topic (existing ones).

    Raises:
        NotFinal: ingress has members, or a partition has an open transaction.
    """
    admin = Admin(kafka)
    members = admin.group_members(ingress.group_id)
    if members:
        raise NotFinal(f"ingress group {ingress.group_id} has {members} member(s): stop "
                       "ingress first (its replicated records would follow the recorded "
                       "offsets)")
    by_dest: dict[str, list[str]] = {}
    for src in configured_sources(ingress, prefix, store):
        by_dest.setdefault(src.destination, []).append(f"{src.region}/{src.name}")
    parts = [(t, p) for t in sorted(by_dest)
             for p in range(admin.partition_count(t) or 0)]
    stable = admin.log_ends(parts, timeout=timeout)
    highs = _high_watermarks(kafka, parts, timeout)
    rows = [StartRow(t, p, highs[(t, p)], stable[(t, p)], tuple(by_dest[t])) for t, p in parts]
    open_txn = [f"{r.topic}[{r.partition}] (stable {r.stable}, end {r.start})"
                for r in rows if r.stable != r.start]
    if open_txn:
        raise NotFinal("an open transaction holds records that may still be committed as "
                       f"replicated ones: {', '.join(open_txn)}; wait until the stable offset "
                       "reaches the end (the ingress transaction.timeout.ms at most) and run "
                       "again")
    return rows


def _high_watermarks(kafka: KafkaSettings, parts: Sequence[tuple[str, int]], timeout: float
                     ) -> dict[tuple[str, int], int]:
    # read_uncommitted: the high watermark (read_committed answers the last stable offset).
    c = Consumer(kafka, f"replicator.reader.failback-{uuid.uuid4().hex[:12]}",
                 {"isolation.level": "read_uncommitted"})
    try:
        return {(t, p): c.watermarks(TopicPartition(t, p), timeout=timeout)[1]
                for t, p in parts}
    finally:
        c.close()


def reset_offsets_csv(rows: Sequence[StartRow]) -> str:
    """``topic,partition,offset`` lines: ``kafka-consumer-groups.sh --reset-offsets
    --from-file``'s format.
    """
    return "".join(f"{r.topic},{r.partition},{r.start}\n" for r in rows)
