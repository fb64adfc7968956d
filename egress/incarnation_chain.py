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
from collections.abc import Collection
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
    """The union of two chains (pure): ``pinned``'s order (its first entry keeps the
    documented shape), with each entry only ``other`` lists placed in creation order as
    ``insert`` places a new one (``place``: after the entries ``other`` lists before it
    or that name it later, before those ``other`` lists after it or that it names later,
    then by ``created_at``): two members recording two recreates at once, each pinning
    against the chain the other just wrote, end in creation order. A later entry of
    ``other`` whose label is the documented shape while ``pinned`` has a first entry
    takes its derived label (it cannot own the shape).

    An entry's ``previous_ends`` say where its predecessor's segments end: kept from the
    chain whose predecessor of it is the merged chain's (``pinned`` wins a disagreement:
    what was written first), never from one where another incarnation preceded it (those
    ends are another topic's; an end not recorded is waited for, a wrong one skips).
    """
    out = list(pinned)
    for k, entry in enumerate(other):
        if any(i.topic_id == entry.topic_id for i in out):
            continue
        inc = entry
        if inc.label == BASE_INCARNATION and out:
            inc = replace(inc, label=incarnation_label(inc.topic_id))
        out.insert(place(tuple(out), inc, later={e.topic_id for e in other[k + 1:]},
                         earlier={e.topic_id for e in other[:k]}), inc)
    before = {i.topic_id: (out[n - 1].topic_id if n else None) for n, i in enumerate(out)}
    result = []
    for inc in out:
        mine, mine_pred = _entry(pinned, inc.topic_id)
        theirs, their_pred = _entry(other, inc.topic_id)
        pred = before[inc.topic_id]
        ends: dict[int, int | None] = {}
        if mine is not None and _follows(pinned, mine_pred, pred):
            ends = dict(mine.previous_ends)
        if theirs is not None and _follows(other, their_pred, pred):
            ends = {**theirs.previous_ends, **ends}
        firsts = {**(theirs.first_positions if theirs is not None else {}),
                  **(mine.first_positions if mine is not None else {})}
        created = (mine.created_at if mine is not None else None) or (
            theirs.created_at if theirs is not None else None)
        later = {*(mine.later if mine is not None else ()),
                 *(theirs.later if theirs is not None else ())}
        result.append(replace(inc if mine is None else mine, previous_ends=ends,
                              first_positions=firsts, created_at=created,
                              later=tuple(sorted(later))))
    return tuple(result)


def _follows(chain: tuple[Incarnation, ...], was: str | None, now: str | None) -> bool:
    """Whether an entry whose predecessor in ``chain`` is ``was`` has ``now`` before it in
    the merged chain as far as ``chain`` knows (one that lists it first, without ``now``,
    is a part of the chain: its ends are taken as they are).
    """
    return was == now or (was is None and all(i.topic_id != now for i in chain))


def _entry(chain: tuple[Incarnation, ...], topic_id: str
           ) -> tuple[Incarnation | None, str | None]:
    """``topic_id``'s entry in ``chain`` and its predecessor's id (``None``: none)."""
    for n, inc in enumerate(chain):
        if inc.topic_id == topic_id:
            return inc, (chain[n - 1].topic_id if n else None)
    return None, None


def place(chain: tuple[Incarnation, ...], new: Incarnation, *,
          later: Collection[str] = (), earlier: Collection[str] = ()) -> int:
    """Where ``new`` (not listed) goes in ``chain`` (pure): index 1 on, after every entry
    known to be earlier (``earlier``, or an entry whose ``later`` names ``new``) and
    before the first entry known to be later (``later`` or ``new.later``: ids a writer
    read after ``new``'s, exact within one process whatever its clock); between the two,
    before the entries from which on every one was first seen after ``new``
    (``created_at`` strictly later: clocks of different members, the last resort). When
    the facts contradict the chain's order (decided earlier by clocks), the later one
    wins: ``new`` goes before it.
    """
    if not chain:
        return 0
    after_ids = {*later, *new.later}
    lo = max([1] + [n + 1 for n, i in enumerate(chain)
                    if i.topic_id in earlier or new.topic_id in i.later])
    hi = next((n for n in range(1, len(chain)) if chain[n].topic_id in after_ids),
              len(chain))
    lo = min(lo, hi)
    at = hi
    if new.created_at is not None:
        for n in range(hi - 1, lo - 1, -1):
            c = chain[n].created_at
            if c is None or c <= new.created_at:
                break
            at = n
    return at


def insert(chain: tuple[Incarnation, ...], new: Incarnation, *,
           later: Collection[str] = ()) -> tuple[tuple[Incarnation, ...], int]:
    """``chain`` with ``new`` (not listed yet) in creation order (pure), and its index.

    Topics of one name never exist at once, so any two moments each saw one id order the
    two topics: ``new`` goes where ``place`` says (ids its writer read after ``new``'s: a
    later epoch, the id when its segment is named; entries whose writers read ``new``
    after them; then when each was first seen), else at the end; ``later`` is kept in
    the entry so that a merge with another member's chain places it the same way.
    Inserted before an entry, it takes that entry's ``previous_ends`` (its predecessor's
    ends, final: a later topic existed), and that entry's ends there become ``None``:
    nothing of ``new`` could be named before it was listed, so a segment of it that comes
    later reaches ingress as one of an incarnation already passed (reported lost) rather
    than as positions of another topic. Its first positions are left to its seals (each
    partition's first segment says where it begins).
    """
    new = replace(new, later=tuple(sorted({*new.later, *later} - {new.topic_id})))
    if not chain:
        return (new,), 0
    at = place(chain, new)
    if at == len(chain):
        return (*chain, new), at
    nxt = chain[at]
    placed = replace(new, previous_ends=dict(nxt.previous_ends))
    moved = replace(nxt, previous_ends={p: None for p in nxt.previous_ends})
    return (*chain[:at], placed, moved, *chain[at + 1:]), at


def unsealed(chain: tuple[Incarnation, ...], sealed: Collection[tuple[str, int]]
             ) -> list[tuple[str, int, int]]:
    """The seals (label, partition) of ``sealed`` that ``chain`` no longer holds in full
    (pure), with where each incarnation begins there: an entry up to the sealed one
    without its predecessor's end for the partition (an insert merged with a seal written
    against the chain before it dropped ends recorded against another predecessor). A
    label no longer listed is left out (nothing to seal against).
    """
    labels = [i.label for i in chain]
    out = []
    for label, p in sorted(sealed):
        if label not in labels or labels.index(label) == 0:
            continue
        rank = labels.index(label)
        if any(p not in chain[n].previous_ends for n in range(1, rank + 1)):
            out.append((label, p, chain[rank].first_positions.get(p, 0)))
    return out


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
