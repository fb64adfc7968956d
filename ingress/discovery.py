"""Topics of ``[[ingress.sources]]`` entries that give ``topic_pattern``: found in the bucket
while ingress runs, then replicated exactly like a named source (docs/topologies.md).

* Every ``topic_check_interval`` one LIST with a delimiter per source region
  (``{prefix}/{region}/``) names the region's topics (their ``_topic.json`` and segments);
  a segment event of a topic not known yet asks for a LIST at once, so a new topic starts
  without waiting for the interval.
* The decision is ``replicator.core.topic_sets.discover`` (pure, over the whole listing):
  a named entry wins, then the first matching pattern of the region; topics of one region
  with the same destination are all refused (ERROR when a topic becomes refused,
  ``replicator_ingress_sources_refused_total``). Every instance and every restart decides
  alike; a source found before and refused now is withdrawn (its workers stop).
* ``SourceFilter`` is what the SQS relay keeps: named sources plus whatever a pattern
  matches, so the events of a topic nobody has discovered yet are not dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ingress.metrics import IngressMetrics
from replicator.core.settings import IngressSettings, IngressSourceSettings
from replicator.core.storage import ObjectStore
from replicator.core.topic_sets import (
    discover,
    pattern_selects,
    region_topics,
    replicator_topics,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Changes:
    """What a ``TopicDiscovery.run`` changed: sources to start, (region, topic) to stop."""

    added: list[IngressSourceSettings] = field(default_factory=list)
    withdrawn: list[tuple[str, str]] = field(default_factory=list)


class SourceFilter:
    """``(region, topic) in filter``: a named source, or a topic a pattern selects
    (``replicator.core.topic_sets.pattern_selects``: never an internal topic).
    """

    def __init__(self, sources: Iterable[IngressSourceSettings],
                 own: Iterable[str] = ()) -> None:
        sources = list(sources)
        self.named = frozenset((s.region, s.name) for s in sources if s.topic is not None)
        self.patterns = [s for s in sources if s.topic_pattern is not None]
        self.own = frozenset(own)

    def __contains__(self, pair: object) -> bool:
        if pair in self.named:
            return True
        if not isinstance(pair, tuple) or len(pair) != 2:
            return False
        region, topic = pair
        return any(pattern_selects(p, region, topic, self.own) for p in self.patterns)


class TopicDiscovery:
    """Finds the topics the pattern entries of ``[ingress]`` select.

    Args:
        cfg: the ingress settings (its entries with ``topic_pattern``).
        prefix: ``s3.prefix``.
        metrics: the ingress metrics (refused topics).
        clock: monotonic seconds.
    """

    def __init__(self, cfg: IngressSettings, prefix: str, metrics: IngressMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.patterns = [s for s in cfg.sources if s.topic_pattern is not None]
        self.regions = sorted({s.region for s in self.patterns})
        self.prefix = prefix
        self.metrics = metrics
        self.interval = cfg.topic_check_interval.total_seconds()
        self.clock = clock
        self.own = replicator_topics(cfg)
        self.filter = SourceFilter(cfg.sources, self.own)
        self.named = [s for s in cfg.sources if s.topic is not None]
        self.active: dict[tuple[str, str], IngressSourceSettings] = {}
        """The sources the last run decided, by (region, topic)."""
        self._next = 0.0
        self._refused: set[tuple[str, str]] = set()

    @property
    def enabled(self) -> bool:
        """True when some entry gives ``topic_pattern``."""
        return bool(self.patterns)

    def wants(self, region: str, topic: str) -> bool:
        """True when a pattern entry of ``region`` selects ``topic`` and the last run did
        not refuse it (its segment events would ask for a LIST each).
        """
        return (region, topic) not in self._refused and any(
            pattern_selects(p, region, topic, self.own) for p in self.patterns)

    def poke(self) -> None:
        """List at the next ``run`` (a segment event of an unknown topic arrived)."""
        self._next = 0.0

    def run(self, store: ObjectStore) -> Changes:
        """What changed since the last run (at most one LIST per region per interval).

        The decision is ``discover`` over the whole listing, so it is the same on every
        instance and after a restart: a source found before is withdrawn when it is refused
        now (another topic of its region appeared with the same destination), and the
        caller stops its workers.

        Raises:
            ReplicatorError: listing the bucket failed (retried at the next check).
        """
        now = self.clock()
        if not self.patterns or now < self._next:
            return Changes()
        topics = {r: region_topics(store, self.prefix, r) for r in self.regions}
        self._next = now + self.interval
        found = discover(self.patterns, topics, self.named, self.own)
        decided = {(s.region, s.name): s for s in found.sources}
        changes = Changes(
            added=[s for k, s in decided.items() if k not in self.active],
            withdrawn=sorted(k for k in self.active if k not in decided))
        refused = {(r.region, r.topic): r for r in found.refused}
        for key, r in refused.items():
            if key in self._refused:
                continue
            if key in self.active:
                log.error("source %s/%s STOPPED: found by a topic_pattern and replicated "
                          "into %s until now, refused now: %s", r.region, r.topic,
                          self.active[key].destination, r.reason)
            else:
                log.error("source %s/%s matches a topic_pattern but is not replicated%s: %s",
                          r.region, r.topic, "" if r.destination is None
                          else f" into {r.destination}", r.reason)
            self.metrics.sources_refused.labels(region=r.region, topic=r.topic).inc()
        for key in changes.withdrawn:
            if key not in refused:   # its folder is gone from the bucket
                log.warning("source %s/%s: no longer in the bucket, not replicated any more",
                            *key)
        self._refused = set(refused)
        for s in changes.added:
            log.info("source %s/%s discovered (topic_pattern %r) -> %s", s.region, s.name,
                     next(p.topic_pattern for p in self.patterns
                          if p.region == s.region and p.matches(s.name)), s.destination)
        self.active = decided
        return changes
