"""The DuckDB seam: the only module that imports duckdb (``replicator archive sql``).

Queries run locked down (``lock_down``): they read the registered tables and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from replicator.core.errors import FatalError


class QueryError(FatalError):
    """DuckDB refused the query (syntax, unknown column, a failed scan)."""


@dataclass(frozen=True)
class QueryResult:
    """Column names and rows of a query."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """No files, network, extensions or attached databases for the query: only the tables
    registered so far (a query is text a wrapper may forward from anyone). Locked, so the
    query cannot switch it back.
    """
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def parse_sql(sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of ``sql`` (``json_serialize_sql``).

    Raises:
        QueryError: the statement does not parse (the message is DuckDB's).
    """
    con = duckdb.connect()
    try:
        lock_down(con)
        text = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0]
    finally:
        con.close()
    tree: dict[str, Any] = json.loads(text)
    if tree.get("error"):
        raise QueryError(f"{tree.get('error_type', 'parser')} error: "
                         f"{tree.get('error_message', tree)}")
    return tree


def run_sql(sql: str, tables: Mapping[str, Callable[[], pa.RecordBatchReader | pa.Table]],
            views: Mapping[tuple[str, str], str] | None = None) -> QueryResult:
    """Run ``sql`` with each of ``tables`` registered under its name (the reader is built
    only for the names the query mentions, and streamed), and each ``(schema, name)`` of
    ``views`` a view of the registered table it maps to. Times are in UTC.

    Raises:
        QueryError: DuckDB failed (the message names the cause).
    """
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        for name, reader in tables.items():
            con.register(name, reader())
        for (schema, name), registered in (views or {}).items():
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {_quoted(schema)}")
            con.execute(f"CREATE VIEW {_quoted(schema)}.{_quoted(name)} AS "
                        f"SELECT * FROM {_quoted(registered)}")
        lock_down(con)
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description or []]
        return QueryResult(columns, [tuple(r) for r in cur.fetchall()])
    except duckdb.Error as e:
        raise QueryError(str(e)) from e
    finally:
        con.close()


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
