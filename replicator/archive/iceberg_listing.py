"""What each kept snapshot of a table lists, read from its manifests once per process.

Snapshots and manifests never change, and one manifest is shared by the many snapshots
committed after it: the data manifests of each snapshot (by table UUID and snapshot id)
and the live data file paths of each manifest are kept, so that expiry and compaction's
hold (``SnapshotHistory``), which look at every kept snapshot, read only what a new
commit wrote instead of planning a scan per snapshot. Entries of expired snapshots, and
manifests none of the remembered snapshots use, are dropped as the cache grows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

PRUNE_EVERY = 1024
"""Snapshots remembered between two prunes of the entries no kept snapshot needs."""

_lock = threading.Lock()
_snapshots: dict[tuple[str, int], tuple[str, ...]] = {}
"""(table UUID, snapshot id) -> the paths of its data manifests."""
_manifests: dict[str, frozenset[str]] = {}
"""Manifest path -> the live data file paths it lists."""
_kept: dict[str, frozenset[int]] = {}
"""Table UUID -> the snapshots its metadata kept when last read here (for the prune)."""
_added = [0]


def manifests_of(table: Table, snapshot_id: int) -> tuple[str, ...]:
    """The data manifests of kept snapshot ``snapshot_id`` (empty: not kept), each read
    into the cache.
    """
    uuid = str(table.metadata.table_uuid)
    with _lock:
        known = _snapshots.get((uuid, snapshot_id))
    if known is not None:
        return known
    snap = table.metadata.snapshot_by_id(snapshot_id)
    if snap is None:
        return ()
    io = table.io
    paths = []
    for m in snap.manifests(io):
        if m.content != ManifestContent.DATA:
            continue
        paths.append(m.manifest_path)
        with _lock:
            have = m.manifest_path in _manifests
        if not have:
            live = frozenset(e.data_file.file_path
                             for e in m.fetch_manifest_entry(io, discard_deleted=True))
            with _lock:
                _manifests[m.manifest_path] = live
    out = tuple(paths)
    kept = frozenset(s.snapshot_id for s in table.metadata.snapshots)
    with _lock:
        _snapshots[(uuid, snapshot_id)] = out
        _kept[uuid] = kept
        _added[0] += 1
        if _added[0] >= PRUNE_EVERY:
            _prune()
    return out


def _prune() -> None:
    """Forget the snapshots each table's metadata no longer kept when last read, and the
    manifests no remembered snapshot uses (under ``_lock``).
    """
    _added[0] = 0
    for key in [k for k in _snapshots if k[1] not in _kept.get(k[0], frozenset())]:
        del _snapshots[key]
    used = {m for ms in _snapshots.values() for m in ms}
    for m in [m for m in _manifests if m not in used]:
        del _manifests[m]


def sets_of(table: Table, snapshot_id: int) -> list[tuple[str, frozenset[str]]]:
    """Each data manifest of kept snapshot ``snapshot_id`` with the paths it lists (a
    manifest a concurrent prune dropped is read again).
    """
    uuid = str(table.metadata.table_uuid)
    while True:
        ms = manifests_of(table, snapshot_id)
        with _lock:
            sets = [(m, _manifests.get(m)) for m in ms]
            if all(live is not None for _, live in sets):
                return [(m, live) for m, live in sets if live is not None]
            _snapshots.pop((uuid, snapshot_id), None)


def paths_of(table: Table, snapshot_id: int) -> frozenset[str]:
    """The data file paths kept snapshot ``snapshot_id`` lists."""
    return frozenset().union(*(live for _, live in sets_of(table, snapshot_id)))


def manifests_listing(table: Table, snapshot_ids: Iterable[int],
                      wanted: set[str]) -> dict[str, frozenset[str]]:
    """The manifests of ``snapshot_ids`` that list one of ``wanted``: which of them."""
    out: dict[str, frozenset[str]] = {}
    seen: set[str] = set()
    for sid in snapshot_ids:
        for m, live in sets_of(table, sid):
            if m not in seen:
                seen.add(m)
                if found := wanted & live:
                    out[m] = frozenset(found)
    return out


def all_paths(table: Table, snapshot_ids: Iterable[int]) -> set[str]:
    """Every data file path one of ``snapshot_ids`` lists (each manifest once)."""
    out: set[str] = set()
    seen: set[str] = set()
    for sid in snapshot_ids:
        for m, live in sets_of(table, sid):
            if m not in seen:
                seen.add(m)
                out |= live
    return out


def listing_each(table: Table, snapshot_ids: list[int], wanted: set[str]) -> list[set[str]]:
    """For each of ``snapshot_ids``, which of ``wanted`` it lists (only the manifests
    listing one are looked at).
    """
    hits = manifests_listing(table, snapshot_ids, wanted)
    out = []
    for sid in snapshot_ids:
        found: set[str] = set()
        for m, _ in sets_of(table, sid):
            found |= hits.get(m, frozenset())
        out.append(found)
    return out
