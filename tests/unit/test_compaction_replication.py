"""Compaction deletes inputs only after their output is safe in the other region."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from compaction.replication import replicated
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore, ObjectInfo
from tests.unit.test_compaction_controller import controller, k, listing, seed, segment_keys
from tests.unit.test_compaction_helpers import compaction_settings

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def info(status: str | None, age: timedelta = timedelta(0)) -> ObjectInfo:
    return ObjectInfo("k", 1, NOW - age, replication_status=status)


@pytest.mark.parametrize(("status", "age", "safe"), [
    ("COMPLETED", timedelta(0), True),         # the replica exists
    ("REPLICA", timedelta(0), True),
    ("PENDING", timedelta(days=9), False),     # not yet, however old
    ("FAILED", timedelta(days=9), False),      # never, until someone re-drives it
    (None, timedelta(minutes=5), False),       # no status (replicator sync): wait the grace
    (None, timedelta(minutes=30), True),
])
def test_replicated(status: str | None, age: timedelta, safe: bool) -> None:
    verdict = replicated(info(status, age), NOW, timedelta(minutes=15))
    assert verdict.delete is safe and verdict.why
    assert verdict.failed is (status == "FAILED")


def test_without_a_status_and_without_a_grace_inputs_are_never_deleted() -> None:
    # replication_grace unset: the store says nothing about replication (replicator sync,
    # no replication rule), so nothing tells when the other region has the output.
    verdict = replicated(info(None, timedelta(days=365)), NOW, None)
    assert not verdict.delete and not verdict.failed
    assert "replication_grace" in verdict.why
    assert replicated(info("COMPLETED"), NOW, None).delete


def with_status(store: MemoryObjectStore, statuses: dict[str, str]) -> None:
    head = store.head

    def head_with_status(key: str) -> ObjectInfo:
        i = head(key)
        return ObjectInfo(i.key, i.size, i.last_modified, i.etag, i.storage_class,
                          statuses.get(key))

    store.head = head_with_status  # type: ignore[method-assign]


def settings_with_grace(grace: str) -> object:
    return compaction_settings(replication_grace=grace)


def test_inputs_stay_until_the_output_is_replicated() -> None:
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 99), (100, 199)])
    statuses = {k(1, 0, 199).to_key(): "PENDING"}
    with_status(store, statuses)
    c = controller(store)
    report = c.run_once()
    assert report.outcome == "success" and [t.outcome for t in report.tasks] == ["merged"]
    assert report.deleted == [] and all(x.to_key() in listing(store) for x in inputs)
    assert any("replicat" in s for s in report.skipped)
    # The next run finds the inputs covered by the output; still pending: they stay.
    assert controller(store).run_once().deleted == []
    statuses[k(1, 0, 199).to_key()] = "COMPLETED"
    report = controller(store).run_once()
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
    assert segment_keys(store) == [k(1, 0, 199).to_key()]


def test_without_replication_status_the_grace_period_applies() -> None:
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 99), (100, 199)])
    settings = compaction_settings(replication_grace="3h")
    report = controller(store, settings=settings).run_once()
    assert report.deleted == [] and [t.outcome for t in report.tasks] == ["merged"]
    # The controller clock runs 2 h ahead: the output is younger than 3 h. Later: deleted.
    later = lambda: datetime.now(UTC) + timedelta(hours=4)  # noqa: E731
    report = controller(store, settings=settings, clock=later).run_once()
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
    assert isinstance(SegmentKey.parse(segment_keys(store)[0]), SegmentKey)


def test_a_failed_replication_is_an_error_with_a_metric_and_the_inputs_stay(
        caplog: pytest.LogCaptureFixture) -> None:
    # S3 never retries an object whose replication FAILED: unlike PENDING, waiting does
    # not help; someone has to re-drive it.
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 99), (100, 199)])
    output = k(1, 0, 199).to_key()
    with_status(store, {output: "FAILED"})
    c = controller(store)
    with caplog.at_level("INFO", logger="compaction"):
        report = c.run_once()
    assert [t.outcome for t in report.tasks] == ["merged"] and report.deleted == []
    assert all(x.to_key() in listing(store) for x in inputs)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and output in errors[0].getMessage()
    assert "FAILED" in errors[0].getMessage() and "re-drive" in errors[0].getMessage()
    assert any(output in e for e in report.errors)
    assert c.metrics.total("compaction_replication_failed_total", region="r1", topic="t") == 1
    # Still FAILED at the next run (leftovers covered by the output): again an ERROR.
    c.run_once()
    assert c.metrics.total("compaction_replication_failed_total", region="r1", topic="t") == 2
    assert all(x.to_key() in listing(store) for x in inputs)


def test_without_a_status_the_inputs_stay_unless_a_grace_is_configured() -> None:
    # The default: a store that reports no replication status (replicator sync) never has
    # its inputs deleted on a guess; the deletion needs replication_grace set.
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 99), (100, 199)])
    later = lambda: datetime.now(UTC) + timedelta(days=30)  # noqa: E731
    settings = compaction_settings(replication_grace=None)
    report = controller(store, settings=settings, clock=later).run_once()
    assert [t.outcome for t in report.tasks] == ["merged"] and report.deleted == []
    assert any("replication_grace" in s for s in report.skipped)
    report = controller(store, settings=settings, clock=later).run_once()
    assert report.deleted == [] and all(x.to_key() in listing(store) for x in inputs)
    # Set explicitly (even to 0s, where nothing replicates at all): deleted.
    settings = compaction_settings(replication_grace="0s")
    report = controller(store, settings=settings, clock=later).run_once()
    assert sorted(report.deleted) == sorted(x.to_key() for x in inputs)
