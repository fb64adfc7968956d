"""Sources named by pattern (``[[ingress.sources]] topic_pattern``): which topics of a source
region exist in the bucket, and which of them each entry replicates (pure).

Ingress discovers them (``ingress/discovery.py``); the operator tools list them the same
way. The rule (docs/configuration.md, ``destination_topic``): an entry with ``topic`` wins
over patterns; among patterns the first entry of the region that matches; a discovered topic
whose destination another topic *of the same region* already feeds is refused (aggregation
is several regions into one topic, never two topics of one region).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from replicator.core.keys import region_prefix
from replicator.core.settings import IngressSourceSettings
from replicator.core.storage import ObjectStore


def region_topics(store: ObjectStore, prefix: str, region: str) -> list[str]:
    """The topics of ``region`` in the bucket: the folders under ``{prefix}/{region}/`` (one
    LIST with a delimiter, whatever the number of segments).
    """
    return [t for t in store.list_folders(region_prefix(prefix, region))
            if not t.startswith("_")]


@dataclass(frozen=True)
class Refused:
    """A topic a pattern matched that cannot be replicated, and why."""

    region: str
    topic: str
    destination: str | None
    reason: str


@dataclass(frozen=True)
class Discovered:
    """What ``discover`` decided: new sources, and topics refused."""

    sources: list[IngressSourceSettings] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


def discover(patterns: Sequence[IngressSourceSettings],
             topics: Mapping[str, Iterable[str]],
             known: Iterable[IngressSourceSettings]) -> Discovered:
    """The sources ``patterns`` add for ``topics`` (region → topic names in the bucket).

    Args:
        patterns: the entries with ``topic_pattern``, in configuration order.
        topics: the topics found per region.
        known: the sources already replicated (named ones and those found before).
    """
    taken: dict[tuple[str, str], str] = {}
    have: set[tuple[str, str]] = set()
    for src in known:
        have.add((src.region, src.name))
        taken[(src.region, src.destination)] = src.name
    out = Discovered()
    for region in sorted(topics):
        for topic in sorted(topics[region]):
            if (region, topic) in have:
                continue
            entry = next((p for p in patterns if p.region == region and p.matches(topic)),
                         None)
            if entry is None:
                continue
            try:
                dest = entry.destination_for(topic)
            except ValueError as e:
                out.refused.append(Refused(region, topic, None, str(e)))
                continue
            other = taken.get((region, dest))
            if other is not None:
                out.refused.append(Refused(
                    region, topic, dest, f"{region}/{other} is replicated into {dest} "
                    "already; two topics of one region cannot share a destination"))
                continue
            taken[(region, dest)] = topic
            have.add((region, topic))
            out.sources.append(entry.for_topic(topic))
    return out
