"""What a restore is asked, and what it leaves behind: the request, the mark each of its
batches commits beside its records (the checkpoint under a key naming the whole request),
and the refusals of a request that conflicts with the marks already in the target (an
overlapping range, another incarnation of a recreated topic). docs/restore.md says what
the operator sees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from replicator.core.errors import FatalError
from replicator.core.wire import Checkpoint
from replicator.ops.restore_plan import Plan, RestoreRange


class RestoreError(FatalError):
    """A restore cannot run, or stopped: the message says why and what to do."""


class RestoreRefused(RestoreError):
    """The request conflicts with what the target topic holds or how it is configured;
    nothing of the refused partitions was produced (the CLI exits 2).

    Args:
        reasons: one sentence per conflict, naming it and what to do.
    """

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def range_id(rng: RestoreRange) -> str:
    """A range's part of a checkpoint key: ``{from_offset}..{to_offset}:{from_time}..{to_time}``
    (ms), an open bound left empty (``120..287:..``, ``..:1700000000000..1700086399999``).
    """
    def b(x: int | None) -> str:
        return "" if x is None else str(x)
    return f"{b(rng.from_offset)}..{b(rng.to_offset)}:{b(rng.from_time)}..{b(rng.to_time)}"


@dataclass(frozen=True)
class RestoreRequest:
    """One restore: what to read, where to write it, how fast."""

    source_region: str
    topic: str
    to_topic: str
    checkpoint_topic: str
    range: RestoreRange = field(default_factory=RestoreRange)
    partitions: tuple[int, ...] | None = None
    allow_gaps: bool = False
    rate: int | None = None
    """Bytes per second of keys, values and headers produced (``None``: unlimited)."""
    batch_records: int = 2000
    """Records per transaction."""
    force: bool = False
    """Restore even where records already restored into the target by another range may be
    restored again (duplicates accepted)."""
    accept_target_config: bool = False
    """Go on when an existing target's configs would replace the restored timestamps
    (LogAppendTime) or delete restored records (retention): ``restore_target``."""
    incarnation: str = ""
    """The source topic's incarnation read (its label; ``""``: the first one)."""
    incarnation_named: bool = True
    """Whether the operator named ``incarnation`` (``--incarnation``); ``False``: it is the
    live one by default, and a restore of the same request started on another incarnation
    (the topic was recreated since) is refused rather than switched
    (``incarnation_refusals``)."""
    topic_ids: tuple[tuple[str, str], ...] = ()
    """``(label, topic id)`` of each incarnation ``_topic.json`` lists: how refusals name
    them."""
    snapshot: int | None = None
    """The snapshot of the topic's Iceberg table whose data files are read (``None``: the
    bucket's listing); part of the checkpoint key."""

    def checkpoint_prefix(self, partition: int) -> str:
        """``restore:{source_region}:{topic}:{partition}:{to_topic}:``, the start of the
        key of every restore of this source partition into this target (topic names and
        regions hold no ``:``).
        """
        return f"restore:{self.source_region}:{self.topic}:{partition}:{self.to_topic}:"

    def checkpoint_key(self, partition: int) -> str:
        """The partition's checkpoint key: the whole request (source, target, partition,
        offset and time bounds, the table snapshot read), so another range is another
        restore and the same command resumes its own:
        ``restore:{region}:{topic}:{partition}:{to_topic}:{range_id}[#{snapshot}][@{incarnation}]``.
        """
        return self.checkpoint_prefix(partition) + range_id(self.range) + (
            f"#{self.snapshot}" if self.snapshot is not None else "") + (
            f"@{self.incarnation}" if self.incarnation else "")

    def transactional_id(self, partition: int) -> str:
        """The producer's id while it writes ``partition`` of the target: one writer per
        target partition. Restores of disjoint partitions run side by side; a second run
        writing the same target partition (the same restore again, or another one) fences
        the first before it reads the checkpoints.
        """
        return f"replicator-restore:{self.to_topic}:{partition}"


@dataclass(frozen=True)
class RestoreMark:
    """A restore checkpoint: what one request restored of one partition.

    The value is a ``Checkpoint`` (``offset``: the last source position covered;
    ``origin``: the first position of the partition's range) plus a ``restore`` object
    with the request's bounds and ``times``, the smallest and largest timestamp of the
    records restored so far (``null`` while none): what ``overlaps`` compares.
    """

    range: RestoreRange
    origin: int
    offset: int
    segment: str
    times: tuple[int, int] | None
    updated_at: datetime

    def encode(self) -> bytes:
        """The JSON value written to the checkpoint topic."""
        doc: dict[str, Any] = json.loads(Checkpoint(self.offset, self.segment, self.updated_at,
                                                    origin=self.origin).encode())
        r = self.range
        doc["restore"] = {"from_offset": r.from_offset, "to_offset": r.to_offset,
                          "from_time": r.from_time, "to_time": r.to_time,
                          "times": None if self.times is None else list(self.times)}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> RestoreMark:
        """Parse a restore checkpoint.

        Raises:
            ValueError: naming what is wrong.
        """
        cp = Checkpoint.decode(value)
        assert value is not None  # Checkpoint.decode refuses a tombstone
        doc = json.loads(value).get("restore")
        if not isinstance(doc, dict) or cp.origin is None:
            raise ValueError("not a restore checkpoint (no restore object or origin)")

        def bound(name: str) -> int | None:
            x = doc.get(name)
            if x is None or (isinstance(x, int) and not isinstance(x, bool)):
                return x
            raise ValueError(f"restore checkpoint {name} must be an int or null, got {x!r}")

        times = doc.get("times")
        if times is not None and not (isinstance(times, list) and len(times) == 2
                                      and all(isinstance(t, int) for t in times)):
            raise ValueError(f"restore checkpoint times must be [min, max], got {times!r}")
        rng = RestoreRange(bound("from_offset"), bound("to_offset"), bound("from_time"),
                           bound("to_time"))
        return cls(rng, cp.origin, cp.offset, cp.segment,
                   None if times is None else (times[0], times[1]), cp.updated_at)

    @property
    def restored(self) -> bool:
        """True when at least one record was restored under it."""
        return self.times is not None and self.offset >= self.origin


