"""The compaction controller in-process (MemoryObjectStore, LocalExecutor): merges, safety,
idempotence after an interrupted run, the region lock, the cron loop and metrics."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError

from compaction.controller import Compaction
from compaction.executors import settings_from_payload, settings_payload
from compaction.lock import LockState, RegionLock, lock_key
from compaction.merge import TaskSpec, merge_segments
from formats.base import WriterOptions
from formats.records import Record
from formats.registry import get_format
from replicator.core.aws import translate
from replicator.core.errors import ConfigError, StorageError
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore, ObjectInfo
from tests.unit.test_compaction_helpers import (
    compaction_settings,
    make_records,
    read_segment,
    write_segment,
)

LATER = timedelta(hours=2)   # the controller's clock runs this far ahead: segments are "old"


def k(level: int, start: int, end: int, partition: int = 0, topic: str = "t",
      region: str = "r1") -> SegmentKey:
    return SegmentKey("data", region, topic, partition, level, start, end)


def clock() -> datetime:
    return datetime.now(UTC) + LATER


def controller(store: MemoryObjectStore, **kw: Any) -> Compaction:
    settings = kw.pop("settings", None) or compaction_settings()
    return Compaction(settings, store=store, clock=kw.pop("clock", clock), **kw)


def seed(store: MemoryObjectStore, ranges: list[tuple[int, int]], level: int = 0,
         partition: int = 0, step: int = 1) -> list[SegmentKey]:
    keys = []
    for s, e in ranges:
        key = k(level, s, e, partition)
        write_segment(store, key, make_records(s, e, step))
        keys.append(key)
    return keys


def listing(store: MemoryObjectStore) -> list[str]:
    return store.keys()


def segment_keys(store: MemoryObjectStore) -> list[str]:
    return [x for x in listing(store) if SegmentKey.try_parse(x)]


def test_level0_segments_merge_into_one_level1_with_the_same_records_in_order() -> None:
    store = MemoryObjectStore()
    ranges = [(0, 99), (100, 249), (250, 250), (251, 400)]
    inputs = seed(store, ranges, step=3)   # offset gaps inside every segment
    expected = [r for key in inputs for r in read_segment(store, key)]
    c = controller(store)
    report = c.run_once()
    assert report.outcome == "success", report
    assert segment_keys(store) == [k(1, 0, 400).to_key()]
    assert read_segment(store, k(1, 0, 400)) == expected
    assert [t.outcome for t in report.tasks] == ["merged"]
    assert report.tasks[0].records == len(expected)
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
    # nothing else left behind: no temp objects, no lock, no open uploads
    assert store.keys() == [k(1, 0, 400).to_key()]
    assert not store.uploads_open
    m = c.m.summary()
    assert m["runs"]["success"] == 1
    assert m["segments_read"] == 4 and m["segments_written"] == 1
    assert m["segments_deleted"] == 4 and m["records_written"] == len(expected)
    assert m["bytes_written"] == store.head(k(1, 0, 400).to_key()).size
    assert m["last_success_timestamp"] is not None


def test_overlapping_inputs_do_not_duplicate_records() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 99), (50, 149), (150, 199)])
    report = controller(store).run_once()
    assert report.outcome == "success"
    out = read_segment(store, k(1, 0, 199))
    assert [r.offset for r in out] == list(range(200))
    assert segment_keys(store) == [k(1, 0, 199).to_key()]


def test_several_partitions_and_tasks_and_storage_class_per_level() -> None:
    settings = compaction_settings(
        s3={"storage_class": {"1": "STANDARD_IA"}},
        topics={"t": {"min_segment_age": "1h", "min_segment_count": 2, "min_segment_size": 1,
                      "max_segment_count": 2, "batch_size": 3}})
    store = MemoryObjectStore()
    seed(store, [(0, 9), (10, 19), (20, 29), (30, 39)], partition=0)
    seed(store, [(5, 9), (10, 14)], partition=1)
    report = controller(store, settings=settings).run_once()
    assert report.outcome == "success"
    assert segment_keys(store) == sorted(x.to_key() for x in
                                         [k(1, 0, 19), k(1, 20, 39), k(1, 5, 14, 1)])
    assert store.head(k(1, 0, 19).to_key()).storage_class == "STANDARD_IA"


def test_young_segments_and_other_regions_and_topics_are_left_alone() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 9), (10, 19)])
    other_region = k(0, 0, 9, region="r2")
    other_topic = k(0, 0, 9, topic="unconfigured")
    write_segment(store, other_region, make_records(0, 9))
    write_segment(store, k(0, 10, 19, region="r2"), make_records(10, 19))
    write_segment(store, other_topic, make_records(0, 9))
    store.put("data/r1/t/_topic.json", b"{}")
    # with the real clock nothing is old enough
    report = controller(store, clock=lambda: datetime.now(UTC)).run_once()
    assert report.outcome == "success" and report.tasks == []
    assert "younger than min_segment_age" in report.skipped[0]
    report = controller(store).run_once()
    assert [t.output for t in report.tasks] == [k(1, 0, 19).to_key()]
    assert store.head(other_region.to_key()) and store.head(other_topic.to_key())
    assert store.head(k(0, 10, 19, region="r2").to_key())
    assert store.get("data/r1/t/_topic.json") == b"{}"


class FailingCopyStore(MemoryObjectStore):
    """Fails the copy to a final key (the publish step) a given number of times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        if self.failures > 0 and SegmentKey.try_parse(dst):
            self.failures -= 1
            raise StorageError(f"injected: copy {src} -> {dst}")
        return super().copy(src, dst, storage_class=storage_class)


