"""A topic's listing brought up to date without listing it all again.

A full listing of a topic reads every key under its prefix: 40 LIST requests (over a
second on S3) for two weeks of 30 s segments of one partition, at every step. Segment
keys are ``{prefix}/{region}/{topic}/{partition}/{level}/{start}-{end}``, zero-padded: in
one folder (a partition's level) a segment published later than the newest one listed
sorts after it. So the step after a listing lists, per folder, only the keys after the
last one seen, plus everything between the folders (new partitions, new levels, other
incarnations): one LIST request per folder instead of one per 1,000 keys
(``listed_since``). Each LIST starts at the folder's last key but one and stops at the next
folder's first key: when either is gone (a lifecycle rule deletes the oldest segments
first) the step lists in full.

What this cannot see, until the next full listing (``catalog.full_listing_interval``):
a key that sorts inside a folder's span (a segment published late below the newest one, a
compaction output at a lower start than the level's newest output), and a deletion of a
key inside it other than its first and last. The committer lists in full at
that interval, and at every step where its memory is not sure (``archive.step_memory``):
a restart, another writer's commit, a compaction swap, a segment left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from replicator.core.storage import ObjectInfo, ObjectStore

KEYS_PER_LIST = 1000
"""Keys one LIST request returns (S3's page): a topic whose full listing takes no more
requests than listing what follows its folders is listed in full."""


def folder_spans(keys: Iterable[str]) -> list[tuple[str, str | None, str]]:
    """The first, the last but one (``None``: a single key) and the last key of each folder
    of ``keys``, in key order (disjoint: every key between two keys of one folder is in that
    folder or below it, where segments are not).
    """
    spans: dict[str, list[Any]] = {}
    for key in keys:
        folder = key[:key.rfind("/") + 1]
        span = spans.get(folder)
        if span is None:
            spans[folder] = [key, None, key]
            continue
        span[0] = min(span[0], key)
        if key > span[2]:
            span[1], span[2] = span[2], key
        elif key < span[2] and (span[1] is None or key > span[1]):
            span[1] = key
    return sorted((lo, below, hi) for lo, below, hi in spans.values())


def listed_since(store: ObjectStore, prefix: str,
                 prior: Iterable[str]) -> list[ObjectInfo] | None:
    """The objects under ``prefix`` outside the span of each folder of ``prior`` (the keys
    of an earlier listing of ``prefix``'s segments): listed from the end of one span to the
    start of the next. ``None`` when the first or the last key of a span is gone (a
    lifecycle rule deletes the oldest segments first), or when a full listing takes no
    more requests (``KEYS_PER_LIST``): the caller lists in full.
    """
    keys = list(prior)
    found = folder_spans(keys)
    if len(found) + 1 >= -(-len(keys) // KEYS_PER_LIST):
        return None
    new: list[ObjectInfo] = []
    after: str | None = None
    expect: str | None = None   # the key this LIST must start with: the last span's last
    spans: list[tuple[str | None, str | None, str | None]] = [*found, (None, None, None)]
    for lo, below, hi in spans:
        for info in store.list(prefix, start_after=after):
            if expect is not None:
                if info.key != expect:
                    return None
                expect = None
            elif lo is not None and info.key >= lo:
                if info.key != lo:
                    return None
                break
            else:
                new.append(info)
        else:
            if expect is not None or lo is not None:
                return None
        after, expect = (hi, None) if below is None else (below, hi)
    return new
