"""Parsing and printing of durations (``500ms``, ``1h30m``) and sizes (``100MiB``)."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)")


def parse_duration(text: str) -> timedelta:
    """Parse ``"500ms"``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"2d"`` into a ``timedelta``.

    Raises:
        ValueError: with the offending text, for anything else (``"5"``, ``"5x"``, ``""``).
    """
    s = text.strip().lower()
    if not s:
        raise ValueError("empty duration (use e.g. '500ms', '30s', '5m', '1h30m')")
    total = timedelta()
    pos = 0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"invalid duration {text!r} (use e.g. '500ms', '30s', '5m', '1h30m')")
    return total


def format_duration(d: timedelta) -> str:
    """Print a ``timedelta`` the way ``parse_duration`` reads it (``1h30m``, ``250ms``)."""
    ms = round(d.total_seconds() * 1000)
    if ms == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        n, ms = divmod(ms, size)
        if n:
            parts.append(f"{n}{unit}")
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)


def parse_size(value: int | str) -> int:
    """Parse a byte count: an int, or a string like ``"100MiB"``, ``"1GiB"``, ``"64KB"``.

    Raises:
        ValueError: with the offending value, for negative or unparsable sizes.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return value
    m = _SIZE.fullmatch(value.strip())
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"invalid size {value!r} (use bytes or e.g. '64KiB', '100MiB', '1GiB')")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def format_size(n: float) -> str:
    """Print a byte count for humans (``1.5 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
