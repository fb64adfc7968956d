"""The Iceberg catalog of ``[catalog]``: loading it, and creating, registering, listing and
dropping the archive tables in it (the other half of the Iceberg seam, ``archive.iceberg``,
holds a table).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from pyarrow.fs import FileSelector, FileType
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.name_mapping import create_mapping_from_schema

from replicator.archive.iceberg import (
    SEGMENT_PARTITION_SPEC,
    SEGMENT_TABLE_SCHEMA,
    TABLE_PROPERTIES,
    IcebergTable,
    wrap_error,
)
from replicator.core.errors import FatalError
from replicator.core.settings import Settings

log = logging.getLogger(__name__)


class TableLocationInUse(FatalError):
    """A table would be created where another catalog's table metadata already is."""


def catalog_properties(settings: Settings) -> dict[str, str]:
    """Pyiceberg catalog properties: ``[catalog]``'s, over the S3 FileIO's from ``[s3]``."""
    s3 = settings.s3
    props = {"type": settings.catalog.type, "s3.region": settings.s3_region}
    if s3.endpoint_url:
        props["s3.endpoint"] = s3.endpoint_url
    if s3.access_key_id is not None and s3.secret_access_key is not None:
        props["s3.access-key-id"] = s3.access_key_id.get_secret_value()
        props["s3.secret-access-key"] = s3.secret_access_key.get_secret_value()
    props["warehouse"] = warehouse(settings)
    return props | dict(settings.catalog.properties)


def warehouse(settings: Settings) -> str:
    """Where table metadata is written."""
    return (settings.catalog.warehouse or f"s3://{settings.s3.bucket}/iceberg").rstrip("/")


