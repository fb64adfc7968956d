"""Segment reports for operators: ``replicator segments ls``, ``segments inspect`` and
``segments cat``.

``ls`` groups the segments of a bucket per topic, partition and level and reports their
ranges, counts and bytes, with the **gaps** (positions no segment of any level covers)
and **overlaps** (segments of one level that share positions) that need attention.
"""

from __future__ import annotations

import base64
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from formats.records import Record, batch_to_records
from formats.segment_io import open_segment
from replicator.core.keys import SegmentKey
from replicator.core.storage import ObjectInfo, ObjectStore


@dataclass
class LevelSummary:
    """Segments of one level of one partition."""

    level: int
    count: int = 0
    bytes: int = 0
    first: int | None = None
    last: int | None = None

    def add(self, key: SegmentKey, size: int) -> None:
        self.count += 1
        self.bytes += size
        self.first = key.start if self.first is None else min(self.first, key.start)
        self.last = key.end if self.last is None else max(self.last, key.end)


@dataclass
class PartitionSummary:
    """All segments of one source partition."""

    region: str
    topic: str
    partition: int
    levels: dict[int, LevelSummary] = field(default_factory=dict)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    overlaps: list[tuple[str, str]] = field(default_factory=list)
    incarnation: str = ""
    """The topic incarnation (``""``: the first one; else its topic id, below
    ``_incarnations/``): each is summarized on its own, never merged."""

    @property
    def name(self) -> str:
        """``topic``, or ``topic@id`` for a later incarnation."""
        return self.topic + (f"@{self.incarnation}" if self.incarnation else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "region": self.region, "topic": self.topic, "partition": self.partition,
            "incarnation": self.incarnation,
            "levels": [vars(v) for _, v in sorted(self.levels.items())],
            "gaps": [{"start": a, "end": b} for a, b in self.gaps],
            "overlaps": [list(p) for p in self.overlaps],
        }


def coverage_gaps(keys: Iterable[SegmentKey]) -> list[tuple[int, int]]:
    """Inclusive position ranges between the first and last segment that no segment covers."""
    gaps = []
    covered_to: int | None = None
    for k in sorted(keys, key=lambda k: (k.start, -k.end)):
        if covered_to is not None and k.start > covered_to + 1:
            gaps.append((covered_to + 1, k.start - 1))
        covered_to = k.end if covered_to is None else max(covered_to, k.end)
    return gaps


def level_overlaps(keys: Iterable[SegmentKey]) -> list[tuple[str, str]]:
    """Pairs of same-level segments that share positions (after a crash, or a bug)."""
    out = []
    by_level: dict[int, list[SegmentKey]] = defaultdict(list)
    for k in keys:
        by_level[k.level].append(k)
    for level_keys in by_level.values():
        level_keys.sort(key=lambda k: (k.start, k.end))
        for a, b in itertools.pairwise(level_keys):
            if b.start <= a.end:
                out.append((a.to_key(), b.to_key()))
    return out


def summarize(objects: Iterable[ObjectInfo]) -> list[PartitionSummary]:
    """Group a listing into per-partition summaries (non-segment keys are ignored)."""
    parts: dict[tuple[str, str, str, int], list[tuple[SegmentKey, int]]] = defaultdict(list)
    for o in objects:
        k = SegmentKey.try_parse(o.key)
        if k is not None:
            parts[(k.region, k.topic, k.incarnation, k.partition)].append((k, o.size))
    out = []
    for (region, topic, incarnation, partition), items in sorted(parts.items()):
        s = PartitionSummary(region, topic, partition, incarnation=incarnation)
        for k, size in items:
            s.levels.setdefault(k.level, LevelSummary(k.level)).add(k, size)
        keys = [k for k, _ in items]
        s.gaps = coverage_gaps(keys)
        s.overlaps = level_overlaps(keys)
        out.append(s)
    return out


@dataclass
class Inspection:
    """What ``segments inspect`` shows."""

    key: str
    size: int
    format: str
    """The format the segment's own bytes name."""
    footer: dict[str, str]
    records: int
    first: Record | None
    last: Record | None


def inspect_segment(store: ObjectStore, key: SegmentKey, batch_size: int = 10_000
                    ) -> Inspection:
    """Read one segment fully (streaming) and report its format, footer, count, first and
    last record.

    Raises:
        SegmentNotFound: the key does not exist.
        SegmentCorrupt: the bytes or the footer are wrong for the key.
    """
    size = store.head(key.to_key()).size
    count = 0
    first = last = None
    with open_segment(store, key) as reader:
        fmt = "" if reader.format is None else reader.format.name
        footer = reader.metadata.to_footer()
        for batch in reader.iter_batches(batch_size):
            if batch.num_rows == 0:
                continue
            if first is None:
                first = next(batch_to_records(batch.slice(0, 1)))
            last = next(batch_to_records(batch.slice(batch.num_rows - 1, 1)))
            count += batch.num_rows
    return Inspection(key.to_key(), size, fmt, footer, count, first, last)


def bytes_json(b: bytes | None) -> str | dict[str, str] | None:
    """A key, value or header value for ``segments cat``: UTF-8 text when it decodes,
    else ``{"base64": "..."}``; null stays null (a tombstone's value).
    """
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode("ascii")}


def record_json(r: Record) -> dict[str, Any]:
    """One record as ``segments cat`` prints it."""
    return {"offset": r.offset, "timestamp": r.timestamp_ms, "timestamp_type": r.timestamp_type,
            "key": bytes_json(r.key), "value": bytes_json(r.value),
            "headers": [[name, bytes_json(v)] for name, v in r.headers]}


def cat_segment(store: ObjectStore, key: SegmentKey, *, first: int = 0,
                last: int | None = None, batch_size: int = 10_000) -> Iterator[Record]:
    """The records of one segment at offsets ``first..last``, streamed.

    Raises:
        SegmentNotFound / SegmentCorrupt: naming the key.
    """
    with open_segment(store, key) as reader:
        for batch in reader.iter_batches(batch_size):
            for r in batch_to_records(batch):
                if r.offset < first:
                    continue
                if last is not None and r.offset > last:
                    return
                yield r
