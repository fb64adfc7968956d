"""Plain-text tables for the operator commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in rows) and bool(rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print ``render_table`` to stdout."""
    click.echo(render_table(headers, rows))