def overlaps(mark: RestoreMark, rng: RestoreRange, first: int, last: int) -> bool:
    """Whether a record restored under ``mark`` may be one of a request for positions
    ``first..last`` within ``rng``'s time bounds.

    The records restored lie at positions ``mark.origin..mark.offset`` with times within
    ``mark.times``; a record common to both needs both the positions and the times to meet.
    ``False`` is exact (no record can be in both); ``True`` may be cautious (record times
    are known only as a span).
    """
    if not mark.restored or mark.times is None:
        return False
    if mark.offset < first or mark.origin > last:
        return False
    lo, hi = mark.times
    return (rng.from_time is None or hi >= rng.from_time) and \
        (rng.to_time is None or lo <= rng.to_time)


def overlap_refusals(request: RestoreRequest, plan_: Plan,
                     marks: Mapping[int, Mapping[str, RestoreMark]]) -> list[str]:
    """Why ``request`` would restore again records that other restores of the same source
    partition already wrote into its target (``marks``: partition → key → mark); empty with
    ``request.force`` or when no other range overlaps. Its own key is a resume, never a
    conflict.
    """
    if request.force:
        return []
    out = []
    for pp in plan_.partitions:
        if pp.first is None or pp.last is None:
            continue
        own = request.checkpoint_key(pp.partition)
        for key, mark in sorted(marks.get(pp.partition, {}).items()):
            if key != own and key_incarnation(key) == request.incarnation and \
                    overlaps(mark, request.range, pp.first, pp.last):
                assert mark.times is not None
                out.append(
                    f"{request.source_region}/{request.topic}[{pp.partition}]: another "
                    f"restore into {request.to_topic} ({key}) already restored positions "
                    f"{mark.origin}-{mark.offset} with record times {mark.times[0]}-"
                    f"{mark.times[1]}, which may hold records of this range "
                    f"(positions {pp.first}-{pp.last}{_time_text(request.range)}): restore "
                    "into another topic, narrow the range, or pass --force to restore them "
                    "again (duplicates)")
    return out


def incarnation_refusals(request: RestoreRequest, plan_: Plan,
                         marks: Mapping[int, Mapping[str, RestoreMark]]) -> list[str]:
    """Why running ``request`` again would switch incarnation under a started restore:
    the same request (same source, target, partition, range and snapshot) has a checkpoint
    of another incarnation of the source topic and none of its own, and the incarnation
    was not named (``--incarnation``) but taken as the live one by default. The topic was
    deleted and created again since the restore started; resuming would restore the new
    topic's records after the earlier one's. Empty when the operator named it (even with
    ``request.force``: that accepts duplicates, not another topic's records).
    """
    if request.incarnation_named:
        return []
    out = []
    for pp in plan_.partitions:
        own = request.checkpoint_key(pp.partition)
        found = marks.get(pp.partition, {})
        if own in found:
            continue
        base = _without_incarnation(own)
        for key, mark in sorted(found.items()):
            other = key_incarnation(key)
            if other != request.incarnation and _without_incarnation(key) == base:
                ids = dict(request.topic_ids)
                was, now = (ids.get(label, label or "the first one")
                            for label in (other, request.incarnation))
                out.append(
                    f"{request.source_region}/{request.topic}[{pp.partition}]: this restore "
                    f"into {request.to_topic} was started on incarnation {was} (checkpoint "
                    f"{key}, restored up to position {mark.offset}) and the live incarnation "
                    f"is now {now} (the topic was deleted and created again): pass "
                    f"--incarnation {was} to resume it, or --incarnation {now} to restore "
                    "the new topic's records as another restore")
                break
    return out


def _without_incarnation(key: str) -> str:
    """A restore checkpoint key without its ``@{incarnation}`` suffix."""
    head, _, last = key.rpartition(":")
    return f"{head}:{last.split('@', 1)[0]}"


def key_incarnation(key: str) -> str:
    """The source incarnation a restore checkpoint key names (``""``: the first one): the
    same positions of two incarnations are different records, never an overlap.
    """
    last = key.rsplit(":", 1)[-1]
    return last.split("@", 1)[1] if "@" in last else ""


def partition_of(prefixes: Mapping[bytes, int], key: bytes | None) -> int | None:
    """The partition whose checkpoint prefix ``key`` starts with, if any."""
    if key is None or not key.startswith(b"restore:"):
        return None
    return next((part for prefix, part in prefixes.items() if key.startswith(prefix)), None)


def _time_text(rng: RestoreRange) -> str:
    if not rng.timed:
        return ""
    return f", times {'' if rng.from_time is None else rng.from_time}-" \
           f"{'' if rng.to_time is None else rng.to_time}"
