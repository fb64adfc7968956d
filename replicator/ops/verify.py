"""Compare a source topic with its copy: ``replicator verify``.

Partition p of the source is compared with partition p of the destination, record by
record (key, value, headers, timestamp), streaming both sides. Besides the first
difference, the report counts records **lost** (in the source, not in the copy),
**duplicated** (in the copy more often than in the source) and **reordered** (in the copy,
but out of source order), so a fault test can state its result in those three numbers.
Memory: one 16-byte digest per record.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from replicator.core.errors import TopicError
from replicator.core.kafka import Admin, Message, read_to_end
from replicator.core.settings import KafkaSettings

RecordView = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def record_view(msg: Message) -> RecordView:
    """What must be equal between a source record and its copy."""
    return (msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1])


def digest(view: RecordView) -> bytes:
    """A 16-byte identity of a record (null and empty stay distinct)."""
    h = hashlib.blake2b(digest_size=16)
    key, value, headers, ts = view
    for part in (key, value):
        h.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "big") + part)
    h.update(len(headers).to_bytes(4, "big"))
    for hk, hv in headers:
        hkb = hk.encode()
        h.update(len(hkb).to_bytes(4, "big") + hkb)
        h.update(b"\x00" if hv is None else b"\x01" + len(hv).to_bytes(8, "big") + hv)
    h.update(ts.to_bytes(8, "big", signed=True))
    return h.digest()


def read_partition(kafka: KafkaSettings, topic: str, partition: int, *,
                   idle_timeout: float = 30.0) -> Iterator[Message]:
    """All records of one partition, from the beginning to the end seen at EOF.

    Raises:
        KafkaRetriableError: nothing (not even EOF) arrived within ``idle_timeout``.
    """
    # A short consume timeout: a consume call waits for the full batch or the timeout, and
    # the end-of-partition event alone does not end that wait.
    return read_to_end(kafka, topic, partitions=[partition], idle_timeout=idle_timeout,
                       poll_timeout=0.2, overrides={"auto.offset.reset": "earliest"})


def count_reordered(positions: list[int]) -> int:
    """Records out of order: total minus the longest increasing subsequence."""
    tails: list[int] = []
    for p in positions:
        i = bisect.bisect_left(tails, p)
        if i == len(tails):
            tails.append(p)
        else:
            tails[i] = p
    return len(positions) - len(tails)


@dataclass
class PartitionVerdict:
    """The comparison of one partition."""

    partition: int
    source_records: int = 0
    destination_records: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    first_difference: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.reordered == 0
                and self.first_difference is None
                and self.source_records == self.destination_records)


@dataclass
class VerifyReport:
    """The comparison of two topics."""

    source: str
    destination: str
    partitions: list[PartitionVerdict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.ok for p in self.partitions)

    def totals(self) -> dict[str, int]:
        keys = ("source_records", "destination_records", "lost", "duplicated", "reordered")
        return {k: sum(getattr(p, k) for p in self.partitions) for k in keys}

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "destination": self.destination, "ok": self.ok,
                "totals": self.totals(), "problems": self.problems,
                "partitions": [{**vars(p), "ok": p.ok} for p in self.partitions]}


def compare_streams(partition: int, source: Iterator[Message], destination: Iterator[Message]
                    ) -> PartitionVerdict:
    """Compare two record streams of one partition.

    While both streams agree nothing is remembered; from the first difference on, the rest
    of each side is kept as 16-byte digests and classified into lost, duplicated and
    reordered records. Memory is therefore flat for a correct copy.
    """
    v = PartitionVerdict(partition)
    src_rest: list[bytes] = []
    dst_rest: list[bytes] = []
    for s, d in itertools.zip_longest(source, destination):
        sv = None if s is None else record_view(s)
        dv = None if d is None else record_view(d)
        v.source_records += sv is not None
        v.destination_records += dv is not None
        if v.first_difference is None:
            if sv == dv:
                continue
            v.first_difference = {
                "index": max(v.source_records, v.destination_records) - 1,
                "source_offset": None if s is None else s.offset(),
                "destination_offset": None if d is None else d.offset(),
                "source": _describe(sv), "destination": _describe(dv)}
        if sv is not None:
            src_rest.append(digest(sv))
        if dv is not None:
            dst_rest.append(digest(dv))
    if v.first_difference is not None:
        v.lost, v.duplicated, v.reordered = classify(src_rest, dst_rest)
    return v


def classify(source: list[bytes], destination: list[bytes]) -> tuple[int, int, int]:
    """(lost, duplicated, reordered) of a copy, given record digests of both sides."""
    src_index: dict[bytes, list[int]] = {}
    for i, dg in enumerate(source):
        src_index.setdefault(dg, []).append(i)
    seen: Counter[bytes] = Counter(destination)
    used: Counter[bytes] = Counter()
    positions = []
    for dg in destination:
        idx = src_index.get(dg)
        if idx is None:
            continue
        n = used[dg]
        used[dg] += 1
        if n < len(idx):
            positions.append(idx[n])
    lost = duplicated = 0
    for dg, idx in src_index.items():
        have = seen.get(dg, 0)
        lost += max(0, len(idx) - have)
        duplicated += max(0, have - len(idx))
    duplicated += sum(c for dg, c in seen.items() if dg not in src_index)
    return lost, duplicated, count_reordered(positions)


def _describe(view: RecordView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    key, value, headers, ts = view
    return {"key": _short(key), "value": _short(value), "timestamp": ts,
            "headers": [(k, _short(v)) for k, v in headers]}


def _short(b: bytes | None, n: int = 40) -> str | None:
    if b is None:
        return None
    r = repr(b[:n])
    return r + ("…" if len(b) > n else "")


def compare_fan_in(partition: int, source: Iterator[Message],
                   destination: Iterator[Message]) -> PartitionVerdict:
    """Compare a source partition with a destination partition that other sources feed too
    (fan-in): only destination records equal to some record of the source count, and they
    must be the source's records, each once, in the source's order.

    Memory: a 16-byte digest and an offset per source record. Records equal in key, value,
    headers and timestamp in two sources cannot be told apart (they count as duplicates).
    """
    src = [(digest(record_view(m)), m.offset()) for m in source]
    known = {dg for dg, _ in src}
    dst = [(dg, m.offset()) for m in destination if (dg := digest(record_view(m))) in known]
    v = PartitionVerdict(partition, source_records=len(src), destination_records=len(dst))
    for i, (a, b) in enumerate(itertools.zip_longest(src, dst)):
        if a is None or b is None or a[0] != b[0]:
            v.first_difference = {"index": i,
                                  "source_offset": None if a is None else a[1],
                                  "destination_offset": None if b is None else b[1]}
            v.lost, v.duplicated, v.reordered = classify([dg for dg, _ in src],
                                                         [dg for dg, _ in dst])
            break
    return v


def verify_topics(source_kafka: KafkaSettings, source_topic: str,
                  destination_kafka: KafkaSettings, destination_topic: str, *,
                  idle_timeout: float = 30.0, fan_in: bool = False) -> VerifyReport:
    """Compare every partition of two topics.

    With ``fan_in`` the destination may hold records of other sources too (several regions
    replicated into one topic): see ``compare_fan_in``.

    Raises:
        TopicError: the source topic does not exist.
    """
    report = VerifyReport(source_topic, destination_topic)
    n_src = Admin(source_kafka).partition_count(source_topic)
    n_dst = Admin(destination_kafka).partition_count(destination_topic)
    if n_src is None:
        raise TopicError(f"source topic {source_topic} does not exist")
    if n_dst is None:
        report.problems.append(f"destination topic {destination_topic} does not exist")
        n_dst = 0
    elif n_dst != n_src and not (fan_in and n_dst > n_src):
        report.problems.append(f"partition counts differ: source {n_src}, "
                               f"destination {n_dst}")
    for p in range(n_src):
        src = read_partition(source_kafka, source_topic, p, idle_timeout=idle_timeout)
        dst: Iterator[Message] = iter(()) if p >= n_dst else read_partition(
            destination_kafka, destination_topic, p, idle_timeout=idle_timeout)
        compare = compare_fan_in if fan_in else compare_streams
        report.partitions.append(compare(p, src, dst))
    return report
