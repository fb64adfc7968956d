"""``replicator cutover from-mm2``: ingress takes over topics MirrorMaker 2 filled.

Per configured source partition (docs/migrating-from-mirrormaker.md):

1. the source records egress archived (one cover of the partition's segments, level 0
   first), as ``(offset, digest)``;
2. the destination partition's records from ``lookback`` before the oldest archived record
   to its end (read_committed), as ``(destination offset, digest)``;
3. ``replicator.ops.mm2_align.align`` places every destination record of that window at its
   source offset; the last one's is the checkpoint: ingress resumes right after it;
4. the checkpoint and offset-map entries of the aligned records are written (the map lets
   ``replicator groups`` translate groups committed in the MM2 part of the topic).

An empty destination partition gets no checkpoint: ingress starts there by its ``start``
option (egress's first position by default). A partition that already has a checkpoint is
refused unless ``force``: ingress already replays it, and a new checkpoint would move it.
"""

from __future__ import annotations

import bisect
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from formats.records import batch_to_records
from formats.segment_io import open_segment
from replicator.core.clock import utc_now
from replicator.core.compacted_topic import ensure_compacted_topic
from replicator.core.errors import FatalError, KafkaRetriableError
from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition
from replicator.core.keys import SegmentKey, topic_prefix
from replicator.core.offset_map import OffsetMapEntry, map_key
from replicator.core.settings import IngressSettings, KafkaSettings
from replicator.core.storage import ObjectStore
from replicator.core.wire import Checkpoint, checkpoint_key
from replicator.ops.checkpoints import configured_sources
from replicator.ops.mm2_align import Row, align, map_entries
from replicator.ops.verify import digest, record_view

log = logging.getLogger(__name__)


class CutoverError(FatalError):
    """The cutover cannot be planned or written (the message says why)."""


@dataclass(frozen=True)
class ArchivedPartition:
    """One cover of a source partition's segments: records in offset order."""

    rows: list[Row]
    segments: list[tuple[int, str]]
    """``(index of the segment's first row, segment key)``, ascending."""
    incarnation: str
    first_timestamp: int | None

    def segment_of(self, index: int) -> str:
        at = bisect.bisect_right([i for i, _ in self.segments], index) - 1
        return self.segments[at][1]


@dataclass(frozen=True)
class PartitionCutover:
    """What the cutover writes for one source partition."""

    region: str
    topic: str
    partition: int
    destination: str
    destination_end: int
    """The offset after the destination partition's last record: where ingress writes."""
    checkpoint: Checkpoint | None
    """``None``: the destination partition is empty; ingress starts by its start option."""
    entries: tuple[OffsetMapEntry, ...] = ()
    aligned: int = 0
    head: int = 0
    rewinds: int = 0
    skipped: tuple[tuple[int, int], ...] = field(default=())

    @property
    def resume_at(self) -> int | None:
        """The first source offset ingress replays (``None``: by its start option)."""
        return None if self.checkpoint is None else self.checkpoint.offset + 1

    def as_dict(self) -> dict[str, Any]:
        return {"region": self.region, "topic": self.topic, "partition": self.partition,
                "destination_topic": self.destination,
                "destination_end": self.destination_end, "resume_at": self.resume_at,
                "checkpoint": None if self.checkpoint is None else self.checkpoint.offset,
                "segment": None if self.checkpoint is None else self.checkpoint.segment,
                "offset_map_entries": len(self.entries), "aligned_records": self.aligned,
                "older_than_segments": self.head, "mm2_rewinds": self.rewinds,
                "mm2_skipped": [list(r) for r in self.skipped]}


def segment_keys(store: ObjectStore, prefix: str, region: str, topic: str
                 ) -> list[SegmentKey]:
    """Every segment of the topic, of every partition and incarnation."""
    return [k for k in (SegmentKey.try_parse(i.key)
                        for i in store.list(topic_prefix(prefix, region, topic)))
            if k is not None]


