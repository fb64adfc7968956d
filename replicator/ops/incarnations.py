"""Which incarnation of a source topic an operator tool reads.

A source topic deleted and created again is archived once per incarnation, each in a
location of its own (docs/architecture.md, "Topic incarnations"). ``restore``, ``segments
ls`` and ``segments cat`` read one at a time, never two merged: the live one (the newest
``_topic.json`` lists) unless ``--incarnation`` names another by its topic id.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicator.core.keys import BASE_INCARNATION
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import read_topic_meta


@dataclass(frozen=True)
class Chosen:
    """The incarnation read: its key location label and topic id (``None``: not known)."""

    label: str
    topic_id: str | None
    count: int
    """How many incarnations ``_topic.json`` lists (0: none recorded)."""
    named: bool = True
    """Whether ``--incarnation`` named it (``False``: the live one, by default)."""
    topic_ids: tuple[tuple[str, str], ...] = ()
    """``(label, topic id)`` of every incarnation listed, oldest first."""

    def describe(self) -> str:
        """How output names it: ``incarnation <id> (<n> of <count>)`` or ``""`` when the
        topic has one incarnation.
        """
        if self.count <= 1:
            return ""
        return f"incarnation {self.topic_id} ({'first' if not self.label else self.label})"


def choose(store: ObjectStore, prefix: str, region: str, topic: str,
           wanted: str | None) -> Chosen:
    """The incarnation to read: ``wanted`` (a topic id or label) or the live one.

    Raises:
        ValueError: ``wanted`` is not an incarnation ``_topic.json`` lists (naming those
            it does).
        ReplicatorError: ``_topic.json`` cannot be read.
    """
    meta = read_topic_meta(store, prefix, region, topic)
    incs = () if meta is None else meta.incarnations
    ids = tuple((i.label, i.topic_id) for i in incs)
    if wanted is None:
        live = incs[-1] if incs else None
        return Chosen(BASE_INCARNATION if live is None else live.label,
                      None if live is None else live.topic_id, len(incs), False, ids)
    for inc in incs:
        if wanted in (inc.topic_id, inc.label) and (wanted or not inc.label):
            return Chosen(inc.label, inc.topic_id, len(incs), True, ids)
    known = ", ".join(i.topic_id for i in incs) or "none recorded"
    raise ValueError(f"--incarnation {wanted!r}: {region}/{topic} has no such incarnation "
                     f"(its _topic.json lists: {known})")
