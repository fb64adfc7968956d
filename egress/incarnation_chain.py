"""``{prefix}/{region}/{topic}/_incarnations.json``: the topic's incarnation chain, kept by
egress beside ``_topic.json`` so that no writer can lose it.

An egress of a release before incarnations (a downgrade, an old member during a rolling
update) rewrites ``_topic.json`` without ``incarnations``. Were the chain only there, the
next egress would take the live topic for the first incarnation, give it the documented key
shape and overwrite the first topic's segments. Such an egress never touches this object:
every writer of the current release merges it back into ``_topic.json`` before deciding
anything about an incarnation (``restored``), and writes it before ``_topic.json`` names a
new incarnation (``ChainStore.pin``).

The first entry is written once: created with ``If-None-Match``, and a merge always keeps the
object's own order first, so the id that owns the documented key shape never changes.
Every other write is conditional too (``If-Match``), read again when another member wrote.

When neither this object nor ``_topic.json`` lists an incarnation, ``base_owner`` looks at the
bucket before the documented shape is given to an id: a later incarnation's directory, or
the footer of a segment already at the documented shape naming another id, means the chain
was lost (``_topic.json`` rewritten by an older egress before this object existed).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

from formats.segment_io import open_segment
from replicator.core.errors import (
    ObjectNotFound,
    PreconditionFailed,
    ReplicatorError,
    StorageError,
    TopicError,
)
from replicator.core.keys import (
    BASE_INCARNATION,
    PartitionRef,
    SegmentKey,
    chain_key,
    incarnation_label,
    incarnations_prefix,
)
from replicator.core.retry import RetryPolicy, retry
from replicator.core.storage import ObjectStore
from replicator.core.wire import Incarnation

log = logging.getLogger(__name__)

MAX_CONFLICTS = 20


def merge(pinned: tuple[Incarnation, ...], other: tuple[Incarnation, ...]
          ) -> tuple[Incarnation, ...]:
    """The union of two chains (pure): ``pinned``'s order first (its first entry keeps the
    documented shape), then the entries only ``other`` lists, in its order. An entry both
    list keeps every partition either records (``pinned`` wins a disagreement: what was
    written first). A later entry of ``other`` whose label is the documented shape while
    ``pinned`` has a first entry takes its derived label (it cannot own the shape).
    """
    out = list(pinned)
    index = {inc.topic_id: n for n, inc in enumerate(out)}
    for entry in other:
        n = index.get(entry.topic_id)
        inc = entry
        if n is None:
            if inc.label == BASE_INCARNATION and out:
                inc = replace(inc, label=incarnation_label(inc.topic_id))
            index[inc.topic_id] = len(out)
            out.append(inc)
            continue
        mine = out[n]
        out[n] = replace(mine, previous_ends={**inc.previous_ends, **mine.previous_ends},
                         first_positions={**inc.first_positions, **mine.first_positions},
                         created_at=mine.created_at or inc.created_at)
    return tuple(out)


def encode(chain: tuple[Incarnation, ...]) -> bytes:
    """The object's body."""
    return json.dumps({"incarnations": [i.to_json() for i in chain]}, indent=2,
                      sort_keys=True).encode("utf-8")


def parse(data: bytes, where: str) -> tuple[Incarnation, ...]:
    """Parse the object's body.

    Raises:
        TopicError: not a chain.
    """
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise TopicError(f"{where}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("incarnations"), list):
        raise TopicError(f"{where}: needs a list 'incarnations'")
    return tuple(Incarnation.from_json(d, where) for d in doc["incarnations"])


@dataclass(frozen=True)
class BaseOwner:
    """What the bucket says about who owns the documented key shape (``base_owner``)."""

    topic_id: str | None
    """The id a segment footer at the documented shape names (``None``: no segment, or
    written without an id)."""
    later: bool
    """Whether a later incarnation's directory (``_incarnations/``) holds objects."""


class ChainStore:
    """Reads and writes the chain objects of one region's topics."""

    def __init__(self, store: ObjectStore, *, prefix: str, region: str,
                 retry_policy: RetryPolicy) -> None:
        self.store = store
        self.prefix = prefix
        self.region = region
        self.retry_policy = retry_policy

    def read(self, topic: str) -> tuple[tuple[Incarnation, ...], str | None]:
        """The chain and its ETag (``((), None)``: none written yet). An unreadable object
        is an error: it is never replaced blindly.

        Raises:
            ReplicatorError: S3 failed, or the object is unreadable.
        """
        key = chain_key(self.prefix, self.region, topic)
        try:
            data, etag = retry(lambda: self.store.get_with_etag(key), self.retry_policy,
                               what=f"get {key}")
        except ObjectNotFound:
            return (), None
        return parse(data, key), etag

    def pin(self, topic: str, chain: tuple[Incarnation, ...]) -> tuple[Incarnation, ...]:
        """Merge ``chain`` into the object (its entries first) and return what it holds.

        Raises:
            ReplicatorError: S3 failed, or other writers kept winning.
        """
        key = chain_key(self.prefix, self.region, topic)
        for _ in range(MAX_CONFLICTS):
            have, etag = self.read(topic)
            merged = merge(have, chain)
            if merged == have:
                return have
            try:
                self._put(key, encode(merged), etag)
            except (PreconditionFailed, ObjectNotFound):
                continue
            return merged
        raise StorageError(f"{key}: {MAX_CONFLICTS} conditional writes in a row lost to "
                           "other writers")

    def _put(self, key: str, body: bytes, etag: str | None) -> None:
        retry(lambda: self.store.put(key, body, if_match=etag, if_none_match=etag is None,
                                     content_type="application/json"),
              self.retry_policy, what=f"put {key}")

    def base_owner(self, topic: str) -> BaseOwner:
        """Who the bucket says owns the documented shape: one listing of ``_incarnations/``
        (a single key suffices) and the footer of partition 0's newest level-0 segment.

        Raises:
            ReplicatorError: S3 failed.
        """
        later_prefix = incarnations_prefix(self.prefix, self.region, topic)
        later = retry(lambda: next(iter(self.store.list(later_prefix)), None) is not None,
                      self.retry_policy, what=f"list {later_prefix}")
        ref = PartitionRef(self.prefix, self.region, topic, 0)
        level0 = ref.segments_prefix(0)
        keys = retry(lambda: [o.key for o in self.store.list(level0)], self.retry_policy,
                     what=f"list {level0}")
        segs = [k for k in map(SegmentKey.try_parse, keys) if k is not None]
        if not segs:
            return BaseOwner(None, later)
        newest = max(segs, key=lambda k: k.end)
        try:
            with open_segment(self.store, newest) as r:
                tid = r.metadata.topic_id
        except ReplicatorError as e:
            log.warning("%s: the footer of %s is unreadable (%s); its owner is unknown",
                        topic, newest.to_key(), e)
            tid = None
        return BaseOwner(tid or None, later)