def archived_partition(store: ObjectStore, all_keys: Sequence[SegmentKey], region: str,
                       topic: str, partition: int) -> ArchivedPartition:
    """The partition's archived records, one cover of its segments (level 0 preferred: a
    compacted segment lacks records MM2 may have copied).

    Raises:
        CutoverError: segments of several incarnations (the topic was deleted and created
            again): which one MM2 copied is not known.
    """
    keys = [k for k in all_keys if k.partition == partition]
    incarnations = {k.incarnation for k in keys}
    if len(incarnations) > 1:
        raise CutoverError(f"{region}/{topic}[{partition}]: segments of {len(incarnations)} "
                           "incarnations of the topic (deleted and created again): a cutover "
                           "needs one")
    rows: list[Row] = []
    segments: list[tuple[int, str]] = []
    first_ts: int | None = None
    covered = -1
    for key in sorted(keys, key=lambda k: (k.start, k.level, -k.end)):
        if key.end <= covered:
            continue
        segments.append((len(rows), key.to_key()))
        with open_segment(store, key) as reader:
            for batch in reader.iter_batches(10_000):
                for r in batch_to_records(batch):
                    if r.offset <= covered:
                        continue
                    rows.append((r.offset, digest((r.key, r.value, tuple(r.headers),
                                                   r.timestamp_ms))))
                    first_ts = r.timestamp_ms if first_ts is None else min(first_ts,
                                                                           r.timestamp_ms)
        covered = key.end
    inc = next(iter(incarnations)) if incarnations else ""
    return ArchivedPartition(rows, segments, inc, first_ts)


