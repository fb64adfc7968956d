"""Which source a table belongs to: its stamp (table properties) and the checks that keep
two sources out of one table (pure functions).

A table is stamped, when created, with the source it lists: bucket, key prefix, region,
topic and incarnation. A step refuses a table stamped for another source (another bucket
following the same catalog, two topics whose names render to one identifier) instead of
taking the other's files for deleted ones; ``collisions`` finds identifiers two sources
render to before anything is committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from replicator.core.errors import FatalError

REGION = "replicator.region"
TOPIC = "replicator.topic"
BUCKET = "replicator.bucket"
PREFIX = "replicator.prefix"
INCARNATION = "replicator.incarnation"


class ForeignTable(FatalError):
    """The table is stamped for another source (or not stamped by the replicator)."""


class ForeignWrites(FatalError):
    """Another engine committed to the table (the tables are read-only to others)."""


@dataclass(frozen=True, order=True)
class Source:
    """What a table lists: one topic of one region in one bucket (and key prefix)."""

    bucket: str
    prefix: str
    region: str
    topic: str
    incarnation: str | None = None

    def stamp(self) -> dict[str, str]:
        """The table properties naming this source."""
        props = {BUCKET: self.bucket, PREFIX: self.prefix, REGION: self.region,
                 TOPIC: self.topic}
        if self.incarnation:
            props[INCARNATION] = self.incarnation
        return props

    def __str__(self) -> str:
        inc = f" (incarnation {self.incarnation})" if self.incarnation else ""
        return f"s3://{self.bucket}/{self.prefix}/{self.region}/{self.topic}{inc}"


def stamped(props: Mapping[str, str]) -> str:
    """The source a table's properties name, for messages."""
    if REGION not in props or TOPIC not in props:
        return "no replicator source (a table the replicator did not create)"
    inc = props.get(INCARNATION)
    where = f"s3://{props[BUCKET]}/{props.get(PREFIX, '?')}" if BUCKET in props else "?"
    return f"{where}/{props[REGION]}/{props[TOPIC]}" + (f" (incarnation {inc})" if inc else "")


def check_owner(props: Mapping[str, str], source: Source, *,
                per_incarnation: bool) -> dict[str, str]:
    """The properties to set so the table names ``source`` (missing stamps of a table an
    earlier release created; the live incarnation of a table that follows it).

    Args:
        props: the table's properties.
        source: the source about to be listed in it.
        per_incarnation: the identifier names the incarnation (one table each): a table
            stamped with another incarnation is foreign.

    Raises:
        ForeignTable: the table is stamped for another source, or not stamped at all.
    """
    mine = source.stamp()
    if props.get(REGION) != source.region or props.get(TOPIC) != source.topic:
        raise ForeignTable(_foreign(props, source))
    for key in (BUCKET, PREFIX):
        if key in props and props[key] != mine[key]:
            raise ForeignTable(_foreign(props, source))
    if per_incarnation and props.get(INCARNATION) != source.incarnation \
            and INCARNATION in props:
        raise ForeignTable(_foreign(props, source))
    updates = {k: mine[k] for k in (BUCKET, PREFIX) if k not in props}
    if source.incarnation and props.get(INCARNATION) != source.incarnation:
        updates[INCARNATION] = source.incarnation
    return updates


def _foreign(props: Mapping[str, str], source: Source) -> str:
    return (f"the table holds {stamped(props)}, not {source}: two sources map to one table "
            "(catalog.table_name, catalog.namespace, or two buckets following one catalog); "
            "left as it is")


def collisions(identifiers: Iterable[tuple[Source, tuple[str, ...]]]
               ) -> list[tuple[Source, Source, tuple[str, ...]]]:
    """Pairs of sources (distinct topics or regions) rendered to one identifier."""
    seen: dict[tuple[str, ...], Source] = {}
    out = []
    for source, ident in sorted(identifiers):
        other = seen.setdefault(ident, source)
        if (other.region, other.topic) != (source.region, source.topic):
            out.append((other, source, ident))
    return out