def test_a_failed_publish_leaves_inputs_and_no_partial_output_then_rerun_completes() -> None:
    store = FailingCopyStore(failures=0)
    inputs = seed(store, [(0, 99), (100, 199), (200, 299)])
    store.failures = 1
    before = sorted(store.keys())
    c = controller(store)
    report = c.run_once()
    assert report.outcome == "failed"
    assert report.tasks[0].outcome == "failed" and "injected" in (report.tasks[0].error or "")
    assert sorted(store.keys()) == before        # inputs kept, temp aborted, lock released
    assert c.m.summary()["runs"]["failed"] == 1
    report = c.run_once()
    assert report.outcome == "success"
    assert segment_keys(store) == [k(1, 0, 299).to_key()]
    assert [r.offset for r in read_segment(store, k(1, 0, 299))] == list(range(300))
    assert all(x.to_key() not in listing(store) for x in inputs)


def test_run_killed_after_publishing_is_finished_by_the_next_run() -> None:
    # Simulate a run that published its output and died before deleting the inputs.
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 99), (100, 199), (200, 299)])
    seed(store, [(300, 399), (400, 499)])
    settings = compaction_settings()
    spec = TaskSpec([x.to_key() for x in inputs], [1, 1, 1], k(1, 0, 299).to_key(), 50)
    res = merge_segments(store, get_format("parquet"), WriterOptions(), "temp", spec)
    assert res.ok and not res.existing and res.records == 300
    # an interrupted re-run of the same task writes nothing new
    again = merge_segments(store, get_format("parquet"), WriterOptions(), "temp", spec)
    assert again.ok and again.existing and again.records == 300
    report = controller(store, settings=settings).run_once()
    assert report.outcome == "success"
    assert sorted(report.covered_to_delete) == sorted(x.to_key() for x in inputs)
    assert [t.output for t in report.tasks] == [k(1, 300, 499).to_key()]
    assert segment_keys(store) == [k(1, 0, 299).to_key(), k(1, 300, 499).to_key()]
    got = read_segment(store, k(1, 0, 299)) + read_segment(store, k(1, 300, 499))
    assert [r.offset for r in got] == list(range(500))
    assert [x for x in listing(store) if x.startswith("temp/")] == []


def test_corrupt_input_fails_its_task_only() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 9), (10, 19)], partition=0)
    seed(store, [(0, 9), (10, 19)], partition=1)
    store.put(k(0, 20, 29, partition=1).to_key(), b"not a segment")
    report = controller(store).run_once()
    assert report.outcome == "failed"
    outcomes = {t.output: t.outcome for t in report.tasks}
    assert outcomes == {k(1, 0, 19).to_key(): "merged", k(1, 0, 29, 1).to_key(): "failed"}
    assert store.head(k(0, 0, 9, partition=1).to_key())    # inputs of the failed task stay
    assert k(1, 0, 29, 1).to_key() not in listing(store)
    assert [x for x in listing(store) if x.startswith("temp/")] == []


