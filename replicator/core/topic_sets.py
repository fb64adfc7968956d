"""Sources named by pattern (``[[ingress.sources]] topic_pattern``): which topics of a source
region exist in the bucket, and which of them each entry replicates (pure).

Ingress discovers them (``ingress/discovery.py``); the operator tools list them the same
way. The rule (docs/configuration.md, ``destination_topic``; docs/topologies.md): an
entry with ``topic`` wins over patterns; among patterns the first entry of the region that
matches; topics *of one region* whose destination is the same are all refused (aggregation
is several regions into one topic, never two topics of one region). ``discover`` decides
from the set of names alone, so every ingress instance, and every restart, decides alike.

Which names a pattern may select at all is one rule for egress (``[egress.select]``,
``egress/selection.py``) and ingress (``topic_pattern``): ``is_internal``
(docs/topologies.md, "Egress topic sets"). A topic egress archives because a pattern
selected it is a topic an ingress pattern can find; an internal topic is replicated only
where both sides name it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from replicator.core.errors import KeyFormatError
from replicator.core.keys import check_topic, region_prefix
from replicator.core.settings import IngressSettings, IngressSourceSettings
from replicator.core.storage import ObjectStore

INTERNAL_PREFIX = "__"
"""Kafka's own topics (``__consumer_offsets``, ``__transaction_state``) and by convention
those of other tools (``__amazon_msk_canary``, Connect's ``__*``)."""
INTERNAL_NAMES = frozenset({"_schemas"})
"""Schema Registry's topic. Other names starting with a single ``_`` are ordinary topics:
Kafka allows them, and egress has always selected them by pattern."""
_OWN_FIELDS = ("checkpoint_topic", "segment_events_topic", "offset_map_topic")
REPLICATOR_TOPICS = frozenset(str(IngressSettings.model_fields[f].default)
                              for f in _OWN_FIELDS)
"""The replicator's own topics under their default names (checkpoint, segment events,
offset map): what a source region runs unless its file renames them."""


def replicator_topics(ingress: IngressSettings | None = None) -> frozenset[str]:
    """The replicator's own topics: the default names, and those ``ingress`` configures."""
    if ingress is None:
        return REPLICATOR_TOPICS
    return REPLICATOR_TOPICS | {str(getattr(ingress, f)) for f in _OWN_FIELDS}


def is_internal(topic: str, own: Iterable[str] = ()) -> bool:
    """Whether no pattern may select ``topic``, on either side: Kafka's or another tool's
    topic (``__*``, ``_schemas``), or the replicator's own (``REPLICATOR_TOPICS`` and
    ``own``). Such a topic is replicated only when named (``[egress.topics."NAME"]``,
    ``[[ingress.sources]] topic``).
    """
    return (topic.startswith(INTERNAL_PREFIX) or topic in INTERNAL_NAMES
            or topic in REPLICATOR_TOPICS or topic in own)


def pattern_selects(entry: IngressSourceSettings, region: str, topic: str,
                    own: Iterable[str] = ()) -> bool:
    """Whether the pattern entry ``entry`` selects ``region``/``topic`` (never an internal
    topic: ``is_internal``).
    """
    return entry.region == region and entry.matches(topic) and not is_internal(topic, own)


def region_topics(store: ObjectStore, prefix: str, region: str) -> list[str]:
    """The topics of ``region`` in the bucket: the folders under ``{prefix}/{region}/`` (one
    LIST with a delimiter, whatever the number of segments) whose names are topic names.
    Internal ones are listed too: ``discover`` leaves them to named sources.
    """
    return [t for t in store.list_folders(region_prefix(prefix, region)) if _topic_name(t)]


def _topic_name(name: str) -> bool:
    try:
        check_topic(name)
    except KeyFormatError:
        return False
    return True


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
             named: Iterable[IngressSourceSettings], own: Iterable[str] = ()) -> Discovered:
    """Every source ``patterns`` select in ``topics`` (region → topic names in the bucket),
    and every topic they refuse: a pure function of the configuration and the *set* of
    names, so every instance and every restart that lists the same bucket decides the same
    (the order topics were found in, or found before, plays no part).

    1. A topic that ``named`` names is left to that entry.
    2. Otherwise the first pattern entry of its region that selects it (``pattern_selects``)
       gives its destination; a destination that is no legal topic name is refused.
    3. The candidates of one (region, destination): if a named source of the region feeds
       that destination, every candidate is refused (the named entry wins); if there are
       two or more, **all** of them are refused. A single candidate is a source.

    Step 3 refuses all rather than picking one (say the first name) because a pure pick
    changes when a topic sorting earlier appears: a running instance would switch topics,
    or two instances listing a moment apart would each replicate a different topic, into
    the same destination partitions. Refusing all, the topic that appeared first is the only
    one that is ever replicated into the destination; it stops (ERROR, metric) when a second
    appears, until an operator names the one to keep or gives them distinct destinations.

    Args:
        patterns: the entries with ``topic_pattern``, in configuration order.
        topics: the topics found per region.
        named: the entries with ``topic``.
        own: the replicator's topics beyond ``REPLICATOR_TOPICS`` (``replicator_topics``).

    Returns:
        Sources sorted by (region, topic); refusals sorted by (region, topic).
    """
    own = frozenset(own)
    named_topics = {(s.region, s.name) for s in named}
    fed_by_named = {(s.region, s.destination): s.name for s in named}
    out = Discovered()
    candidates: dict[tuple[str, str], list[tuple[str, IngressSourceSettings]]] = {}
    for region in sorted(topics):
        for topic in sorted(set(topics[region])):
            if (region, topic) in named_topics:
                continue
            entry = next((p for p in patterns if pattern_selects(p, region, topic, own)),
                         None)
            if entry is None:
                continue
            try:
                dest = entry.destination_for(topic)
            except ValueError as e:
                out.refused.append(Refused(region, topic, None, str(e)))
                continue
            candidates.setdefault((region, dest), []).append((topic, entry))
    for (region, dest), found in sorted(candidates.items()):
        owner = fed_by_named.get((region, dest))
        if owner is not None:
            reason = (f"{region}/{owner} (an entry with topic) is replicated into {dest}; "
                      "two topics of one region cannot share a destination")
        elif len(found) > 1:
            reason = (f"{_some(region, [t for t, _ in found])} all match a "
                      f"topic_pattern into {dest}; two topics of one region cannot share a "
                      "destination, so none is replicated (name the one to keep with "
                      "topic, or give them distinct destination_topic templates)")
        else:
            topic, entry = found[0]
            out.sources.append(entry.for_topic(topic))
            continue
        out.refused.extend(Refused(region, t, dest, reason) for t, _ in found)
    out.refused.sort(key=lambda r: (r.region, r.topic))
    return out


SHOWN = 5
"""Topics a refusal names; the rest are counted (a pattern into one fixed destination can
match hundreds, and each of them logs the reason)."""


def _some(region: str, topics: Sequence[str]) -> str:
    shown = ", ".join(f"{region}/{t}" for t in topics[:SHOWN])
    more = len(topics) - SHOWN
    return shown if more <= 0 else f"{shown} and {more} more"
