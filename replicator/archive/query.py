"""``replicator archive sql``: DuckDB over the tables' scans, pruned by the query's filter.

Each table is registered in DuckDB under the last part of its identifier (``sensor_events``)
and under its last two parts as ``schema.table`` (``us_east_1.sensor_events``; DuckDB's
schema is the part before the name), as a stream of the records pyiceberg reads. A name
that more than one table answers to (``t`` with tables ``r1.t`` and ``r2.t``) is refused,
naming them: a query never silently reads one of them. When the query is one ``SELECT`` over one
table, the comparisons of ``partition``, ``offset``, ``timestamp`` and ``timestamp_type``
with constants that its ``WHERE`` requires (its top-level ``AND`` terms) go to the scan:
files whose manifest entries rule them out (partition value, offset and time bounds) are
never read. DuckDB then applies the whole query, so pruning only ever skips records the
query would drop. Anything else (joins, ``OR``, subqueries) scans every file. A table the
query scans more than once (named twice, or in a ``WITH``) is read into memory first: a
stream can be scanned once only.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from replicator.archive.committer import ArchiveCommitter
from replicator.archive.duckdb_sql import QueryError, QueryResult, parse_sql, run_sql
from replicator.archive.iceberg import Bound, IcebergTable
from replicator.archive.naming import TableIdentity

log = logging.getLogger(__name__)

PRUNING_COLUMNS = frozenset({"partition", "offset", "timestamp", "timestamp_type"})

_COMPARE = {"COMPARE_EQUAL": "=", "COMPARE_LESSTHAN": "<", "COMPARE_LESSTHANOREQUALTO": "<=",
            "COMPARE_GREATERTHAN": ">", "COMPARE_GREATERTHANOREQUALTO": ">="}
_FLIP = {"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def table_refs(tree: dict[str, Any]) -> list[str]:
    """Names of the base tables the statement reads, once per mention (lowercased)."""
    return [name for _, name in qualified_refs(tree)]


def qualified_refs(tree: dict[str, Any]) -> list[tuple[str, str]]:
    """``(schema, name)`` of the base tables the statement reads, once per mention
    (lowercased; schema ``""`` when the name is not qualified).
    """
    return [(str(n.get("schema_name") or "").lower(), str(n.get("table_name", "")).lower())
            for n in _walk(tree) if n.get("type") == "BASE_TABLE"]


def _constant(node: dict[str, Any]) -> str | None:
    if node.get("class") == "CAST":
        child = node.get("child")
        return _constant(child) if isinstance(child, dict) else None
    if node.get("class") != "CONSTANT":
        return None
    lit = node.get("literal")
    if isinstance(lit, dict) and "text" in lit:   # DuckDB >= 1.4
        return str(lit["text"])
    value = node.get("value")
    if isinstance(value, dict) and "value" in value:
        v = value["value"]
        return None if v is None else str(v)
    return None


def _column(node: dict[str, Any]) -> str | None:
    if node.get("class") != "COLUMN_REF":
        return None
    names = node.get("column_names") or []
    return str(names[-1]).lower() if names else None


def _value(column: str, text: str) -> int | None:
    if column != "timestamp":
        try:
            return int(text)
        except ValueError:
            return None
    t = text.strip().replace(" ", "T", 1)
    if len(t) > 3 and t[-3] in "+-" and t[-3:].lstrip("+-").isdigit():
        t += ":00"   # "+00" as DuckDB prints offsets
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)   # the session's time zone is UTC (run_sql)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _bound(term: dict[str, Any]) -> Bound | None:
    op = _COMPARE.get(str(term.get("type")))
    left, right = term.get("left"), term.get("right")
    if op is None or not isinstance(left, dict) or not isinstance(right, dict):
        return None
    column, text = _column(left), _constant(right)
    if column is None:
        column, text, op = _column(right), _constant(left), _FLIP[op]
    if column not in PRUNING_COLUMNS or text is None:
        return None
    value = _value(column, text)
    if value is None:
        return None
    if column == "timestamp" and op in (">", "<="):
        # The scan compares microseconds, DuckDB may compare finer: widen to stay implied.
        op = ">=" if op == ">" else "<="
    return Bound(column, op, value)


def pruning_bounds(tree: dict[str, Any], table: str, schema: str = "") -> list[Bound]:
    """The bounds the statement's ``WHERE`` requires of ``table``'s records (none unless
    it is one ``SELECT`` that reads ``table`` once, from its ``FROM``), named as
    ``schema.table`` when ``schema`` is given.
    """
    statements = tree.get("statements") or []
    if len(statements) != 1 or qualified_refs(tree).count((schema, table)) != 1:
        return []
    node = statements[0].get("node") or {}
    source = node.get("from_table") or {}
    if node.get("type") != "SELECT_NODE" or source.get("type") != "BASE_TABLE" \
            or str(source.get("table_name", "")).lower() != table \
            or str(source.get("schema_name") or "").lower() != schema:
        return []
    where = node.get("where_clause")
    if not isinstance(where, dict):
        return []
    terms = where.get("children", []) if where.get("type") == "CONJUNCTION_AND" else [where]
    return [b for t in terms if isinstance(t, dict) and (b := _bound(t)) is not None]


@dataclass
class TableScan:
    """What a query read of one table."""

    name: str
    table: str
    bounds: list[Bound]
    files: int
    files_read: int


@dataclass
class SqlAnswer:
    """A query's result and what it read."""

    result: QueryResult
    scans: list[TableScan] = field(default_factory=list)


