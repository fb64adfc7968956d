"""Ingress sources in ``replicator doctor``: for each source an ingress config names or its
patterns select now, the source's ``_topic.json`` in the bucket (written by egress in the
source region, copied by S3 replication or ``replicator sync``) against the destination
topic in this region's cluster.

``source_check`` is pure; ``source_checks`` finds the sources as ingress does
(``replicator.ops.checkpoints.configured_sources``) and reads their ``_topic.json``.
``refused_check`` (pure) / ``refused_checks``: partitions stopped at a record their
destination refuses, from the checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from replicator.core.errors import ReplicatorError
from replicator.core.keys import topic_meta_key
from replicator.core.settings import IngressSettings
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import read_topic_meta
from replicator.core.wire import Checkpoint
from replicator.ops.checkpoints import CheckpointRow, checkpoint_report, configured_sources
from replicator.ops.doctor.report import Check, fail, passed, warn


def source_check(region: str, topic: str, destination: str, meta_key: str,
                 source_partitions: int | None, destination_partitions: int | None,
                 error: str | None = None) -> Check:
    """One source: WARN while its ``_topic.json`` is not in the bucket (nothing to replay
    yet) or when the destination has fewer partitions than the source (ingress must grow
    it); FAIL when ``_topic.json`` cannot be read.
    """
    name = f"source {region}/{topic}"
    if error is not None:
        return fail(name, f"{meta_key}: {error}",
                    "check the object (egress of the source region rewrites it every "
                    "topic_metadata_interval)")
    if source_partitions is None:
        return warn(name, f"no {meta_key} yet: nothing to replay",
                    f"start egress in {region} (it writes _topic.json at start), and check "
                    f"that S3 replication or replicator sync copies {meta_key.rsplit('/', 2)[0]}/"
                    " into this bucket")
    seen = f"{source_partitions} partition(s) → {destination}"
    if destination_partitions is None:
        return passed(name, f"{seen}: ingress creates it")
    if destination_partitions < source_partitions:
        return warn(name, f"{seen}, which has {destination_partitions}",
                    f"ingress grows {destination} to {source_partitions} partitions when its "
                    "principal may (Alter on the topic); otherwise kafka-topics.sh --alter "
                    f"--topic {destination} --partitions {source_partitions}, or the source "
                    "stops")
    return passed(name, f"{seen} ({destination_partitions} partition(s))")


def source_checks(ingress: IngressSettings, prefix: str, store: ObjectStore,
                  partitions: Mapping[str, int]) -> list[Check]:
    """A line per source ingress replays now (``partitions``: the destination cluster's
    topics and their partition counts).
    """
    try:
        sources = configured_sources(ingress, prefix, store)
    except ReplicatorError as e:
        return [warn("ingress sources", f"not listed: {e}",
                     "grant s3:ListBucket to find the sources of topic_pattern entries")]
    out = []
    for src in sources:
        key = topic_meta_key(prefix, src.region, src.name)
        try:
            meta = read_topic_meta(store, prefix, src.region, src.name)
        except ReplicatorError as e:
            out.append(source_check(src.region, src.name, src.destination, key, None, None,
                                    str(e)))
            continue
        out.append(source_check(src.region, src.name, src.destination, key,
                                None if meta is None else meta.partitions,
                                partitions.get(src.destination)))
    return out


REFUSED = "ingress refused records"


def refused_check(rows: Sequence[CheckpointRow]) -> Check:
    """FAIL when a partition is stopped at a record its destination refuses (its
    checkpoint's ``refused``: ingress/README.md, "Destination limits"), naming each one;
    PASS otherwise.
    """
    stopped = [r for r in rows if r.refused is not None and r.checkpoint is not None
               and r.refused.offset > r.checkpoint]
    if not stopped:
        return passed(REFUSED, "no partition is stopped at a record its destination refuses")
    seen = "; ".join(
        f"{r.region}/{r.topic}[{r.partition}] -> {r.destination_topic}: offset "
        f"{r.refused.offset} ({r.refused.size if r.refused.size is not None else '?'} bytes; "
        f"destination {r.refused.setting}): {r.refused.reason}"
        for r in stopped if r.refused is not None)
    return fail(REFUSED, seen,
                "raise the destination topic's max.message.bytes above the record (or let "
                "ingress write the topic, for an authorization refusal); the partition "
                "resumes by itself")


def refused_checks(ingress: IngressSettings, prefix: str, store: ObjectStore,
                   checkpoints: Callable[[], Mapping[str, Checkpoint]]) -> list[Check]:
    """``refused_check`` over the checkpoints of every configured source; WARN when the
    checkpoint topic cannot be read.
    """
    try:
        rows = checkpoint_report(ingress, prefix, store, checkpoints())
    except ReplicatorError as e:
        return [warn(REFUSED, f"cannot read the checkpoints: {e}",
                     "check the checkpoint topic (ingress creates it at start)")]
    return [refused_check(rows)]
