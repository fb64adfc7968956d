"""Sources named by pattern (``[[ingress.sources]] topic_pattern``): which topics of a source
region exist in the bucket, and which of them each entry replicates (pure).

Ingress discovers them (``ingress/discovery.py``); the operator tools list them the same
way. The rule (docs/configuration.md, ``destination_topic``): an entry with ``topic`` wins
over patterns; among patterns the first entry of the region that matches; a discovered topic
whose destination another topic *of the same region* already feeds is refused (aggregation
is several regions into one topic, never two topics of one region).

Which names a pattern may select at all is one rule for egress (``[egress.select]``,
``egress/selection.py``) and ingress (``topic_pattern``): ``is_internal`` (README,
"Egress"). A topic egress archives because a pattern selected it is a topic an ingress
pattern can find; an internal topic is replicated only where both sides name it.
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
             known: Iterable[IngressSourceSettings], own: Iterable[str] = ()) -> Discovered:
    """The sources ``patterns`` add for ``topics`` (region → topic names in the bucket).

    Args:
        patterns: the entries with ``topic_pattern``, in configuration order.
        topics: the topics found per region.
        known: the sources already replicated (named ones and those found before).
        own: the replicator's topics beyond ``REPLICATOR_TOPICS`` (``replicator_topics``).
    """
    own = frozenset(own)
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
            entry = next((p for p in patterns if pattern_selects(p, region, topic, own)),
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
