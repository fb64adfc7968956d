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
    ("FAILED", timedelta(days=9), False),      # never, until someone fixes replication
    (None, timedelta(minutes=5), False),       # no status (replicator sync): wait the grace
    (None, timedelta(minutes=30), True),
])
def test_replicated(status: str | None, age: timedelta, safe: bool) -> None:
    ok, why = replicated(info(status, age), NOW, timedelta(minutes=15))
    assert ok is safe and why


def settings_with_grace(grace: str) -> object:
    return compaction_settings(replication_grace=grace)


def test_inputs_stay_until_the_output_is_replicated() -> None:
    store = MemoryObjectStore()
    inputs = seed(store, [(0, 99), (100, 199)])
    statuses = {k(1, 0, 199).to_key(): "PENDING"}
    head = store.head

    def head_with_status(key: str) -> ObjectInfo:
        i = head(key)
        return ObjectInfo(i.key, i.size, i.last_modified, i.etag, i.storage_class,
                          statuses.get(key))

    store.head = head_with_status  # type: ignore[method-assign]
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
