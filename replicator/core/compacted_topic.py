"""Compacted topics of one key per partition or entry that ingress and restore create in
the destination cluster (the checkpoint topic, the offset-map topic): created with settings
that really compact, and an existing one checked (ingress/README.md, "Checkpoint topic").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from replicator.core.errors import ReplicatorError

log = logging.getLogger(__name__)


class CompactedTopicAdmin(Protocol):
    """The admin operations used here (``replicator.core.kafka.Admin``)."""

    def create_topic(self, topic: str, partitions: int, config: Mapping[str, str] | None = None,
                     *, replication_factor: int = -1) -> bool: ...
    def effective_topic_config(self, topic: str) -> dict[str, str]: ...


def ensure_compacted_topic(admin: CompactedTopicAdmin, topic: str, what: str) -> None:
    """Create a compacted topic of one key per partition or entry (the checkpoint topic, the
    offset-map topic) with ``CHECKPOINT_TOPIC_CONFIG``, or report what is wrong with an
    existing one (``checkpoint_topic_problems``). ``what`` names it in the log.
    """
    if admin.create_topic(topic, 1, dict(CHECKPOINT_TOPIC_CONFIG)):
        log.info("created %s %s (%s)", what, topic,
                 ", ".join(f"{k}={v}" for k, v in CHECKPOINT_TOPIC_CONFIG.items()))
        return
    try:
        configs = admin.effective_topic_config(topic)
    except ReplicatorError as e:
        log.warning("cannot read the configs of %s %s: %s", what, topic, e)
        return
    for level, problem in checkpoint_topic_problems(configs):
        log.log(level, "%s %s: %s", what, topic, problem)


CHECKPOINT_TOPIC_CONFIG: Mapping[str, str] = {
    "cleanup.policy": "compact",
    # The cleaner never compacts the active segment; with the default segment.ms (7 days)
    # a week of checkpoints (one per transaction and partition) stays for every start to
    # read. Rolled hourly, the topic holds about one record per key plus an hour's worth.
    "segment.ms": str(3600 * 1000),
    # Clean once a tenth of the log is superseded (default: half).
    "min.cleanable.dirty.ratio": "0.1",
    # A checkpoint may go as soon as a newer one of its key exists (the default, 0, kept
    # explicit: a lag would only keep superseded checkpoints longer).
    "min.compaction.lag.ms": "0",
}
"""Configs of a checkpoint or offset-map topic ingress creates (ingress/README.md,
"Checkpoint topic")."""

MAX_CHECKPOINT_SEGMENT_MS = 24 * 3600 * 1000
"""A ``segment.ms`` above this keeps that long of superseded checkpoints uncompacted."""


def checkpoint_topic_problems(configs: Mapping[str, str]) -> list[tuple[int, str]]:
    """What is wrong with an existing checkpoint topic's effective configs, as (log level,
    message): a topic that is not compacted can lose checkpoints (ERROR: replay would
    restart below them); one whose segments roll rarely or clean late is read slowly at
    every start (WARNING). Configs the broker does not describe are not judged.
    """
    out: list[tuple[int, str]] = []
    policy = configs.get("cleanup.policy")
    if policy is not None and "compact" not in policy:
        out.append((logging.ERROR, f"cleanup.policy={policy}: checkpoints can be deleted "
                    "(a partition would replay again from an older position); set "
                    "cleanup.policy=compact"))
    elif policy is not None and "delete" in policy:
        out.append((logging.ERROR, f"cleanup.policy={policy}: retention can delete a "
                    "partition's only checkpoint; set cleanup.policy=compact"))
    segment_ms = configs.get("segment.ms")
    if segment_ms is not None and segment_ms.isdigit() \
            and int(segment_ms) > MAX_CHECKPOINT_SEGMENT_MS:
        out.append((logging.WARNING, f"segment.ms={segment_ms}: the active segment is never "
                    "compacted, so every start reads that long of checkpoints; set "
                    f"segment.ms={CHECKPOINT_TOPIC_CONFIG['segment.ms']}"))
    ratio = configs.get("min.cleanable.dirty.ratio")
    try:
        late = ratio is not None and float(ratio) > 0.5
    except ValueError:
        late = False
    if late:
        out.append((logging.WARNING, f"min.cleanable.dirty.ratio={ratio}: compacted late; "
                    f"set min.cleanable.dirty.ratio="
                    f"{CHECKPOINT_TOPIC_CONFIG['min.cleanable.dirty.ratio']}"))
    return out