def test_dry_run_touches_nothing() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 9), (10, 19)])
    write_segment(store, k(1, 0, 9), make_records(0, 9))   # covers a leftover
    before = {x: store.head(x) for x in listing(store)}
    report = controller(store).run_once(dry_run=True)
    assert report.dry_run and report.covered_to_delete == [k(0, 0, 9).to_key()]
    assert report.tasks == []
    assert {x: store.head(x) for x in listing(store)} == before


def test_level_range_override_1_to_2() -> None:
    store = MemoryObjectStore()
    l1 = seed(store, [(0, 99), (100, 199)], level=1)
    seed(store, [(200, 209), (210, 219)], level=0)
    c = controller(store)
    report = c.run_once(min_level=1, max_level=1)
    assert [t.output for t in report.tasks] == [k(2, 0, 199).to_key()]
    assert all(x.to_key() not in listing(store) for x in l1)
    assert k(0, 200, 209).to_key() in listing(store)
    with pytest.raises(ConfigError, match=r"level range 2\.\.1"):
        c.run_once(min_level=2, max_level=1)
    with pytest.raises(ConfigError, match="not in"):
        c.run_once(topic="nope")


def test_delete_false_keeps_inputs_and_rerun_does_not_merge_again() -> None:
    settings = compaction_settings(topics={"t": {"min_segment_age": "1h",
                                                 "min_segment_count": 2,
                                                 "min_segment_size": 1, "delete": False}})
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 9), (10, 19)])
    assert controller(store, settings=settings).run_once().outcome == "success"
    assert all(x.to_key() in listing(store) for x in inputs)
    report = controller(store, settings=settings).run_once()
    assert report.tasks == [] and report.deleted == []


# --- the region lock ------------------------------------------------------------------------


def test_second_concurrent_run_is_skipped() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 9), (10, 19)])
    other = RegionLock(store, lock_key("data", "r1"), timedelta(hours=1), clock, owner="other")
    assert other.acquire()
    c = controller(store)
    report = c.run_once()
    assert report.outcome == "skipped" and "other" in (report.reason or "")
    assert c.m.summary()["runs"]["skipped"] == 1
    assert k(0, 0, 9).to_key() in listing(store)
    other.release()
    assert c.run_once().outcome == "success"


def test_expired_lock_is_taken_over_and_released() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 9), (10, 19)])
    past = clock() - timedelta(hours=5)
    store.put(lock_key("data", "r1"),
              LockState("dead-run", past, past + timedelta(hours=2)).to_json())
    report = controller(store).run_once()
    assert report.outcome == "success"
    assert lock_key("data", "r1") not in listing(store)


def test_lock_protocol() -> None:
    store = MemoryObjectStore()
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    key = lock_key("data", "r1")
    a = RegionLock(store, key, timedelta(minutes=10), lambda: now[0], owner="a")
    b = RegionLock(store, key, timedelta(minutes=10), lambda: now[0], owner="b")
    assert a.acquire() and not b.acquire()
    assert b.holder is not None and b.holder.owner == "a"
    now[0] += timedelta(minutes=5)
    assert a.refresh()                      # extended to +15 min
    now[0] += timedelta(minutes=9)
    assert not b.acquire()                  # the refresh kept it alive
    now[0] += timedelta(minutes=2)
    assert b.acquire()                      # expired: taken over
    assert not a.confirm() and not a.refresh()
    a.release()                             # not ours any more: left alone
    assert json.loads(store.get(key))["owner"] == "b"
    b.release()
    assert key not in listing(store)
    # an unreadable lock counts from its last-modified time
    store.put(key, b"garbage")
    c = RegionLock(store, key, timedelta(minutes=10), lambda: datetime.now(UTC), owner="c")
    assert not c.acquire()
    late = RegionLock(store, key, timedelta(minutes=10),
                      lambda: datetime.now(UTC) + timedelta(minutes=11), owner="d")
    assert late.acquire()