def named_tables(committer: ArchiveCommitter, names: set[str] | None = None
                 ) -> list[IcebergTable]:
    """The tables whose identifier ends in one of ``names`` (every table when ``None``):
    the others are never loaded, so a query reads the metadata of what it names.
    """
    out: list[IcebergTable] = []
    # Without {incarnation} in the template a name needs no read of the topic's
    # _topic.json: only the tables the query names cost requests.
    by_name = "{incarnation}" not in committer.cfg.table_name
    for region, topic in committer.topics():
        ident = (TableIdentity(region, topic) if by_name
                 else committer.identity(region, topic))
        if names is not None and committer.identifier(ident)[-1].lower() not in names:
            continue
        table = committer.table(region, topic, create=False)
        if table is not None:
            out.append(table)
    return out


def _answering(tables: list[IcebergTable], schema: str, name: str) -> list[IcebergTable]:
    """The tables ``schema.name`` (``name`` alone when ``schema`` is empty) stands for."""
    return [t for t in tables if t.identifier[-1].lower() == name
            and (not schema or t.identifier[-2].lower() == schema)]


def _refuse_ambiguous(schema: str, name: str, tables: list[IcebergTable]) -> QueryError:
    names = ", ".join(t.name for t in tables)
    ways = " or ".join(f"{t.identifier[-2]}.{t.identifier[-1]}" for t in tables)
    ref = f"{schema}.{name}" if schema else name
    hint = (f"name one as {ways}" if not schema else
            "their identifiers differ before their last two parts, which queries cannot "
            "name: give each a table_name of its own")
    return QueryError(f"{ref} names {len(tables)} tables ({names}): {hint}")


def query_tables(committer: ArchiveCommitter, names: set[str] | None = None
                 ) -> dict[str, IcebergTable]:
    """The tables a query can name by the last part of their identifier (only ``names``,
    when given).

    Raises:
        QueryError: one name stands for two tables (two regions' ``t``).
    """
    out: dict[str, IcebergTable] = {}
    tables = named_tables(committer, names)
    for table in tables:
        name = table.identifier[-1].lower()
        if name in out:
            raise _refuse_ambiguous("", name, _answering(tables, "", name))
        out[name] = table
    return out


def has_cte(tree: dict[str, Any]) -> bool:
    """True when the statement defines a common table expression (``WITH``)."""
    return any(isinstance(cte := n.get("cte_map"), dict) and cte.get("map")
               for n in _walk(tree))


def _reader(table: IcebergTable, bounds: list[Bound], snapshot_id: int | None, *,
            once: bool) -> Callable[[], pa.RecordBatchReader | pa.Table]:
    """The table's records for DuckDB: a stream when the query scans the table once, else
    read into memory (a stream cannot be scanned twice: DuckDB 2 fails, 1.x answers wrong).
    """
    if once:
        return lambda: table.reader(bounds, snapshot_id)
    return lambda: table.reader(bounds, snapshot_id).read_all()


def run_query(committer: ArchiveCommitter, sql: str, *,
              snapshot_id: int | None = None) -> SqlAnswer:
    """Run ``sql`` over the archive tables.

    Raises:
        QueryError: DuckDB refused or failed the query.
        CatalogError: a table could not be read.
    """
    tree = parse_sql(sql)
    refs = Counter(qualified_refs(tree))
    tables = named_tables(committer, {name for _, name in refs})
    # Each name the query uses, resolved to its one table (a table may be named as `t`
    # and as `r1.t` in one query: one reader).
    uses: dict[str, tuple[IcebergTable, list[tuple[str, str]]]] = {}
    for schema, name in sorted(refs):
        answering = _answering(tables, schema, name)
        if len(answering) > 1:
            raise _refuse_ambiguous(schema, name, answering)
        if answering:
            uses.setdefault(answering[0].name, (answering[0], []))[1].append((schema, name))
    # A table named twice (self-join, subquery, UNION) or inside a WITH (which DuckDB may
    # inline at each use) is scanned more than once.
    cte = has_cte(tree)
    scans: list[TableScan] = []
    readers: dict[str, Callable[[], pa.RecordBatchReader | pa.Table]] = {}
    views: dict[tuple[str, str], str] = {}
    for i, (table, names) in enumerate(uses.values()):
        once = sum(refs[n] for n in names) == 1 and not cte
        schema, name = names[0]
        bounds = pruning_bounds(tree, name, schema) if once else []
        read = table.planned_files(bounds, snapshot_id)
        total = len(table.planned_files((), snapshot_id)) if bounds else len(read)
        scans.append(TableScan(f"{schema}.{name}" if schema else name, table.name, bounds,
                               total, len(read)))
        registered = name if ("", name) in names else f"__archive_table_{i}"
        readers[registered] = _reader(table, bounds, snapshot_id, once=once)
        views.update({n: registered for n in names if n[0]})
    return SqlAnswer(run_sql(sql, readers, views), scans)