def destination_rows(kafka: KafkaSettings, topic: str, partition: int, *,
                     since_ms: int | None, timeout: float) -> tuple[list[Row], int]:
    """``(rows, end)``: the partition's committed records from the first at or after
    ``since_ms`` (``None``: from the beginning; at least its last record) to its end.

    Raises:
        KafkaRetriableError: the end was not reached within ``timeout`` seconds.
    """
    c = Consumer(kafka, f"replicator.reader.cutover-{uuid.uuid4().hex[:12]}",
                 {"enable.partition.eof": True, "isolation.level": "read_committed",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        low, high = c.watermarks(TopicPartition(topic, partition), timeout=timeout)
        if high <= low:
            return [], high
        start = low
        if since_ms is not None:
            [at] = c.offsets_for_times([TopicPartition(topic, partition, max(0, since_ms))],
                                       timeout)
            start = high - 1 if at.offset < 0 else max(low, min(at.offset, high - 1))
        c.assign([TopicPartition(topic, partition, start)])
        rows: list[Row] = []
        deadline = time.monotonic() + timeout
        tp = TopicPartition(topic, partition)
        while True:
            fetched = c.fetch(1000, 0.2)
            for msgs in fetched.runs.values():
                rows += [(o, digest(record_view(m))) for m in msgs
                         if (o := m.offset() or 0) < high]
            # Up to the end seen first (a destination still written to has no end event,
            # and write_cutover refuses it); markers and aborted records move the position.
            if c.position([tp])[0].offset >= high or \
                    fetched.ends.get((topic, partition), -1) >= high:
                return rows, high
            for e in fetched.errors:
                log.warning("reading %s[%d]: %s", topic, partition, e)
            if time.monotonic() > deadline:
                raise KafkaRetriableError(f"{topic}[{partition}]: the end ({high}) was not "
                                          f"reached within {timeout:.0f} s")
    finally:
        c.close()


def plan_cutover(kafka: KafkaSettings, ingress: IngressSettings, prefix: str,
                 store: ObjectStore, *, lookback: timedelta | None, timeout: float = 60.0
                 ) -> list[PartitionCutover]:
    """One ``PartitionCutover`` per partition of every configured source's destination.

    Raises:
        CutoverError / AlignmentError: naming the partition and why.
    """
    admin = Admin(kafka)
    out = []
    for src in configured_sources(ingress, prefix, store):
        dest = src.destination
        count = admin.partition_count(dest)
        if count is None:
            raise CutoverError(f"destination topic {dest} of {src.region}/{src.name} does not "
                               "exist: give destination_topic the topic MirrorMaker 2 writes "
                               "(\"<source alias>.{topic}\" by its default policy)")
        topic_id = admin.topic_id(dest)
        keys = segment_keys(store, prefix, src.region, src.name)
        for p in range(count):
            where = f"{src.region}/{src.name}[{p}] -> {dest}[{p}]: "
            arch = archived_partition(store, keys, src.region, src.name, p)
            since = None
            if lookback is not None and arch.first_timestamp is not None:
                since = arch.first_timestamp - int(lookback.total_seconds() * 1000)
            drows, end = destination_rows(kafka, dest, p, since_ms=since, timeout=timeout)
            if not drows:
                out.append(PartitionCutover(src.region, src.name, p, dest, end, None))
                continue
            al = align(drows, arch.rows, where=where)
            last = al.pairs[-1][0]
            cp = Checkpoint(arch.rows[last][0], arch.segment_of(last), utc_now(),
                            incarnation=arch.incarnation)
            entries = map_entries(al, arch.rows, incarnation=topic_id,
                                  source_incarnation=arch.incarnation)
            out.append(PartitionCutover(src.region, src.name, p, dest, end, cp,
                                        tuple(entries), len(al.pairs), al.head, al.rewinds,
                                        tuple(al.skipped)))
    return out


def refused(plan: Sequence[PartitionCutover], existing: Mapping[str, Checkpoint]) -> list[str]:
    """The partitions that already have a checkpoint (ingress replays them already)."""
    return [f"{c.region}/{c.topic}[{c.partition}] -> {c.destination}: checkpoint "
            f"{existing[k].offset}"
            for c in plan
            if (k := checkpoint_key(c.region, c.topic, c.partition, c.destination)) in existing]


def destination_ends(kafka: KafkaSettings, plan: Sequence[PartitionCutover], timeout: float
                     ) -> list[int]:
    """The read_committed end of each planned destination partition now."""
    c = Consumer(kafka, f"replicator.reader.cutover-{uuid.uuid4().hex[:12]}",
                 {"isolation.level": "read_committed"})
    try:
        return [c.watermarks(TopicPartition(p.destination, p.partition), timeout=timeout)[1]
                for p in plan]
    finally:
        c.close()


def write_cutover(kafka: KafkaSettings, ingress: IngressSettings,
                  plan: Sequence[PartitionCutover], *, timeout: float = 60.0) -> int:
    """Write the checkpoints and offset-map entries of ``plan`` (creating the checkpoint
    and offset-map topics when missing); returns the records written.

    Raises:
        CutoverError: a destination partition grew since ``plan`` read it (MM2 or another
            producer still writes: the checkpoint would be behind its end, and ingress would
            repeat those records), or a record was not delivered (the message names it);
            nothing is half-applied for ingress as long as it is not started: run the
            command again.
    """
    moved = [f"{c.destination}[{c.partition}] {c.destination_end} -> {end}"
             for c, end in zip(plan, destination_ends(kafka, plan, timeout), strict=True)
             if end != c.destination_end]
    if moved:
        raise CutoverError("the destination grew since it was read (is MirrorMaker 2 still "
                           f"running, or another producer?): {', '.join(moved)}; stop it and "
                           "run the command again")
    admin = Admin(kafka)
    ensure_compacted_topic(admin, ingress.checkpoint_topic, "checkpoint topic")
    if ingress.offset_map:
        ensure_compacted_topic(admin, ingress.offset_map_topic, "offset-map topic")
    producer = Producer(kafka, name="cutover", overrides={"enable.idempotence": True})
    n = 0
    for c in plan:
        if ingress.offset_map:
            for e in c.entries:
                producer.produce(ingress.offset_map_topic, e.encode(),
                                 map_key(c.region, c.topic, c.partition, c.destination,
                                         e.src_first).encode())
                n += 1
        if c.checkpoint is not None:
            producer.produce(ingress.checkpoint_topic, c.checkpoint.encode(),
                             checkpoint_key(c.region, c.topic, c.partition,
                                            c.destination).encode())
            n += 1
    left = producer.flush(timeout)
    failures = producer.take_failures()
    if left or failures:
        raise CutoverError(f"{left} record(s) not delivered in {timeout:.0f} s, "
                           f"{len(failures)} refused ({failures[:1]}): run the command again")
    return n
