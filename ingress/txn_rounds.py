"""How one exactly-once transaction's batches are produced: the produce calls of steps 2-3
of ``TransactionLoop._transact`` (``ingress.transactions``), round by round, each call
small enough for its destination topic's ``max.message.bytes`` (``ingress.limits``).
Pure planning: no client.
"""

from __future__ import annotations

from collections.abc import Callable

from ingress.limits import DestinationLimits
from ingress.offset_map import OffsetMapWriter
from ingress.ownership import TP
from ingress.rows import Rows
from ingress.txn_batches import Batch
from replicator.core.kafka import DeliveryReport

Chunk = tuple[Batch, int, Rows, "Callable[[int, DeliveryReport], None] | None"]
"""One produce call of a transaction: its batch, the index of its first record in the
batch, its records, and the offset map's listener of the batch."""


def produce_rounds(keep: list[Batch], limits: DestinationLimits | None,
                   offset_map: OffsetMapWriter | None) -> list[list[Chunk]]:
    """Steps 2-3's produce calls, round by round: every batch of a topic that needs no
    cutting in the first round; a cut topic's partition gets one chunk per round, its
    batches' chunks one after the other (fan-in: two sources' chunks never share a round,
    where librdkafka could batch them into one request over the limit, nor interleave,
    which would cost both batches their offset-map entries).
    """
    rounds: list[list[Chunk]] = [[]]
    lanes: dict[TP, int] = {}
    for b in keep:
        if b.rows is None:
            continue
        ends = None if offset_map is None else offset_map.on_ends(b)
        parts = chunks(b, limits)
        if len(parts) == 1 and (limits is None or limits.room(b.topic) is None):
            rounds[0].append((b, 0, parts[0][1], ends))
            continue
        n = lanes.get(b.tp, 0)
        for lo, rows in parts:
            while len(rounds) <= n:
                rounds.append([])
            rounds[n].append((b, lo, rows, ends))
            n += 1
        lanes[b.tp] = n
    return rounds


def chunks(b: Batch, limits: DestinationLimits | None) -> list[tuple[int, Rows]]:
    """``b``'s records as the chunks one produce request each may carry for its topic
    (``ingress.limits``), each with the index of its first record in the batch.
    """
    assert b.rows is not None
    if limits is None or limits.room(b.topic) is None:
        return [(0, b.rows)]
    out, lo = [], 0
    for part in limits.cut(b.topic, b.rows):
        out.append((lo, part))
        lo += len(part)
    return out
