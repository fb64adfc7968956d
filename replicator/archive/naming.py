"""Which table holds a topic's segments: ``(region, topic, incarnation)`` to an identifier."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from replicator.core.errors import ObjectNotFound, ReplicatorError, RetriableError
from replicator.core.keys import BASE_INCARNATION, topic_meta_key
from replicator.core.settings import CatalogSettings
from replicator.core.storage import ObjectStore
from replicator.core.topic_copy import read_topic_meta
from replicator.core.wire import TopicMetadata

_NOT_NAME = re.compile(r"[^a-z0-9_]")


class TopicMetaUnreadable(RetriableError):
    """``_topic.json`` exists but is not a document this version reads."""


@dataclass(frozen=True, order=True)
class TableIdentity:
    """The source a table is about. ``incarnation`` tells a topic from a topic deleted and
    created again under the same name (the source topic id; ``None`` when not recorded).
    """

    region: str
    topic: str
    incarnation: str | None = None


def sanitize(part: str) -> str:
    """A name part that any catalog accepts: lowercase ``[a-z0-9_]``, not starting with a
    digit (Glue, Hive and SQL engines restrict names so).
    """
    name = _NOT_NAME.sub("_", part.lower()) or "_"
    return f"_{name}" if name[0].isdigit() else name


def table_identifier(cfg: CatalogSettings, ident: TableIdentity) -> tuple[str, ...]:
    """The table's identifier: ``cfg.namespace``'s levels, then the parts of
    ``cfg.table_name`` between its own dots, each rendered and sanitized (a dot in a topic
    name becomes ``_``, never a level).
    """
    values = {"region": ident.region, "topic": ident.topic,
              "incarnation": ident.incarnation or ""}
    parts = [sanitize(p.format(**values)) for p in cfg.table_name.split(".") if p]
    return (*cfg.namespace.split("."), *parts)


def _topic_json(store: ObjectStore, prefix: str, region: str, topic: str
                ) -> tuple[bytes, str | None, str] | None:
    """``_topic.json``'s bytes, the topic id it records (key ``topic_id``) and where it is;
    ``None`` when egress has not written it.

    Raises:
        StorageError / ReplicatorError: it could not be read (any error but not-found) or
            is not JSON: the caller's step fails and changes nothing, never guesses.
    """
    key = topic_meta_key(prefix, region, topic)
    try:
        data = store.get(key)
    except ObjectNotFound:
        return None
    where = f"s3://{store.bucket}/{key}"
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise TopicMetaUnreadable(f"{where} is not JSON: {e}") from e
    value = doc.get("topic_id") if isinstance(doc, dict) else None
    return data, str(value) if value else None, where


def read_incarnation(store: ObjectStore, prefix: str, region: str, topic: str) -> str | None:
    """The source topic id ``_topic.json`` records (key ``topic_id``), if any.

    Raises:
        StorageError / ReplicatorError: ``_topic.json`` could not be read (any error but
            not-found): the caller's step fails and changes nothing, never guesses.
    """
    found = _topic_json(store, prefix, region, topic)
    return None if found is None else found[1]


def live_identity(store: ObjectStore, prefix: str, region: str, topic: str
                  ) -> tuple[str | None, str]:
    """The live incarnation's topic id (``read_incarnation``) and location label
    (``live_location``) from one read of ``_topic.json``: a step takes its table and the
    segments it lists from the same document (two reads could straddle a recreate and list
    the new incarnation's segments in the earlier one's table).

    Raises:
        StorageError / ReplicatorError: ``_topic.json`` could not be read or parsed.
    """
    found = _topic_json(store, prefix, region, topic)
    if found is None:
        return None, BASE_INCARNATION
    data, topic_id, where = found
    live = TopicMetadata.parse(data, where=where).live
    return topic_id, BASE_INCARNATION if live is None else live.label


def live_location(store: ObjectStore, prefix: str, region: str, topic: str) -> str:
    """The label of the location of the topic's live incarnation: ``""`` (the documented
    key shape) unless ``_topic.json`` records a later incarnation (a topic deleted and
    created again, under ``_incarnations/{label}/``).

    Raises:
        StorageError / ReplicatorError: ``_topic.json`` exists but could not be read or
            parsed: answering the base location then would swap the table to another
            incarnation, so the step fails instead.
    """
    meta = read_topic_meta(store, prefix, region, topic)
    live = None if meta is None else meta.live
    return BASE_INCARNATION if live is None else live.label


class UnknownIncarnation(ReplicatorError):
    """Segments at a location ``_topic.json`` records no incarnation for."""


def incarnation_id(store: ObjectStore, prefix: str, region: str, topic: str,
                   label: str) -> str | None:
    """The source topic id of the incarnation whose segments live at ``label`` (``""``:
    the documented key shape), from ``_topic.json``'s chain; ``None`` when not recorded.

    Raises:
        UnknownIncarnation: the chain lists no incarnation at ``label``.
        StorageError / ReplicatorError: ``_topic.json`` could not be read or parsed.
    """
    meta = read_topic_meta(store, prefix, region, topic)
    if meta is not None and meta.incarnations:
        for inc in meta.incarnations:
            if inc.label == label:
                return inc.topic_id
    elif label == BASE_INCARNATION:
        # A topic never recreated (or recorded by an egress before incarnations).
        return read_incarnation(store, prefix, region, topic)
    raise UnknownIncarnation(f"{region}/{topic}: _topic.json records no incarnation at "
                             f"location {label!r}")
