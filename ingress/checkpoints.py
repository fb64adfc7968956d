"""Reading checkpoints: the last source position replayed per source partition.

The key and JSON value (``Checkpoint``) are encoded in ``replicator.core.wire``
(docs/architecture.md, "Checkpoints"); they live on a log-compacted topic.

Only the replay worker's durability method writes checkpoints (through its producer, in
the same transaction as the records in exactly-once mode). ``CheckpointStore`` reads them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Literal

from replicator.core.errors import (
    KafkaRetriableError,
    ReplicatorError,
    RetriableError,
    TopicError,
)
from replicator.core.kafka import Consumer, Fetched, TopicPartition, read_to_end
from replicator.core.metrics import Metrics
from replicator.core.settings import KafkaSettings
from replicator.core.wire import Checkpoint

log = logging.getLogger(__name__)


class LoadTicket:
    """What a load begun with ``CheckpointStore.begin_load`` waits for (the reader's end
    offsets round, and that round's offsets once taken).
    """

    __slots__ = ("round", "targets")

    def __init__(self, round_: int) -> None:
        self.round = round_
        self.targets: dict[int, int] | None = None


class CheckpointStore(ABC):
    """Reads the latest committed checkpoint of a source partition.

    A replay worker loads without holding a thread while the store is not ready:
    ``begin_load``, then ``load_ready`` until True (it calls ``wake`` once when that may
    have changed), then ``load_for(key, legacy, ticket)``, which does not wait. Stores
    that never wait keep the defaults.
    """

    def begin_load(self) -> LoadTicket | None:
        """Start a load (before its ``load_for``); ``None``: this store never waits."""
        return None

    def load_ready(self, ticket: LoadTicket | None, wake: Callable[[], None]) -> bool:
        """True when ``load_for`` with ``ticket`` will not wait; otherwise False, and
        ``wake`` is called (any thread) once it may be.
        """
        return True

    def cancel_load(self, ticket: LoadTicket | None) -> None:
        """Drop a load begun with ``begin_load`` and no longer wanted (its ``wake`` is
        not called any more).
        """
        return

    def load(self, key: str) -> Checkpoint | None:
        """The latest valid checkpoint under ``key``.

        Invalid records are logged at ERROR and counted, and never win over a valid one.

        Raises:
            KafkaRetriableError: the topic could not be read to its end in time.
        """
        return self.load_for(key, None)[0]

    @abstractmethod
    def load_for(self, key: str, legacy: str | None, ticket: LoadTicket | None = None
                 ) -> tuple[Checkpoint | None, bool]:
        """The checkpoint of ``key`` (``{region}:{topic}:{partition}:{destination}``), or
        on upgrade the one under ``legacy`` (the key of earlier versions, without the
        destination), by the rule of ``resolve``. The flag is True when it came from
        ``legacy`` (the caller writes it under ``key`` at once, so the upgrade happens once).
        With a ``ticket`` that ``load_ready`` accepted, it does not wait.

        Raises:
            KafkaRetriableError: the topic could not be read to its end in time.
        """


def resolve(key: str, legacy: str | None, by_key: Mapping[str, list[bytes | None]],
            metrics: Any | None) -> tuple[Checkpoint | None, bool]:
    """Which checkpoint a source partition replayed into one destination resumes from.

    1. Any record under ``key`` (the key with the destination): its latest valid value
       (none after a tombstone: an operator's reset is kept).
    2. Otherwise the latest valid value under ``legacy`` (written by a version whose key
       had no destination), but only if it can belong to this deployment: no record
       exists under ``legacy:<another destination>``. When one does, another deployment
       replaying the same source into another topic already shares this checkpoint topic,
       so the legacy value may be its progress: it is not used (WARNING; the partition
       starts without a checkpoint, replaying more, never skipping).
    """
    if key in by_key or legacy is None or legacy not in by_key:
        return latest_valid(key, list(by_key.get(key, [])), metrics), False
    others = sorted(k for k in by_key if k.startswith(legacy + ":") and k != key)
    if others:
        log.warning("checkpoint %s of an earlier version is NOT used for %s: other "
                    "destinations (%s) share this checkpoint topic, so it may be theirs; "
                    "starting without a checkpoint", legacy, key, ", ".join(others))
        return None, False
    cp = latest_valid(legacy, list(by_key[legacy]), metrics)
    if cp is not None:
        log.info("checkpoint %s of an earlier version (offset %d) is taken over as %s",
                 legacy, cp.offset, key)
    return cp, cp is not None


class MemoryCheckpointStore(CheckpointStore):
    """A dict of checkpoints (unit tests)."""

    def __init__(self) -> None:
        self.values: dict[str, list[bytes | None]] = {}
        self._lock = threading.Lock()

    def append(self, key: str, value: bytes | None) -> None:
        """Record a written value (what a sink's commit does)."""
        with self._lock:
            self.values.setdefault(key, []).append(value)

    def load_for(self, key: str, legacy: str | None, ticket: LoadTicket | None = None
                 ) -> tuple[Checkpoint | None, bool]:
        with self._lock:
            values = {k: list(v) for k, v in self.values.items()}
        return resolve(key, legacy, values, None)


def latest_valid(key: str, values: list[bytes | None], metrics: Any | None) -> Checkpoint | None:
    """The last decodable value of ``values`` (in log order); bad ones are logged and
    skipped, a tombstone (``None``) clears what came before.
    """
    best: Checkpoint | None = None
    for v in values:
        if v is None:
            # A tombstone deletes the checkpoint (an operator resetting a partition).
            best = None
            continue
        cp = _decoded(key, v, metrics)
        if cp is not None:
            best = cp
    return best


def _decoded(key: str, value: bytes, metrics: Any | None) -> Checkpoint | None:
    """``value`` decoded, or ``None`` after logging (ERROR) and counting it as invalid."""
    try:
        return Checkpoint.decode(value)
    except ValueError as e:
        log.error("invalid checkpoint record for %s ignored: %s", key, e)
        if metrics is not None:
            metrics.labels(key=key).inc()
        return None


def invalid_checkpoints(metrics: Metrics) -> Any:
    """The counter of checkpoint records that could not be parsed, by key."""
    return metrics.counter("ingress_checkpoints_invalid_total",
                           "Checkpoint records that could not be parsed (ignored).", ["key"])


class KafkaCheckpointStore(CheckpointStore):
    """Reads the checkpoint topic with ``read_committed``, from the beginning to its end.

    Each ``load`` uses a fresh, group-less consumer assigned to every partition of the
    topic and stops at partition EOF (for ``read_committed`` that is the last stable
    offset, so an open transaction of a fenced producer is waited for, not read past).
    The topic is log-compacted, so it holds about one record per source partition.
    """

    def __init__(self, kafka_settings: KafkaSettings, topic: str, metrics: Metrics, *,
                 timeout: float = 60.0) -> None:
        self.kafka_settings = kafka_settings
        self.topic = topic
        self.timeout = timeout
        self._invalid = invalid_checkpoints(metrics)

    def load_for(self, key: str, legacy: str | None, ticket: LoadTicket | None = None
                 ) -> tuple[Checkpoint | None, bool]:
        want = key.encode()
        old = None if legacy is None else legacy.encode()
        by_key: dict[str, list[bytes | None]] = {}
        for k, v in self._read_records(
                lambda k: k == want or (old is not None
                                        and (k == old or k.startswith(old + b":")))):
            by_key.setdefault(k.decode(errors="replace"), []).append(v)
        return resolve(key, legacy, by_key, self._invalid)

    def load_all(self) -> dict[str, Checkpoint]:
        """The latest valid checkpoint of every key in the topic (operator tools)."""
        by_key: dict[str, list[bytes | None]] = {}
        for k, v in self._read_records(None):
            by_key.setdefault(k.decode(errors="replace"), []).append(v)
        out = {}
        for key, values in by_key.items():
            cp = latest_valid(key, values, self._invalid)
            if cp is not None:
                out[key] = cp
        return out

    def _read_records(self, want: Callable[[bytes], bool] | None
                      ) -> list[tuple[bytes, bytes | None]]:
        """Committed ``(key, value)`` records whose key ``want`` accepts (or every
        record, when ``want`` is None), in log order.

        The checkpoint topic's partitions are shared by every worker, and a read_committed
        reader stops at the last stable offset: while *another* worker's transaction is open,
        a checkpoint committed after it started is not visible yet. Stopping there would
        hand a new owner a stale checkpoint and make it replay a committed batch. So:

        1. read_uncommitted to the end: per partition, the offset after the last record for
           ``want`` (every record, when ``want`` is None), committed or not;
        2. read_committed until each partition's stable end has passed that offset, i.e.
           every transaction that could hold a newer checkpoint has committed or aborted.
        """
        need = self._scan(want, "read_uncommitted")[1]
        return self._scan(want, "read_committed", need)[0]

    def _scan(self, want: Callable[[bytes], bool] | None, isolation: Literal["read_committed",
                                                           "read_uncommitted"],
              need: dict[int, int] | None = None
              ) -> tuple[list[tuple[bytes, bytes | None]], dict[int, int]]:
        """Read the topic to its end; return matching records and, per partition, the
        offset after the last matching record. With ``need``, a partition counts as read
        only once its end-of-partition offset reaches ``need[p]``.
        """
        values: list[tuple[bytes, bytes | None]] = []
        last: dict[int, int] = {}
        try:
            for msg in read_to_end(self.kafka_settings, self.topic, isolation=isolation,
                                   ends_at_least=need, timeout=self.timeout, on_error="log",
                                   what="checkpoint topic",
                                   overrides={"fetch.wait.max.ms": 10}):
                key = msg.key()
                if key is not None and (want is None or want(key)):
                    values.append((key, msg.value()))
                    p, off = msg.partition(), msg.offset()
                    if p is not None and off is not None:
                        last[p] = max(last.get(p, 0), off + 1)
        except KafkaRetriableError as e:
            raise KafkaRetriableError(f"{e} (an open transaction of another writer holds "
                                      "the stable offset back)") from e
        return values, last


FETCH_MAX = 10_000
"""Records the checkpoint reader takes per fetch (a start reads the whole topic)."""

COLLAPSE_AT = 64
"""Raw values a key may collect in a ``FollowingCheckpointStore`` before they are reduced to
the latest valid one (decoding is lazy and costs far more than keeping a value: a key is
decoded about once per this many of its records, and once when a worker loads it; memory:
at most this many values per key)."""

RETRY_PAUSE = 1.0
"""Seconds before the checkpoint reader fetches again after a retriable error."""


def latest_from_end(key: str, values: list[bytes | None], metrics: Any | None
                    ) -> tuple[Checkpoint | None, list[bytes | None]]:
    """``latest_valid`` read from the end: the last value that is a tombstone or decodes
    wins; invalid ones after it are logged and counted. Also returns the values reduced to
    that one (``[]`` when none is valid), for the next call.
    """
    for i in range(len(values) - 1, -1, -1):
        v = values[i]
        if v is None:
            return None, [None]
        cp = _decoded(key, v, metrics)
        if cp is not None:
            return cp, [v]
    return None, []


class FollowingCheckpointStore(CheckpointStore):
    """One reader per process: the checkpoint topic read once, read_committed, into a map
    of the latest value per key, and followed from then on; workers load from memory.

    A load waits until the reader has passed the topic's end offsets (read_uncommitted:
    committed or not) taken *after* the load began, i.e. until every transaction that had
    written a checkpoint by then has committed or aborted (read_committed reads stop at the
    last stable offset). So a partition's new owner, whose load starts after its assignment,
    never starts from a checkpoint older than one a former owner's transaction was still
    committing (ingress/README.md, "Producer and fencing", point 3), and a session restarted
    after a commit of unknown outcome sees that commit's result. The reader thread takes the
    end offsets itself, one round for every load begun before it (one ListOffsets per
    partition of the checkpoint topic per round, whatever the number of workers).

    Waiting is a state of the worker, not a blocked thread (``begin_load`` /
    ``load_ready``): the reader wakes the loads it has read far enough for. A load that
    waits longer than ``timeout`` is reported (WARNING) and goes on waiting; only a reader
    that stopped fails it.

    On a broker whose ListOffsets "latest" is the start of the last record batch + 1
    (the embedded Tansu), the offset taken still lies inside that batch's transaction, so
    waiting past it still waits for that transaction.
    """

    def __init__(self, kafka_settings: KafkaSettings, topic: str, metrics: Metrics, *,
                 timeout: float = 60.0) -> None:
        self.kafka_settings = kafka_settings
        self.topic = topic
        self.timeout = timeout
        self._invalid = invalid_checkpoints(metrics)
        self._raw: dict[str, list[bytes | None]] = {}
        self._reached: dict[int, int] = {}
        self._cond = threading.Condition()
        self._round = 0                      # end-offset rounds completed
        self._requested = 0                  # rounds loads wait for
        self._targets: dict[int, int] = {}   # the last round's end offsets
        self._taking = False
        self._waiters: dict[int, tuple[LoadTicket, Callable[[], None], float]] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._consumer: Consumer | None = None
        self._ends: Consumer | None = None
        self._partitions: list[int] = []

    def start(self) -> None:
        """Assign every partition from the beginning (read_committed) and start the reader.

        Raises:
            TopicError / KafkaRetriableError: the topic is missing or unreadable.
        """
        group = f"replicator.checkpoints.{uuid.uuid4().hex}"   # never joined: no commits
        self._consumer = Consumer(self.kafka_settings, group, {
            "enable.partition.eof": True, "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10})
        self._ends = Consumer(self.kafka_settings, group + ".ends",
                              {"isolation.level": "read_uncommitted"})
        # Right after the topic was created, the broker's metadata may not list it yet.
        deadline = time.monotonic() + min(self.timeout, 10.0)
        while not (parts := self._consumer.partitions_of(self.topic, timeout=self.timeout)):
            if time.monotonic() > deadline:
                raise TopicError(f"checkpoint topic {self.topic} is missing")
            time.sleep(0.2)
        self._partitions = parts
        self._consumer.assign_from_beginning(self.topic, self._partitions)
        self._thread = threading.Thread(target=self._run, name="checkpoint-reader",
                                        daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        """True once the reader stopped on an error (every load fails from then on)."""
        with self._cond:
            return self._failed is not None

    def close(self) -> None:
        """Stop the reader; idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)
        for c in (self._consumer, self._ends):
            if c is not None:
                try:
                    c.close()
                except ReplicatorError as e:
                    log.warning("closing the checkpoint reader: %s", e)
        self._consumer = self._ends = None

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        try:
            while not self._stopping.is_set():
                self._take_round()
                try:
                    fetched = consumer.fetch(FETCH_MAX, 0.1)
                except RetriableError as e:
                    # A broker restart or a network blip: the loads wait meanwhile.
                    log.warning("reading checkpoint topic %s (retried in %.0fs): %s",
                                self.topic, RETRY_PAUSE, e)
                    self._stopping.wait(RETRY_PAUSE)
                    continue
                for w in self._apply(fetched):
                    w()
        except BaseException as e:
            # Every load fails from now on (``load_for``), and ``failed`` makes the
            # process unhealthy (/healthz) so that it is restarted.
            log.exception("the checkpoint reader stopped")
            with self._cond:
                self._failed = e
                self._cond.notify_all()
                waiters, self._waiters = list(self._waiters.values()), {}
            for _t, w, _since in waiters:
                w()

    def _apply(self, fetched: Fetched) -> list[Callable[[], None]]:
        """Take in one fetch; returns the wake-ups of the loads it made ready."""
        for err in fetched.errors:
            log.warning("reading checkpoint topic %s: %s", self.topic, err)
        with self._cond:
            for (_t, p), run in fetched.runs.items():
                for msg in run:
                    self._add(msg.key(), msg.value())
                last = run[-1].offset()
                if last is not None:
                    self._reached[p] = max(self._reached.get(p, 0), last + 1)
            for (_t, p), end in fetched.ends.items():
                self._reached[p] = max(self._reached.get(p, 0), end)
            if fetched.runs or fetched.ends:
                self._cond.notify_all()
            return self._ready_waiters()

    def _add(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        k = key.decode(errors="replace")
        values = self._raw.setdefault(k, [])
        values.append(value)
        if len(values) >= COLLAPSE_AT:
            self._raw[k] = latest_from_end(k, values, self._invalid)[1]

    def _take_round(self) -> None:
        """Take the end offsets when a load waits for a round (the reader thread)."""
        with self._cond:
            if self._requested <= self._round:
                return
            self._taking = True
        try:
            targets = self._end_offsets()
        except ReplicatorError as e:
            log.warning("checkpoint topic %s: end offsets not taken (retried): %s",
                        self.topic, e)
            with self._cond:
                self._taking = False
            return
        with self._cond:
            self._targets = targets
            self._round += 1
            self._taking = False
            self._cond.notify_all()

    def _ready_waiters(self) -> list[Callable[[], None]]:
        """Under the lock: pop the waiters whose load no longer waits; report long ones."""
        if not self._waiters:
            return []
        now = time.monotonic()
        ready: list[Callable[[], None]] = []
        checked: dict[int, bool] = {}
        for wid, (ticket, wake, since) in list(self._waiters.items()):
            if ticket.targets is None and self._round >= ticket.round:
                ticket.targets = self._targets
            if ticket.targets is None:
                ok = False
            else:
                known = checked.get(id(ticket.targets))
                if known is None:
                    known = checked[id(ticket.targets)] = not self._behind(ticket.targets)
                ok = known
            if ok:
                del self._waiters[wid]
                ready.append(wake)
            elif now - since > self.timeout:
                # Once per load and timeout: then counted from now again.
                self._waiters[wid] = (ticket, wake, now)
                log.warning("checkpoint topic %s: a load has waited more than %.0fs for "
                            "the reader (%s); still waiting", self.topic, self.timeout,
                            "end offsets not taken yet" if ticket.targets is None else
                            f"partitions behind: {self._behind(ticket.targets)} (an open "
                            "transaction of another writer holds the stable offset back?)")
        return ready

    def _behind(self, targets: Mapping[int, int]) -> dict[int, int]:
        return {p: t for p, t in targets.items() if self._reached.get(p, 0) < t}

    # --- loads ------------------------------------------------------------------------

    def _end_offsets(self) -> dict[int, int]:
        ends = self._ends
        assert ends is not None, "start() first"
        return {p: ends.watermarks(TopicPartition(self.topic, p),
                                   timeout=self.timeout)[1] for p in self._partitions}

    def begin_load(self) -> LoadTicket:
        """A load that waits for end offsets taken after now (a round begun later)."""
        with self._cond:
            want = self._round + (2 if self._taking else 1)
            self._requested = max(self._requested, want)
            self._cond.notify_all()
            return LoadTicket(want)

    def load_ready(self, ticket: LoadTicket | None, wake: Callable[[], None]) -> bool:
        if ticket is None:
            return True
        with self._cond:
            if self._failed is not None:
                return True                  # load_for raises
            if ticket.targets is None and self._round >= ticket.round:
                ticket.targets = self._targets
            if ticket.targets is not None and not self._behind(ticket.targets):
                self._waiters.pop(id(ticket), None)
                return True
            since = self._waiters.get(id(ticket), (None, None, time.monotonic()))[2]
            self._waiters[id(ticket)] = (ticket, wake, since)
            return False

    def cancel_load(self, ticket: LoadTicket | None) -> None:
        if ticket is not None:
            with self._cond:
                self._waiters.pop(id(ticket), None)

    def load_for(self, key: str, legacy: str | None, ticket: LoadTicket | None = None
                 ) -> tuple[Checkpoint | None, bool]:
        """Without a ticket (operator tools, tests): begins a load and waits for it, up to
        ``timeout``.
        """
        if ticket is None:
            ticket = self.begin_load()
            woken = threading.Event()
            deadline = time.monotonic() + self.timeout
            while not self.load_ready(ticket, woken.set):
                left = deadline - time.monotonic()
                if left <= 0 or not woken.wait(left):
                    with self._cond:
                        self._waiters.pop(id(ticket), None)
                        behind = None if ticket.targets is None \
                            else self._behind(ticket.targets)
                    raise KafkaRetriableError(
                        f"checkpoint topic {self.topic}: not read far enough within "
                        f"{self.timeout:.0f}s ("
                        + ("end offsets not taken" if behind is None else
                           f"partitions behind: {behind}; an open transaction of another "
                           "writer holds the stable offset back") + ")")
                woken.clear()
        with self._cond:
            if self._failed is not None:
                raise KafkaRetriableError(f"the checkpoint reader failed: {self._failed}")
            latest: dict[str, list[bytes | None]] = {}
            for k in (key, legacy):
                if k is not None and k in self._raw:
                    _cp, reduced = latest_from_end(k, self._raw[k], self._invalid)
                    self._raw[k] = reduced
                    latest[k] = reduced
            if legacy is not None and key not in self._raw:
                prefix = legacy + ":"
                for k in self._raw:
                    if k.startswith(prefix) and k != key:
                        latest.setdefault(k, [])
        return resolve(key, legacy, latest, self._invalid)
