"""The follower: its lazy reduction of a key's values gives what reading them all gives;
a load waits as a state, woken by the reader."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from ingress.checkpoints import latest_from_end, latest_valid


def value(rnd: random.Random, i: int) -> bytes | None:
    pick = rnd.random()
    if pick < 0.15:
        return None                                   # tombstone
    if pick < 0.3:
        return b"not json %d" % i                     # invalid
    return b'{"offset": %d, "segment": "s", "updated_at": "2026-11-21T00:00:00Z"}' % i


def test_latest_from_end_equals_latest_valid_also_when_reduced_in_steps() -> None:
    rnd = random.Random(5)
    for _ in range(300):
        values = [value(rnd, i) for i in range(rnd.randint(0, 12))]
        want = latest_valid("k", values, None)
        got, reduced = latest_from_end("k", values, None)
        assert got == want
        # Reduced at any point, then more values: still the same answer.
        cut = rnd.randint(0, len(values))
        _, head = latest_from_end("k", values[:cut], None)
        assert latest_from_end("k", head + values[cut:], None)[0] == want
        assert len(reduced) <= 1


class FakeMessage:
    def __init__(self, key: bytes, value: bytes | None, offset: int) -> None:
        self._k, self._v, self._o = key, value, offset

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def offset(self) -> int:
        return self._o


class FakeLog:
    """One checkpoint partition: ``end`` (read_uncommitted) and what a fetch hands out up
    to ``readable`` (read_committed: the stable offset)."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []
        self.readable = 0
        self.pos = 0
        self.lock = threading.Lock()

    def fetch(self, max_messages: int, timeout: float) -> Any:
        from replicator.core.kafka import Fetched

        time.sleep(0.005)
        out = Fetched()
        with self.lock:
            upto = min(self.readable, self.pos + max_messages)
            run = [FakeMessage(k, v, o) for o, (k, v) in
                   enumerate(self.records[self.pos:upto], start=self.pos)]
            self.pos = upto
        if run:
            out.runs[("cps", 0)] = cast(list[Any], run)
        out.ends[("cps", 0)] = upto
        return out

    def watermarks(self, tp: Any, timeout: float) -> tuple[int, int]:
        with self.lock:
            return 0, len(self.records)

    def close(self) -> None:
        return


def test_a_waiting_load_holds_no_thread_and_is_woken_once_the_reader_passed_the_end() -> None:
    """The reader takes the end offsets after the load began and wakes the load only when
    it has read that far (an open transaction holds the stable offset back meanwhile)."""
    from ingress.checkpoints import FollowingCheckpointStore
    from replicator.core.metrics import Metrics
    from replicator.core.settings import KafkaSettings
    from replicator.core.wire import Checkpoint

    fake = FakeLog()
    store = FollowingCheckpointStore(KafkaSettings(brokers="x:1"), "cps", Metrics())
    store._consumer = fake  # type: ignore[assignment]
    store._ends = fake  # type: ignore[assignment]
    store._partitions = [0]
    cp = Checkpoint(41, "s", datetime(2026, 11, 23, tzinfo=UTC))
    with fake.lock:
        records: list[tuple[bytes, bytes | None]] = [(b"other", cp.encode())] * 100
        fake.records = [*records, (b"r:t:0:d", cp.encode())]
    store._thread = threading.Thread(target=store._run, daemon=True)
    store._thread.start()
    try:
        woken = threading.Event()
        ticket = store.begin_load()
        assert not store.load_ready(ticket, woken.set)
        time.sleep(0.2)               # the reader took the end (101) but reads nothing yet
        assert not woken.is_set() and ticket.targets == {0: 101}
        with fake.lock:
            fake.readable = 100       # the stable offset: the last record is still open
        time.sleep(0.2)
        assert not woken.is_set()
        with fake.lock:
            fake.readable = 101
        assert woken.wait(5)
        assert store.load_ready(ticket, woken.set)
        assert store.load_for("r:t:0:d", None, ticket) == (cp, False)
    finally:
        store.close()


def reader(fake: FakeLog) -> Any:
    from ingress.checkpoints import FollowingCheckpointStore
    from replicator.core.metrics import Metrics
    from replicator.core.settings import KafkaSettings

    store = FollowingCheckpointStore(KafkaSettings(brokers="x:1"), "cps", Metrics())
    store._consumer = fake  # type: ignore[assignment]
    store._ends = fake  # type: ignore[assignment]
    store._partitions = [0]
    store._thread = threading.Thread(target=store._run, daemon=True)
    store._thread.start()
    return store


class FlakyLog(FakeLog):
    """A fetch that fails retriably a few times (a broker restart, a coordinator move)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def fetch(self, max_messages: int, timeout: float) -> Any:
        from replicator.core.errors import KafkaRetriableError

        with self.lock:
            if self.failures > 0:
                self.failures -= 1
                raise KafkaRetriableError("consume: broker transport failure")
        return super().fetch(max_messages, timeout)


def test_a_retriable_fetch_error_does_not_end_the_reader() -> None:
    """Was: the first retriable error of a fetch ended the reader for the life of the
    process, and every session of every partition failed from then on."""
    from replicator.core.wire import Checkpoint

    fake = FlakyLog(failures=2)
    cp = Checkpoint(41, "s", datetime(2026, 11, 23, tzinfo=UTC))
    with fake.lock:
        fake.records = [(b"r:t:0:d", cp.encode())]
        fake.readable = 1
    store = reader(fake)
    try:
        woken = threading.Event()
        ticket = store.begin_load()
        if not store.load_ready(ticket, woken.set):
            assert woken.wait(10)
        assert store.load_for("r:t:0:d", None, ticket) == (cp, False)
        assert not store.failed and fake.failures == 0
    finally:
        store.close()


def test_a_reader_that_failed_is_reported() -> None:
    """A reader ended by an error no retry can pass makes every load fail: ``failed``
    tells the process (its /healthz) so that it is restarted."""
    from replicator.core.errors import KafkaRetriableError

    class BrokenLog(FakeLog):
        def fetch(self, max_messages: int, timeout: float) -> Any:
            raise RuntimeError("a bug in the reader")

    store = reader(BrokenLog())
    try:
        deadline = time.monotonic() + 5
        while not store.failed:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ticket = store.begin_load()
        assert store.load_ready(ticket, lambda: None)
        with pytest.raises(KafkaRetriableError):
            store.load_for("r:t:0:d", None, ticket)
    finally:
        store.close()
