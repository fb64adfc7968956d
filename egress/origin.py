"""Records egress leaves out because they came from a region listed in
``[egress] skip_origins`` (docs/architecture.md, "Origin marker").

Ingress with ``mark_origin`` appends a header ``origin_header`` = the source region to every
record it replays. In active-active replication the egress of the destination region then
skips those records, so a record is copied into the other region once and never back.

A skipped record is a hole in position space, like a transaction marker: segments still
touch (the next segment starts after the previous one's last copied record), so neither
ingress nor compaction sees a gap. Only built when ``skip_origins`` is set: with it empty the
poll loop never looks at a header.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

from egress.metrics import EgressMetrics
from replicator.core.kafka import Headers, Message
from replicator.core.settings import EgressSettings


def skipped_origin(headers: Headers, name: str, skip: Collection[bytes]) -> bytes | None:
    """The value of the first ``name`` header of ``headers`` that is in ``skip`` (the
    record is then skipped), else ``None`` (the record is copied).
    """
    for k, v in headers:
        if k == name and v in skip:
            return v
    return None


class OriginFilter:
    """Drops the messages of a run whose origin header names a region in ``skip``.

    Args:
        name: the origin header's name (``[egress] origin_header``).
        skip: the regions to leave out (``[egress] skip_origins``).
        metrics: ``egress_origin_skipped_total`` counts them by topic and origin.
        region: this process's region (metric label).
    """

    def __init__(self, name: str, skip: Collection[str], metrics: EgressMetrics,
                 region: str) -> None:
        self.name = name
        self.skip = frozenset(r.encode("utf-8") for r in skip)
        self.metric = metrics.origin_skipped
        self.region = region

    def keep(self, topic: str, msgs: Sequence[Message]) -> Sequence[Message]:
        """The messages of ``msgs`` to copy, in order (``msgs`` itself when all are)."""
        hdrs = [m.headers() for m in msgs]
        if not any(hdrs):
            return msgs
        kept: list[Message] = []
        skipped: Counter[bytes] = Counter()
        for m, h in zip(msgs, hdrs, strict=True):
            origin = skipped_origin(h, self.name, self.skip) if h else None
            if origin is None:
                kept.append(m)
            else:
                skipped[origin] += 1
        if not skipped:
            return msgs
        for origin, n in skipped.items():
            self.metric.labels(self.region, topic, origin.decode("utf-8", "replace")).inc(n)
        return kept


def origin_filter(cfg: EgressSettings, metrics: EgressMetrics,
                  region: str) -> OriginFilter | None:
    """The filter of ``cfg.skip_origins``, or ``None`` when it is empty (zero cost)."""
    if not cfg.skip_origins:
        return None
    return OriginFilter(cfg.origin_header, cfg.skip_origins, metrics, region)
