"""The topic a restore writes: the configs it is created with, and what an existing one's
configs would do to the restored records (pure; docs/restore.md).

Restored records are usually old (the reason to restore), and a restore that exits 0 must
leave them in the topic as they were archived. So a topic the restore creates keeps them
(``CREATED_TOPIC_CONFIGS``), and an existing topic is checked before anything is produced
(``target_issues``): each issue names the setting, what the broker would do, and what to
change. Issues the user may knowingly accept (``Issue.acceptable``: the broker would
replace timestamps, or delete restored records later) pass with ``--accept-target-config``;
the others would make the broker reject records mid-restore, so nothing accepts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from replicator.core.topic_copy import copied_configs
from replicator.core.wire import TopicMetadata

CREATED_TOPIC_CONFIGS: dict[str, str] = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "message.timestamp.type": "CreateTime",
}
"""Set on a topic the restore creates, over the source's copied configs: time or size
retention would delete old restored records right after the restore (the source's 7 days
delete a month-old record at the broker's next retention check); compaction would keep only
the newest record of each key (and reject records without one); LogAppendTime would
replace the archived timestamps. The user changes them once done with the records."""

@dataclass(frozen=True)
class SourceShape:
    """What a restore takes from the source's ``_topic.json`` for the incarnation it reads
    (``source_shape``).
    """

    partitions: int
    """The source's partition count (0: not known)."""
    configs: dict[str, str]
    """The source's configs a created target copies."""
    configs_known: bool
    """False for an earlier incarnation: ``_topic.json`` holds the live topic's configs
    only, never applied to another topic's records."""


def source_shape(meta: TopicMetadata | None, incarnation: str) -> SourceShape:
    """The partition count and copied configs of the incarnation labelled ``incarnation``
    (pure): the live one's as ``_topic.json`` records them; an earlier one's partition count
    from its entry (the most it had, when recorded) and no configs.
    """
    if meta is None:
        return SourceShape(0, {}, True)
    live = meta.live
    if live is None or live.label == incarnation:
        return SourceShape(meta.partitions, copied_configs(meta.configs), True)
    inc = meta.incarnation(incarnation) if incarnation else meta.incarnations[0]
    return SourceShape(0 if inc is None or inc.partitions is None else inc.partitions, {},
                       False)


KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""Apache Kafka's default ``message.max.bytes``: the limit of a source topic whose
``_topic.json`` sets no ``max.message.bytes`` (the source's records fit in it)."""

RECORD_OVERHEAD = 61 + 40
"""Bytes a batch of one record adds to its key, value and headers: the 61-byte batch header
and at most ~40 bytes of the record's varints (length, delta, key and value lengths)."""

HEADER_OVERHEAD = 10
"""Bytes of varints per header (name and value lengths), at most."""

RETENTION_MARGIN = timedelta(days=1)
"""How long restored records must outlive the restore: a record that retention would delete
a few hours after the restore exits 0 is as lost as one deleted at once."""


@dataclass(frozen=True)
class RecordFacts:
    """What the records to restore need of the topic; ``None``: not measured (not needed
    for this topic's configs).
    """

    oldest: int | None = None
    """The smallest timestamp (ms) of the records to restore."""
    largest: int | None = None
    """The bytes of the largest record as a batch of one (``RECORD_OVERHEAD`` included)."""
    null_keys: int | None = None
    """How many records to restore have no key."""
    first_null_key: tuple[int, int] | None = None
    """``(partition, offset)`` of the first of them."""
    partition_bytes: tuple[int, int] | None = None
    """``(partition, bytes)`` of the partition restoring the most: its share of the
    segments' stored bytes, about what its records take in the log, usually less (the
    segments are compressed)."""


@dataclass(frozen=True)
class Issue:
    """A config of the target that would change or refuse the restored records."""

    setting: str
    message: str
    acceptable: bool
    """True when ``--accept-target-config`` lets the restore go on (the user takes what the
    broker does); False when the broker would reject records."""


def policies(config: Mapping[str, str]) -> set[str]:
    """The topic's ``cleanup.policy`` values (``{"delete"}`` when unset, Kafka's default)."""
    raw = config.get("cleanup.policy", "delete")
    return {p.strip() for p in raw.split(",") if p.strip()}


KAFKA_DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
"""Apache Kafka's default ``retention.ms``: assumed when a broker describes only the configs
set on a topic (Tansu), so an unreported retention is never taken for none."""


def finite_retention(config: Mapping[str, str]) -> int | None:
    """The topic's time retention in ms when the broker deletes by time, else ``None``
    (compaction only, or ``retention.ms=-1``).
    """
    if "delete" not in policies(config):
        return None
    ms = int(config.get("retention.ms", str(KAFKA_DEFAULT_RETENTION_MS)))
    return None if ms < 0 else ms


def finite_size_retention(config: Mapping[str, str]) -> int | None:
    """The topic's size retention per partition in bytes when the broker deletes by size,
    else ``None`` (compaction only, or ``retention.bytes=-1``, Kafka's default).
    """
    if "delete" not in policies(config):
        return None
    size = int(config.get("retention.bytes", "-1"))
    return None if size < 0 else size


def needs_null_keys(config: Mapping[str, str]) -> bool:
    """True when records without a key matter: the topic is compacted."""
    return "compact" in policies(config)


def needs_largest(config: Mapping[str, str], source_limit: int | None) -> bool:
    """True when a record may be larger than the topic accepts: its ``max.message.bytes``
    is below the source's (``None``: Kafka's default), which every record fits.
    """
    limit = config.get("max.message.bytes")
    return limit is not None and int(limit) < (source_limit or KAFKA_DEFAULT_MAX_MESSAGE_BYTES)


def target_issues(topic: str, config: Mapping[str, str], facts: RecordFacts,
                  now_ms: int) -> list[Issue]:
    """What ``topic``'s ``config`` (every config with its effective value) would do to the
    records described by ``facts``.
    """
    out = []
    if config.get("message.timestamp.type") == "LogAppendTime":
        out.append(Issue(
            "message.timestamp.type",
            f"{topic} has message.timestamp.type=LogAppendTime: the broker would replace "
            "every restored record's timestamp with the time of the restore; set it to "
            "CreateTime, restore into another topic, or pass --accept-target-config",
            acceptable=True))
    if needs_null_keys(config) and facts.null_keys:
        where = "" if facts.first_null_key is None else \
            f", the first at [{facts.first_null_key[0]}]@{facts.first_null_key[1]}"
        out.append(Issue(
            "cleanup.policy",
            f"{topic} has cleanup.policy={config.get('cleanup.policy')} and "
            f"{facts.null_keys} record(s) to restore have no key{where}: the broker rejects "
            "records without a key on a compacted topic; restore into a topic with "
            "cleanup.policy=delete", acceptable=False))
    limit = config.get("max.message.bytes")
    if limit is not None and facts.largest is not None and facts.largest > int(limit):
        out.append(Issue(
            "max.message.bytes",
            f"{topic} has max.message.bytes={limit} and the largest record to restore needs "
            f"{facts.largest} bytes: the broker would reject it; raise max.message.bytes to "
            f"at least {facts.largest}, or restore into another topic", acceptable=False))
    size_limit = finite_size_retention(config)
    if size_limit is not None and facts.partition_bytes is not None and \
            facts.partition_bytes[1] > size_limit:
        part, size = facts.partition_bytes
        out.append(Issue(
            "retention.bytes",
            f"{topic} has retention.bytes={size_limit} (per partition) and partition {part} "
            f"restores about {size} bytes (the segments' stored size; more in the log): the "
            "broker would delete its oldest restored records; set retention.bytes=-1, "
            "restore into a new topic, or pass --accept-target-config", acceptable=True))
    retention = finite_retention(config)
    if retention is not None and facts.oldest is not None and \
            now_ms - facts.oldest + RETENTION_MARGIN.total_seconds() * 1000 > retention:
        oldest = datetime.fromtimestamp(facts.oldest / 1000, UTC).isoformat(timespec="seconds")
        age = timedelta(milliseconds=now_ms - facts.oldest)
        out.append(Issue(
            "retention.ms",
            f"{topic} has retention.ms={retention} ({_days(retention)}"
            f"{'' if 'retention.ms' in config else ': not reported, the Kafka default'}) "
            "and the oldest record "
            f"to restore is from {oldest} ({age.days} day(s) old): the broker would delete "
            "restored records at its next retention checks (or within a day); set "
            "retention.ms=-1 (or longer), restore into a new topic (created with "
            "retention.ms=-1), or pass --accept-target-config", acceptable=True))
    return out


def _days(ms: int) -> str:
    return f"{ms / 86_400_000:g} day(s)"
