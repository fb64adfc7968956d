"""The restore's target topic (``replicator/ops/restore_target.py`` and
``replicator.ops.restore.record_facts``): the configs a created target gets, and what an
existing target's configs would do to the restored records, checked before producing."""

from __future__ import annotations

from formats.base import SegmentMetadata, WriterOptions
from formats.records import Record, records_to_batch
from formats.registry import get_format
from formats.segment_io import SegmentUpload, publish_segment
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore
from replicator.ops.restore import record_facts
from replicator.ops.restore_plan import ArchivedSegment, RestoreRange, plan
from replicator.ops.restore_target import (
    CREATED_TOPIC_CONFIGS,
    RECORD_OVERHEAD,
    RecordFacts,
    finite_retention,
    finite_size_retention,
    needs_largest,
    needs_null_keys,
    target_issues,
)

DAY = 86_400_000
NOW = 1_764_000_000_000
KAFKA_DEFAULTS = {"cleanup.policy": "delete", "retention.ms": str(7 * DAY),
                  "retention.bytes": "-1", "message.timestamp.type": "CreateTime",
                  "max.message.bytes": "1048588"}


def issues(config: dict[str, str], facts: RecordFacts) -> list[tuple[str, bool]]:
    return [(i.setting, i.acceptable)
            for i in target_issues("t.restored", {**KAFKA_DEFAULTS, **config}, facts, NOW)]


def test_a_created_target_keeps_every_restored_record_and_its_timestamp() -> None:
    assert finite_retention(CREATED_TOPIC_CONFIGS) is None
    assert not needs_null_keys(CREATED_TOPIC_CONFIGS)
    assert CREATED_TOPIC_CONFIGS["message.timestamp.type"] == "CreateTime"
    assert CREATED_TOPIC_CONFIGS["retention.bytes"] == "-1"
    # Month-old records, the source's 7 days copied over: this is what the created topic
    # must not look like.
    month_old = RecordFacts(oldest=NOW - 30 * DAY)
    assert issues({}, month_old) == [("retention.ms", True)]
    assert issues(CREATED_TOPIC_CONFIGS, month_old) == []


def test_retention_shorter_than_the_records_age_is_named_with_the_oldest_record() -> None:
    [issue] = target_issues("t.restored", KAFKA_DEFAULTS, RecordFacts(oldest=NOW - 30 * DAY),
                            NOW)
    assert issue.message.startswith("t.restored has retention.ms=604800000 (7 day(s)) and "
                                     "the oldest record to restore is from 2025-10-25")
    assert "30 day(s) old" in issue.message and "--accept-target-config" in issue.message
    # Records that retention would delete within a day count too; a week-long margin is fine.
    assert issues({}, RecordFacts(oldest=NOW - 6 * DAY - DAY // 2)) == [("retention.ms", True)]
    assert issues({}, RecordFacts(oldest=NOW - 5 * DAY)) == []
    # No time retention: unlimited, or compaction only.
    assert issues({"retention.ms": "-1"}, RecordFacts(oldest=0)) == []
    assert issues({"cleanup.policy": "compact"}, RecordFacts(oldest=0)) == []
    assert finite_retention({"cleanup.policy": "compact,delete", "retention.ms": "5"}) == 5
    # A broker that describes only the configs set on a topic (Tansu): Kafka's default is
    # assumed, and the message says so.
    [issue] = target_issues("t.restored", {}, RecordFacts(oldest=NOW - 30 * DAY), NOW)
    assert "retention.ms=604800000 (7 day(s): not reported, the Kafka default)" in issue.message


def test_log_append_time_would_replace_the_timestamps() -> None:
    [issue] = target_issues("t.restored", {**KAFKA_DEFAULTS,
                                           "message.timestamp.type": "LogAppendTime"},
                            RecordFacts(), NOW)
    assert issue.setting == "message.timestamp.type" and issue.acceptable
    assert "message.timestamp.type=LogAppendTime" in issue.message


def test_compaction_refuses_records_without_a_key_and_nothing_accepts_it() -> None:
    compacted = {"cleanup.policy": "compact"}
    assert needs_null_keys(compacted) and not needs_null_keys(KAFKA_DEFAULTS)
    assert issues(compacted, RecordFacts(null_keys=0)) == []
    [issue] = target_issues("t.restored", {**KAFKA_DEFAULTS, **compacted},
                            RecordFacts(null_keys=3, first_null_key=(1, 42)), NOW)
    assert (issue.setting, issue.acceptable) == ("cleanup.policy", False)
    assert "3 record(s) to restore have no key, the first at [1]@42" in issue.message


def test_a_record_larger_than_max_message_bytes_is_refused() -> None:
    small = {"max.message.bytes": "1000"}
    assert needs_largest(small, None) and needs_largest(small, 5000)
    assert not needs_largest(KAFKA_DEFAULTS, None)
    assert not needs_largest({"max.message.bytes": "5000"}, 5000)
    assert issues(small, RecordFacts(largest=1000)) == []
    [issue] = target_issues("t.restored", {**KAFKA_DEFAULTS, **small},
                            RecordFacts(largest=1001), NOW)
    assert (issue.setting, issue.acceptable) == ("max.message.bytes", False)
    assert "raise max.message.bytes to at least 1001" in issue.message


def test_record_facts_measure_only_the_records_restored() -> None:
    store = MemoryObjectStore("b")
    key = SegmentKey("data", "us-east-1", "orders", 2, 0, 0, 9)
    recs = [Record(i, NOW - (30 - i) * DAY, None if i in (3, 8) else b"k",
                   b"v" * (100 if i == 9 else 10), (("h", b"xy"),) if i == 5 else ())
            for i in range(10)]
    upload = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
    upload.write_batch(records_to_batch(recs))
    publish_segment(store, upload.finish(SegmentMetadata.for_key(key, 10)).key, key)
    segs = [ArchivedSegment(key, store.head(key.to_key()).size)]

    facts = record_facts(store, plan(segs, RestoreRange()), oldest=True, scan=True)
    assert facts.oldest == NOW - 30 * DAY
    assert (facts.null_keys, facts.first_null_key) == (2, (2, 3))
    assert facts.largest == 1 + 100 + RECORD_OVERHEAD
    # Offsets 4-7 only: no record without a key; the header counts in a record's size.
    facts = record_facts(store, plan(segs, RestoreRange(4, 7)), oldest=False, scan=True)
    assert (facts.null_keys, facts.first_null_key, facts.oldest) == (0, None, None)
    assert facts.largest == 1 + 10 + 1 + 2 + 10 + RECORD_OVERHEAD
    # Time bounds raise the oldest time; without a scan nothing else is measured.
    facts = record_facts(store, plan(segs, RestoreRange(from_time=NOW - 25 * DAY)),
                         oldest=True, scan=False)
    assert facts == RecordFacts(oldest=NOW - 25 * DAY, partition_bytes=(2, segs[0].size))


def test_size_retention_below_what_a_partition_restores_is_named() -> None:
    assert finite_size_retention(KAFKA_DEFAULTS) is None
    assert finite_size_retention({"cleanup.policy": "compact", "retention.bytes": "5"}) is None
    limited = {"retention.bytes": "1000000"}
    assert issues(limited, RecordFacts(partition_bytes=(3, 1_000_000))) == []
    [issue] = target_issues("t.restored", {**KAFKA_DEFAULTS, **limited},
                            RecordFacts(partition_bytes=(3, 1_000_001)), NOW)
    assert (issue.setting, issue.acceptable) == ("retention.bytes", True)
    assert "partition 3 restores about 1000001 bytes" in issue.message
