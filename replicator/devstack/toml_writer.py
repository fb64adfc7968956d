"""A small TOML writer for the config files of child processes (the embedded stack, tests,
benchmarks): scalars, lists, nested tables and arrays of tables (``[[ingress.sources]]``).

Python reads TOML (``tomllib``) but does not write it; the configs written here are read
back by ``replicator.core.settings`` like a user's file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def toml_value(v: Any) -> str:
    """One value: a string, number, boolean, list or inline table."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}"
                                for k, x in v.items()) + " }"
    raise TypeError(f"no TOML value for {type(v).__name__}: {v!r}")


def _array_of_tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def to_toml(data: Mapping[str, Any]) -> str:
    """``data`` as a TOML document: nested mappings become tables, non-empty lists of
    mappings arrays of tables; ``tomllib.loads(to_toml(d)) == d``.
    """
    lines: list[str] = []

    def table(prefix: str, d: Mapping[str, Any]) -> None:
        if prefix:
            lines.append(f"[{prefix}]")
        for k, v in d.items():
            if not isinstance(v, Mapping) and not _array_of_tables(v):
                lines.append(f"{json.dumps(str(k))} = {toml_value(v)}")
        for k, v in d.items():
            name = f"{prefix}.{json.dumps(str(k))}" if prefix else json.dumps(str(k))
            if isinstance(v, Mapping):
                table(name, v)
            elif _array_of_tables(v):
                for item in v:
                    lines.append(f"[[{name}]]")
                    for ik, iv in item.items():
                        lines.append(f"{json.dumps(str(ik))} = {toml_value(iv)}")

    table("", data)
    return "\n".join(lines) + "\n"


def write_toml(path: Path, data: Mapping[str, Any]) -> Path:
    """Write ``to_toml(data)`` to ``path``; returns ``path``."""
    path.write_text(to_toml(data))
    return path
