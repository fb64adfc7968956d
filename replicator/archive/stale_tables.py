"""Tables stamped for a source under an identifier the settings no longer render.

Changing ``catalog.table_name`` or ``catalog.namespace`` between runs makes the committer
create a second table for each source and leaves the first in the catalog, stamped for the
same source and never stepped again: it silently stops following the topic, and once
compaction deletes the segments it lists, every scan of it fails on a missing object. At
start the committer lists the catalog once, reads the stamps (table properties) of the
tables whose names could be a source's, and refuses to run while such a stale table
exists (``refuse_stale``, from ``ArchiveCommitter.check_mapping``); ``adopt`` renames it
to the identifier the settings render, history kept (``replicator archive rebuild
--adopt``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from replicator.archive.iceberg import IcebergTable
from replicator.archive.iceberg_catalog import IcebergCatalog
from replicator.archive.ownership import (
    BUCKET,
    INCARNATION,
    PREFIX,
    REGION,
    TOPIC,
    Source,
    check_owner,
    stamped,
)
from replicator.core.errors import ConfigError

log = logging.getLogger(__name__)

_NOT_NAME = re.compile(r"[^a-z0-9_]")


@dataclass(frozen=True)
class StaleTable:
    """A table stamped for ``source`` at ``identifier`` while the settings render
    ``rendered`` for it.
    """

    source: Source
    identifier: tuple[str, ...]
    rendered: tuple[str, ...]

    def __str__(self) -> str:
        return (f"table {'.'.join(self.identifier)} is stamped for {self.source}, whose "
                f"table is now {'.'.join(self.rendered)}")


def name_core(topic: str) -> str:
    """What every identifier rendered for ``topic`` contains in one of its parts (the
    template's part holding ``{topic}`` is sanitized as a whole, ``naming.sanitize``).
    """
    return _NOT_NAME.sub("_", topic.lower())


def candidates(identifiers: Iterable[tuple[str, ...]],
               rendered: Mapping[Source, tuple[str, ...]]) -> dict[tuple[str, ...], list[Source]]:
    """The identifiers (other than the rendered ones) that could be a source's table by
    name, with those sources: only their properties need reading.
    """
    mine = set(rendered.values())
    cores = [(name_core(s.topic), s) for s in rendered]
    out: dict[tuple[str, ...], list[Source]] = {}
    for ident in identifiers:
        if ident in mine:
            continue
        hits = [s for core, s in cores if any(core in part for part in ident)]
        if hits:
            out[ident] = hits
    return out


def same_source(props: Mapping[str, str], source: Source, *, per_incarnation: bool) -> bool:
    """Whether a table's stamp names ``source`` (a stamp without bucket or prefix, from an
    earlier release, matches any). A table stamped with another incarnation is that
    incarnation's; with ``per_incarnation`` (``{incarnation}`` in the template: one table
    each, kept on purpose) so is one stamped with none while the source has one.
    """
    if props.get(REGION) != source.region or props.get(TOPIC) != source.topic:
        return False
    if props.get(BUCKET, source.bucket) != source.bucket \
            or props.get(PREFIX, source.prefix) != source.prefix:
        return False
    have = props.get(INCARNATION)
    if per_incarnation:
        return have == source.incarnation
    return have is None or source.incarnation is None or have == source.incarnation


def stale(found: Mapping[tuple[str, ...], Mapping[str, str]],
          cands: Mapping[tuple[str, ...], list[Source]],
          rendered: Mapping[Source, tuple[str, ...]], *, per_incarnation: bool
          ) -> list[StaleTable]:
    """The candidates whose properties (``found``) stamp them for one of their sources."""
    out = []
    for ident, props in sorted(found.items()):
        for source in cands.get(ident, ()):
            if same_source(props, source, per_incarnation=per_incarnation):
                out.append(StaleTable(source, ident, rendered[source]))
                break
    return out


def refuse_stale(catalog: IcebergCatalog, rendered: Mapping[Source, tuple[str, ...]], *,
                 per_incarnation: bool, namespace: tuple[str, ...] = ()) -> None:
    """Refuse to start while a table is stamped for one of ``rendered``'s sources under
    another identifier: one listing of the catalog, then the properties of the tables
    whose names could be a source's (the rendered ones are checked by the caller);
    ``namespace`` is listed even when the catalog's root cannot be.

    Raises:
        ConfigError: naming both identifiers and the way out (key ``catalog.table_name``).
    """
    if not rendered:
        return
    listed, unlisted = catalog.every_table(*([namespace] if namespace else []))
    if unlisted:
        log.warning("namespaces not listed (tables stamped for this bucket's topics there "
                    "cannot be found): %s", "; ".join(unlisted[:5]))
    cands = candidates(listed, rendered)
    found = {ident: t.properties for ident in cands if (t := catalog.load(ident)) is not None}
    old = stale(found, cands, rendered, per_incarnation=per_incarnation)
    if not old:
        return
    first = old[0]
    more = "" if len(old) == 1 else (f"; {len(old) - 1} more such table(s): " + ", ".join(
        ".".join(s.identifier) for s in old[1:6]))
    raise ConfigError("catalog.table_name", (
        f"{first}: catalog.table_name or catalog.namespace changed since it was created, and "
        "the old table would never be brought up to date again (after a compaction it lists "
        "deleted segments). Keep its history under the new name: replicator archive rebuild "
        f"--region {first.source.region} --topic {first.source.topic} --adopt "
        f"{'.'.join(first.identifier)} (renames it in the catalog; a table "
        f"{'.'.join(first.rendered)} created since is dropped from the catalog first, never a "
        "data file); or set catalog.table_name and catalog.namespace back") + more)


def adopt(catalog: IcebergCatalog, old: tuple[str, ...], new: tuple[str, ...],
          source: Source, *, per_incarnation: bool) -> IcebergTable:
    """Rename the table at ``old``, stamped for ``source``, to ``new`` (its snapshots and
    history kept); a table at ``new`` stamped for the same source (created after the
    settings changed) is dropped from the catalog first, never a data file.

    Raises:
        ConfigError: ``old`` is not a table, or not stamped for ``source`` (key
            ``--adopt``).
        ForeignTable: ``new`` holds another source's table.
    """
    table = catalog.load(old)
    if table is None or not same_source(table.properties, source,
                                        per_incarnation=per_incarnation):
        what = "no such table" if table is None else stamped(table.properties)
        raise ConfigError("--adopt", f"{'.'.join(old)}: {what}; not a table of {source}")
    if old == new:
        return table
    there = catalog.load(new)
    if there is not None:
        check_owner(there.properties, source, per_incarnation=per_incarnation)
        log.warning("%s: dropped from the catalog (created after catalog.table_name or "
                    "catalog.namespace changed; its data files are segments, listed again "
                    "by the adopted table)", ".".join(new))
        catalog.drop(new)
    adopted = catalog.rename(old, new)
    log.warning("%s renamed to %s in the catalog (history kept)", ".".join(old),
                ".".join(new))
    return adopted
