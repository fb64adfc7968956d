"""Which source topics egress replicates: explicit tables plus ``[egress.select]`` patterns.

A pure decision (docs/configuration.md, ``[egress.select]``): the controller lists the
cluster's topics every ``topic_metadata_interval`` and subscribes to what ``select``
returns. Patterns match whole names (``re.fullmatch``). Internal topics never match a
pattern (``replicator.core.topic_sets.is_internal``, the rule ingress's ``topic_pattern``
follows too); a topic named by an ``[egress.topics."NAME"]`` table is always selected,
whatever the patterns say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from replicator.core.topic_sets import is_internal


@dataclass(frozen=True)
class TopicSelection:
    """Compiled selection rules.

    Args:
        include: whole-name patterns of selected topics.
        exclude: whole-name patterns removed from what ``include`` selects.
        explicit: topics named by ``[egress.topics."NAME"]`` tables (always selected).
        internal: the replicator's own topics (checkpoint, segment events), never selected
            by a pattern.
    """

    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]
    explicit: frozenset[str]
    internal: frozenset[str]

    @classmethod
    def of(cls, include: Sequence[str], exclude: Sequence[str], explicit: Iterable[str],
           internal: Iterable[str] = ()) -> TopicSelection:
        """Compile the patterns (validated by the settings: ``re.error`` cannot happen)."""
        return cls(tuple(map(re.compile, include)), tuple(map(re.compile, exclude)),
                   frozenset(explicit), frozenset(internal))

    @property
    def dynamic(self) -> bool:
        """True when patterns select topics (the cluster's topic list must be watched)."""
        return bool(self.include)

    def is_internal(self, topic: str) -> bool:
        """Kafka's, another tool's or the replicator's own topic."""
        return is_internal(topic, self.internal)

    def matches(self, topic: str) -> bool:
        """Whether the patterns select ``topic`` (explicit tables aside)."""
        return (not self.is_internal(topic)
                and any(p.fullmatch(topic) for p in self.include)
                and not any(p.fullmatch(topic) for p in self.exclude))

    def select(self, topics: Iterable[str]) -> frozenset[str]:
        """The topics to replicate, out of the cluster's ``topics``: every explicit one
        (existing or not: egress waits for it, as it always did) and every existing one the
        patterns select.
        """
        return self.explicit | {t for t in topics if self.matches(t)}


def select(topics: Iterable[str], include: Sequence[str], exclude: Sequence[str],
           explicit: Iterable[str], internal: Iterable[str] = ()) -> frozenset[str]:
    """One-shot ``TopicSelection.of(...).select(topics)``."""
    return TopicSelection.of(include, exclude, explicit, internal).select(topics)