# --- schedule -------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule, expected", [
    ("0 1 * * *", ["2026-03-01T01:00:00", "2026-03-02T01:00:00", "2026-03-03T01:00:00"]),
    ("0 0 1 * * *", ["2026-03-01T01:00:00", "2026-03-02T01:00:00", "2026-03-03T01:00:00"]),
    ("30 15 2 * * *", ["2026-03-01T02:15:30", "2026-03-02T02:15:30", "2026-03-03T02:15:30"]),
    ("*/20 * * * *", ["2026-02-28T23:20:00", "2026-02-28T23:40:00", "2026-03-01T00:00:00"]),
])
def test_cron_schedule_5_and_6_fields(schedule: str, expected: list[str]) -> None:
    now = [datetime(2026, 2, 28, 23, 5, 7, tzinfo=UTC)]
    fired: list[str] = []
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        now[0] += timedelta(seconds=seconds)
        return False

    settings = compaction_settings(schedule=schedule)
    c = Compaction(settings, store=MemoryObjectStore(), clock=lambda: now[0], wait=wait)

    def fake_run_once(*args: Any, **kw: Any) -> None:
        fired.append(now[0].replace(tzinfo=None).isoformat())
        if len(fired) == 3:
            c.stop()

    c.run_once = fake_run_once  # type: ignore[method-assign,assignment]
    c.start()
    c.run()
    c.close()
    assert fired == expected
    assert waits[0] == (datetime.fromisoformat(expected[0]).replace(tzinfo=UTC)
                        - datetime(2026, 2, 28, 23, 5, 7, tzinfo=UTC)).total_seconds()


def test_stop_while_waiting_ends_run_without_running() -> None:
    c = Compaction(compaction_settings(), store=MemoryObjectStore(), clock=clock,
                   wait=lambda s: True)
    c.run_once = lambda *a, **kw: pytest.fail("must not run")  # type: ignore[method-assign]
    c.run()
    c.close()
    c.close()


def test_settings_payload_round_trips_secrets() -> None:
    s = compaction_settings(s3={"access_key_id": "AK", "secret_access_key": "SK",
                                "storage_class": {"1": "STANDARD_IA"}})
    back = settings_from_payload(json.loads(json.dumps(settings_payload(s))))
    assert back.s3.access_key_id is not None
    assert back.s3.access_key_id.get_secret_value() == "AK"
    assert back.s3 == s.s3 and back.format == s.format and back.region == s.region


def test_stop_during_a_run_cancels_unfinished_merges_and_keeps_their_inputs() -> None:
    store = MemoryObjectStore()
    seed(store, [(0, 9), (10, 19)], partition=0)
    seed(store, [(0, 9), (10, 19)], partition=1)
    before = listing(store)
    c = controller(store, settings=compaction_settings(parallelism=1))
    reads = {"n": 0}
    original = store.get_range

    def get_range(key: str, start: int, length: int) -> bytes:
        reads["n"] += 1
        if reads["n"] == 1:
            c.stop()   # SIGTERM arrives while the first merge reads its first input
        return original(key, start, length)

    store.get_range = get_range  # type: ignore[method-assign]
    report = c.run_once()
    assert report.outcome == "failed" and "stopped" in (report.reason or "")
    assert {t.outcome for t in report.tasks} == {"failed"}
    assert listing(store) == before


def test_merge_memory_is_bounded_by_batches_and_row_groups_not_segment_size() -> None:
    store = MemoryObjectStore()
    keys = []
    rng = random.Random(1)
    for i in range(8):   # 8 x 4 MB of incompressible values
        recs = [Record(o, 0, b"k", rng.randbytes(2000)) for o in range(i * 2000, (i + 1) * 2000)]
        keys.append(k(0, i * 2000, (i + 1) * 2000 - 1))
        write_segment(store, keys[-1], recs)
    spec = TaskSpec([x.to_key() for x in keys], [1] * 8, k(1, 0, 15999).to_key(), 200)
    previous = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(previous)
    pa.set_memory_pool(pool)
    try:
        res = merge_segments(store, get_format("parquet"),
                             WriterOptions(row_group_size=1024 * 1024), "temp", spec)
    finally:
        pa.set_memory_pool(previous)
    assert res.ok and res.records == 16000 and res.bytes_out > 32_000_000
    # 1 MiB row groups, 200-record (400 KB) batches, 2 read ahead: a few MB, not 32
    assert pool.max_memory() < 8_000_000, pool.max_memory()


