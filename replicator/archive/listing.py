"""A topic's listing brought up to date without listing it all again.

A full listing of a topic reads every key under its prefix: 40 LIST requests (over a
second on S3) for two weeks of 30 s segments of one partition, at every step. Segment
keys are ``{prefix}/{region}/{topic}/{partition}/{level}/{start}-{end}``, zero-padded: in
one folder (a partition's level) a segment published later than the newest one listed
sorts after it. So the step after a listing lists, per folder, only the keys after the
last one seen, plus everything between the folders (new partitions, new levels, other
incarnations): one LIST request per folder instead of one per 1,000 keys
(``listed_since``).

What this cannot see, until the next full listing (``catalog.full_listing_interval``):
a key that sorts before the last one of its folder (a segment published late below the
newest one, a compaction output at a lower start than the level's newest output), and a
key deleted inside a folder's span (a lifecycle rule). The committer lists in full at
that interval, and at every step where its memory is not sure (``archive.step_memory``):
a restart, another writer's commit, a compaction swap, a segment left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from replicator.core.storage import ObjectInfo, ObjectStore


def folder_spans(keys: Mapping[str, object]) -> list[tuple[str, str]]:
    """The first and last key of each folder of ``keys``, in key order (disjoint: every key
    between two keys of one folder is in that folder or below it, where segments are not).
    """
    spans: dict[str, list[str]] = {}
    for key in keys:
        folder = key[:key.rfind("/") + 1]
        span = spans.get(folder)
        if span is None:
            spans[folder] = [key, key]
        elif key < span[0]:
            span[0] = key
        elif key > span[1]:
            span[1] = key
    return sorted((lo, hi) for lo, hi in spans.values())


def listed_since(store: ObjectStore, prefix: str,
                 prior: Mapping[str, ObjectInfo]) -> Iterator[ObjectInfo]:
    """The objects of ``prior`` (an earlier listing of ``prefix``'s segment keys, which
    may since have been deleted), then every object under ``prefix`` outside the span of
    each of their folders: listed from the end of one span to the start of the next.
    """
    yield from prior.values()
    after: str | None = None
    spans: list[tuple[str | None, str | None]] = [*folder_spans(prior), (None, None)]
    for lo, hi in spans:
        for info in store.list(prefix, start_after=after):
            if lo is not None and info.key >= lo:
                break
            yield info
        after = hi
