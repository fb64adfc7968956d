"""Formats by name, and by their own bytes.

* ``get_format("parquet")``: the format a writer uses (``format.name``).
* ``detect_format(tail)`` / ``open_reader(stream)``: the format of an existing segment,
  recognised by the magic its last bytes carry (``SegmentFormat.magic``): segments are
  self-describing, so a reader never depends on the configured format (a region writing
  ``arrow`` and another reading with ``parquet`` configured, or a format change, read
  every segment either way).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import BinaryIO

from formats._common import describe
from formats.base import SegmentFormat, SegmentReader
from replicator.core.errors import ConfigError, SegmentCorrupt
from replicator.core.keys import SegmentKey

_FACTORIES: dict[str, Callable[[], SegmentFormat]] = {}

TAIL_BYTES = 8
"""Bytes read from the end of an object to recognise its format (magics are shorter)."""


def register_format(name: str, factory: Callable[[], SegmentFormat]) -> None:
    """Make a format available under ``name`` (plugins call this)."""
    _FACTORIES[name] = factory


def available_formats() -> list[str]:
    """Names of registered formats."""
    _load_builtins()
    return sorted(_FACTORIES)


def get_format(name: str) -> SegmentFormat:
    """The format registered under ``name``.

    Raises:
        ConfigError: naming ``format.name`` and the known formats.
    """
    _load_builtins()
    try:
        return _FACTORIES[name]()
    except KeyError:
        raise ConfigError("format.name", f"unknown segment format {name!r} "
                                         f"(known: {', '.join(sorted(_FACTORIES))})") from None


def detect_format(tail: bytes, *, where: str = "") -> SegmentFormat:
    """The registered format whose ``magic`` the bytes ``tail`` (an object's last bytes)
    end with; the first registered wins if several would.

    Raises:
        SegmentCorrupt: naming ``where``, the bytes found and the magics known.
    """
    _load_builtins()
    known = []
    for name, factory in _FACTORIES.items():
        fmt = factory()
        if fmt.magic and tail.endswith(fmt.magic):
            return fmt
        known.append(f"{name} ends with {fmt.magic!r}")
    raise SegmentCorrupt(f"{describe(where)}: not a segment of any known format (its last "
                         f"bytes are {tail[-TAIL_BYTES:]!r}; {'; '.join(known)})")


def sniff_format(stream: BinaryIO, *, where: str = "") -> SegmentFormat:
    """The format of the segment in ``stream``, from its last bytes (one small read); the
    stream is left at its start.

    Raises:
        SegmentCorrupt: no known magic (naming ``where``).
    """
    size = stream.seek(0, io.SEEK_END)
    stream.seek(max(0, size - TAIL_BYTES))
    tail = b""
    while len(tail) < min(TAIL_BYTES, size):  # a raw stream may return short reads
        chunk = stream.read(TAIL_BYTES - len(tail))
        if not chunk:
            break
        tail += chunk
    stream.seek(0)
    return detect_format(tail, where=where)


def open_reader(stream: BinaryIO, expected: SegmentKey | None = None, *,
                where: str = "") -> SegmentReader:
    """Open a segment of whatever registered format its bytes name; check its footer
    against ``expected`` when given (``formats.segment_io.open_segment`` does the same for
    an object of a store).

    Raises:
        SegmentCorrupt: no known magic, unreadable bytes, or a footer that disagrees with
            ``expected`` (naming ``where``).
    """
    return sniff_format(stream, where=where).open_reader(stream, expected, where=where)


def _load_builtins() -> None:
    if "parquet" not in _FACTORIES:
        from formats.arrow_ipc import ArrowIpcFormat
        from formats.parquet import ParquetFormat

        register_format("parquet", ParquetFormat)
        register_format("arrow", ArrowIpcFormat)


def use_memory_pool(name: str) -> None:
    """Make ``name`` (``system``, ``mimalloc``, ``jemalloc``) Arrow's default allocator.

    Process-wide: every later Arrow allocation made through pyarrow (arrays, builders, IPC
    writers and readers) uses it. The Parquet writer's page and compression buffers do not:
    they come from Arrow's C++ default pool, which only the ``ARROW_DEFAULT_MEMORY_POOL``
    environment variable chooses, before pyarrow is loaded (``egress.allocators``).

    Raises:
        ConfigError: the allocator is not built into this pyarrow.
    """
    import pyarrow as pa

    factories = {"system": pa.system_memory_pool, "mimalloc": pa.mimalloc_memory_pool,
                 "jemalloc": pa.jemalloc_memory_pool}
    try:
        pa.set_memory_pool(factories[name]())
    except (KeyError, NotImplementedError) as e:
        raise ConfigError("egress.memory_pool",
                          f"Arrow allocator {name!r} is not available: {e}") from e