def test_a_partial_failure_is_compacted_by_the_next_run() -> None:
    # Three tasks in one run; the middle one fails to publish, the last succeeds. The next
    # run merges the middle range although it lies below the highest compacted end.
    store = MemoryObjectStore()
    failures = [1]
    seed(store, [(i * 100, i * 100 + 99) for i in range(6)])
    middle = k(1, 200, 399).to_key()

    copy = store.copy

    def copy_failing_middle(src: str, dst: str, *, storage_class: str | None = None
                            ) -> ObjectInfo:
        if dst == middle and failures[0] > 0:
            failures[0] -= 1
            raise StorageError(f"injected: copy {src} -> {dst}")
        return copy(src, dst, storage_class=storage_class)

    store.copy = copy_failing_middle  # type: ignore[method-assign]
    settings = compaction_settings(topics={"t": {
        "min_segment_age": "1h", "min_segment_count": 2, "min_segment_size": 1,
        "max_segment_count": 2, "max_segment_size": "1GiB", "batch_size": 7}})
    c = controller(store, settings=settings)
    report = c.run_once()
    assert {t.output: t.outcome for t in report.tasks} == {
        k(1, 0, 199).to_key(): "merged", middle: "failed", k(1, 400, 599).to_key(): "merged"}
    report = c.run_once()
    assert report.outcome == "success"
    assert [t.output for t in report.tasks] == [middle]
    assert segment_keys(store) == [k(1, 0, 199).to_key(), middle, k(1, 400, 599).to_key()]
    got = [r.offset for key in (k(1, 0, 199), k(1, 200, 399), k(1, 400, 599))
           for r in read_segment(store, key)]
    assert got == list(range(600))


def test_a_refresh_racing_release_never_recreates_the_lock() -> None:
    # The keeper's refresh read the lock (still ours); release deleted it before the
    # refresh wrote the renewed lease. Re-created, it would block every run for lock_ttl.
    store = MemoryObjectStore()
    lock = RegionLock(store, lock_key("data", "r1"), timedelta(minutes=10),
                      lambda: datetime.now(UTC))
    assert lock.acquire()
    get_with_etag = store.get_with_etag

    def read_then_released(key: str) -> tuple[bytes, str]:
        got = get_with_etag(key)
        store.delete(key)          # release() ran in between
        return got

    store.get_with_etag = read_then_released  # type: ignore[method-assign]
    assert lock.refresh() is False
    assert lock_key("data", "r1") not in listing(store)


class ConflictOnCreate(MemoryObjectStore):
    """S3 answers 409 ConditionalRequestConflict: another conditional write of the key is
    in flight (another run creating the lock)."""

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        if kw.get("if_none_match"):
            response: Any = {"Error": {"Code": "ConditionalRequestConflict",
                                       "Message": "conflict"},
                             "ResponseMetadata": {"HTTPStatusCode": 409}}
            raise translate(ClientError(response, "PutObject"), f"put {key}")
        return super().put(key, data, **kw)


def test_a_409_on_creating_the_lock_is_a_skipped_run_not_a_failed_one() -> None:
    store = ConflictOnCreate()
    seed(store, [(0, 99), (100, 199)])
    report = controller(store).run_once()
    assert report.outcome == "skipped" and "holds the region lock" in (report.reason or "")