class IcebergCatalog:
    """An Iceberg catalog of ``[catalog]`` (any type pyiceberg loads).

    Raises:
        CatalogError: the catalog cannot be loaded.
    """

    def __init__(self, settings: Settings) -> None:
        self._warehouse = warehouse(settings)
        self._namespaces = threading.Lock()
        props = catalog_properties(settings)
        try:
            self._catalog: Catalog = load_catalog("replicator", **props)
        except Exception as e:   # pyiceberg raises many kinds here (driver, config, network)
            raise wrap_error(f"loading the {settings.catalog.type} catalog", e) from e

    def load(self, identifier: tuple[str, ...]) -> IcebergTable | None:
        """The table, or ``None`` if it does not exist."""
        try:
            return IcebergTable(self._catalog.load_table(identifier))
        except NoSuchTableError:
            return None
        except Exception as e:
            raise wrap_error(f"loading table {'.'.join(identifier)}", e) from e

    def create(self, identifier: tuple[str, ...], properties: Mapping[str, str], *,
               over_metadata: bool = False) -> IcebergTable:
        """Create the table (and its namespace) unless it exists; return it.

        Raises:
            TableLocationInUse: the table's location already holds metadata (another
                catalog's table, or a lost one: ``register``), unless ``over_metadata``.
        """
        table = self.load(identifier)
        if table is not None:
            return table
        try:
            self._ensure_namespace(identifier[:-1])
            location = "/".join((self._warehouse, *identifier))
            if not over_metadata and self._has_metadata(location):
                raise TableLocationInUse(
                    f"{'.'.join(identifier)}: {location}/metadata/ already holds table "
                    "metadata that this catalog does not list (another catalog over the same "
                    "warehouse, or a catalog that was lost): not created over it. Point "
                    "[catalog] at the catalog that owns it, or register its newest "
                    "metadata.json (replicator archive rebuild --register), or remove it")
            props = TABLE_PROPERTIES | {
                "schema.name-mapping.default":
                    create_mapping_from_schema(SEGMENT_TABLE_SCHEMA).model_dump_json(),
            } | dict(properties)
            created = self._catalog.create_table(
                identifier, SEGMENT_TABLE_SCHEMA, location=location,
                partition_spec=SEGMENT_PARTITION_SPEC, properties=props)
            log.info("created Iceberg table %s at %s", ".".join(identifier), location)
            return IcebergTable(created)
        except TableLocationInUse:
            raise
        except TableAlreadyExistsError:   # created meanwhile by another process
            again = self.load(identifier)
            assert again is not None
            return again
        except Exception as e:
            raise wrap_error(f"creating table {'.'.join(identifier)}", e) from e

    def _ensure_namespace(self, namespace: tuple[str, ...]) -> None:
        # One at a time: tables of one namespace are created by parallel steps
        # (catalog.sync_workers), and two creates of one namespace break the SQL catalog.
        with self._namespaces:
            try:
                self._catalog.create_namespace(namespace)
            except NamespaceAlreadyExistsError:
                pass

    def _has_metadata(self, location: str) -> bool:
        """True when ``{location}/metadata/`` holds a table with history: any file but the
        one ``metadata.json`` of a create that failed after writing it (version 00000, no
        snapshot: nothing to lose, and refusing it would wedge the table for good).
        """
        try:
            io = load_file_io(dict(self._catalog.properties), location)
            if not io.new_input(f"{location}/metadata").exists():
                return False
            if not isinstance(io, PyArrowFileIO):
                return True   # cannot list: refuse
            scheme, netloc, path = PyArrowFileIO.parse_location(f"{location}/metadata")
            fs = io.fs_by_scheme(scheme, netloc)
            files = fs.get_file_info(FileSelector(path, recursive=True))
            names = [f.path.rsplit("/", 1)[-1] for f in files if f.type == FileType.File]
            if len(names) != 1 or not names[0].startswith("00000-"):
                return True
            meta = FromInputFile.table_metadata(io.new_input(f"{location}/metadata/{names[0]}"))
            return bool(meta.snapshots)
        except Exception as e:
            raise wrap_error(f"checking {location}/metadata", e) from e

    def register(self, identifier: tuple[str, ...], metadata_location: str) -> IcebergTable:
        """Register an existing table from its ``metadata.json`` (repair after a catalog
        loss: the table, its snapshots and history come back as they were).
        """
        try:
            self._ensure_namespace(identifier[:-1])
            return IcebergTable(self._catalog.register_table(identifier, metadata_location))
        except Exception as e:
            raise wrap_error(f"registering {'.'.join(identifier)} from {metadata_location}",
                        e) from e

    def drop(self, identifier: tuple[str, ...]) -> bool:
        """Drop the table from the catalog (never its data files); ``False`` if absent."""
        try:
            self._catalog.drop_table(identifier)
            return True
        except NoSuchTableError:
            return False
        except Exception as e:
            raise wrap_error(f"dropping table {'.'.join(identifier)}", e) from e

    def tables(self, namespace: tuple[str, ...]) -> list[tuple[str, ...]]:
        """Identifiers of the tables in ``namespace`` and in the namespaces below it."""
        out: list[tuple[str, ...]] = []
        try:
            out.extend(tuple(t) for t in self._catalog.list_tables(namespace))
            for child in self._catalog.list_namespaces(namespace):
                out.extend(self.tables(tuple(child)))
        except Exception as e:
            if type(e).__name__ == "NoSuchNamespaceError":
                return out
            raise wrap_error(f"listing namespace {'.'.join(namespace)}", e) from e
        return sorted(set(out))

    def every_table(self, *also: tuple[str, ...]) -> tuple[list[tuple[str, ...]], list[str]]:
        """Identifiers of every table the catalog lists (all namespaces, from the root, and
        the namespaces ``also`` even when the root cannot be listed), and the namespaces
        that could not be listed (another team's, without access: named for a warning,
        never fatal).
        """
        out: list[tuple[str, ...]] = []
        unlisted: list[str] = []
        todo: list[tuple[str, ...]] = [*also, ()]
        seen: set[tuple[str, ...]] = set(also)
        while todo:
            ns = todo.pop()
            try:
                if ns:
                    out.extend(tuple(t) for t in self._catalog.list_tables(ns))
                children = {tuple(c) for c in self._catalog.list_namespaces(ns)} - seen
                seen |= children
                todo.extend(sorted(children))
            except Exception as e:   # noqa: BLE001 - any catalog's listing error
                if type(e).__name__ != "NoSuchNamespaceError":
                    unlisted.append(f"{'.'.join(ns) or '(root)'}: {type(e).__name__}: {e}")
        return sorted(set(out)), unlisted

    def rename(self, old: tuple[str, ...], new: tuple[str, ...]) -> IcebergTable:
        """Rename a table in the catalog (its location, snapshots and history stay)."""
        try:
            self._ensure_namespace(new[:-1])
            return IcebergTable(self._catalog.rename_table(old, new))
        except Exception as e:
            raise wrap_error(f"renaming table {'.'.join(old)} to {'.'.join(new)}", e) from e
