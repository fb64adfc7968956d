"""The segments a snapshot of a topic's Iceberg table lists: ``replicator restore
--snapshot`` (docs/archive.md). Needs ``[catalog]`` and the ``archive`` extra.
"""

from __future__ import annotations

from replicator.core.errors import ConfigError, FatalError
from replicator.core.keys import SegmentKey
from replicator.core.settings import Settings
from replicator.core.storage import ObjectStore


class SnapshotUnknown(FatalError):
    """The topic has no table, or its table keeps no such snapshot (the CLI exits 2)."""


def snapshot_segments(settings: Settings, store: ObjectStore, region: str, topic: str,
                      snapshot_id: int, *, topic_id: str | None = None,
                      live: bool = True) -> frozenset[SegmentKey]:
    """The segments the data files of snapshot ``snapshot_id`` of the topic's table are.

    Args:
        settings: settings with ``[catalog]``.
        store: the bucket.
        region: the source region.
        topic: the source topic.
        snapshot_id: the table snapshot (``replicator archive snapshots`` lists them).
        topic_id: the incarnation's topic id, when not the live one: its own table
            (docs/architecture.md, "Topic incarnations").
        live: read the live incarnation's table (``topic_id`` is then not used).

    Raises:
        ConfigError: ``catalog.enabled`` is false, or the ``archive`` extra is missing.
        SnapshotUnknown: no table for the topic, or no such snapshot kept.
        CatalogError: the catalog or the table's metadata could not be read.
    """
    if not settings.catalog.enabled:
        raise ConfigError("catalog.enabled", "--snapshot reads a snapshot of the topic's "
                          "archive table: set [catalog] enabled = true (docs/configuration.md)")
    try:
        from replicator.archive.committer import ArchiveCommitter
        from replicator.archive.naming import TableIdentity
    except ImportError as e:
        raise ConfigError("catalog.enabled", f"needs the 'archive' extra (pip install "
                          f"'kafka-s3-replicator[archive]'): {e}") from e
    committer = ArchiveCommitter(settings, store)
    if live:
        table = committer.table(region, topic, create=False)
    else:
        table = committer.catalog.load(
            committer.identifier(TableIdentity(region, topic, topic_id)))
    if table is None:
        raise SnapshotUnknown(f"{region}/{topic} has no archive table (replicator archive "
                              "sync creates it)")
    if not table.has_snapshot(snapshot_id):
        kept = [s.snapshot_id for s in table.snapshots()]
        raise SnapshotUnknown(
            f"table {table.name} keeps no snapshot {snapshot_id} (expired, or never its "
            f"own; replicator archive snapshots lists the {len(kept)} kept)")
    keys = set()
    for path in table.files(snapshot_id):
        # A trimmed copy stands for its segment: restore reads segments, and ingress takes
        # each position once from the overlapping ones (archive/trims.py).
        piece = committer.piece_of(table, path)
        if piece is None:
            raise SnapshotUnknown(f"snapshot {snapshot_id} of {table.name} lists {path}, "
                                  "not a segment of this bucket")
        keys.add(piece.key)
    return frozenset(keys)