class LostReplyOnCreate(MemoryObjectStore):
    """The lock create takes effect but its reply is lost; ``then`` is what the caller sees:
    the SDK's retry of the create answered 412 (the key exists: this very create), or the
    retries ran out and a retriable error surfaced. Only the first create is affected."""

    def __init__(self, then: Exception) -> None:
        super().__init__()
        self.then: Exception | None = then

    def put(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        info = super().put(key, data, **kw)
        if kw.get("if_none_match") and self.then is not None:
            error, self.then = self.then, None
            raise error
        return info


def _precondition_412(key: str) -> Exception:
    response: Any = {"Error": {"Code": "PreconditionFailed", "Message": "exists"},
                     "ResponseMetadata": {"HTTPStatusCode": 412}}
    return translate(ClientError(response, "PutObject"), f"put {key}")


@pytest.mark.parametrize("then", ["412 on the SDK's retry", "retriable error"])
def test_a_lock_created_by_this_run_whose_reply_was_lost_is_acquired(then: str) -> None:
    key = lock_key("data", "r1")
    error = (_precondition_412(key) if then.startswith("412")
             else StorageError(f"put {key}: connection reset after the request was sent"))
    store = LostReplyOnCreate(error)
    inputs = seed(store, [(0, 99), (100, 199)])
    c = controller(store)
    report = c.run_once()
    # Not "held by <this run>": the run merges, and releases the lock it created.
    assert report.outcome == "success", report.reason
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
    assert key not in listing(store)
    assert c.m.summary()["runs"]["skipped"] == 0
    # The next run is not skipped either.
    assert controller(store).run_once().outcome == "success"


def test_a_lock_created_unseen_is_released_even_when_the_run_fails_before_it_knew() -> None:
    # The create took effect, its reply was lost, and the re-read failed too: the run
    # fails, but the lock it may have created must not block the next runs for lock_ttl.
    lock = lock_key("data", "r1")
    store = LostReplyOnCreate(StorageError(f"put {lock}: timed out"))
    seed(store, [(0, 99), (100, 199)])
    get_with_etag = store.get_with_etag
    failures = [StorageError(f"get {lock}: timed out")]

    def flaky_read(key: str) -> tuple[bytes, str]:
        if failures:
            raise failures.pop()
        return get_with_etag(key)

    store.get_with_etag = flaky_read  # type: ignore[method-assign]
    report = controller(store).run_once()
    assert report.outcome == "failed" and "timed out" in (report.reason or "")
    assert lock not in listing(store)
    assert controller(store).run_once().outcome == "success"


def test_a_later_incarnation_is_compacted_in_its_own_location_with_its_topic_id() -> None:
    # The same positions at the documented shape (the first topic) and under
    # _incarnations/IdB (the topic created again): each merged apart, neither changed.
    from dataclasses import replace as dc_replace

    from formats.base import SegmentMetadata
    from formats.records import batch_to_records, records_to_batch
    from formats.segment_io import SegmentUpload, open_segment, publish_segment
    store = MemoryObjectStore()
    old = seed(store, [(0, 99), (100, 199), (200, 299)])
    expected_old = [x.offset for key in old for x in read_segment(store, key)]
    later = []
    for x in old:
        y = dc_replace(x, incarnation="IdB")
        up = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
        up.write_batch(records_to_batch([Record(o, 1, None, b"new") for o in
                                         range(y.start, y.end + 1)]))
        publish_segment(store, up.finish(SegmentMetadata.for_key(y, y.span,
                                                                 topic_id="IdB")).key, y)
        later.append(y)
    report = controller(store).run_once()
    assert report.outcome == "success", report
    assert sorted(t.output for t in report.tasks) == [
        k(1, 0, 299).to_key(), dc_replace(k(1, 0, 299), incarnation="IdB").to_key()]
    assert sorted(segment_keys(store)) == sorted(t.output for t in report.tasks)
    with open_segment(store, dc_replace(k(1, 0, 299), incarnation="IdB")) as r:
        assert r.metadata.topic_id == "IdB"
        assert {rec.value for b in r.iter_batches(1000) for rec in batch_to_records(b)} \
            == {b"new"}
    assert [x.offset for x in read_segment(store, k(1, 0, 299))] == expected_old


def test_one_partition_is_compacted_in_every_incarnation() -> None:
    # --partition 0 of a topic recreated (IdB) and recreated again (IdC): partition 0 of
    # each incarnation is merged in its own location; partition 1 of none is touched.
    from dataclasses import replace as dc_replace

    from formats.base import SegmentMetadata
    from formats.records import records_to_batch
    from formats.segment_io import SegmentUpload, publish_segment
    store = MemoryObjectStore()
    ranges = [(0, 99), (100, 199), (200, 299)]
    seed(store, ranges)
    seed(store, ranges, partition=1)
    for tid in ("IdB", "IdC"):
        for p in (0, 1):
            for s, e in ranges:
                y = dc_replace(k(0, s, e, p), incarnation=tid)
                up = SegmentUpload(store, get_format("parquet"), "temp", WriterOptions())
                up.write_batch(records_to_batch([Record(o, 1, None, tid.encode())
                                                 for o in range(s, e + 1)]))
                publish_segment(store, up.finish(SegmentMetadata.for_key(
                    y, y.span, topic_id=tid)).key, y)
    report = controller(store).run_once(partition=0)
    assert report.outcome == "success", report
    assert sorted(t.output for t in report.tasks) == sorted(
        dc_replace(k(1, 0, 299), incarnation=i).to_key() for i in ("", "IdB", "IdC"))
    left = segment_keys(store)
    assert sum(1 for x in left if SegmentKey.parse(x).partition == 1) == 9
