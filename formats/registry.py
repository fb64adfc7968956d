"""Formats by name: ``get_format("parquet")``."""

from __future__ import annotations

from collections.abc import Callable

from formats.base import SegmentFormat
from replicator.core.errors import ConfigError

_FACTORIES: dict[str, Callable[[], SegmentFormat]] = {}


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


def _load_builtins() -> None:
    if "parquet" not in _FACTORIES:
        from formats.arrow_ipc import ArrowIpcFormat
        from formats.parquet import ParquetFormat

        register_format("parquet", ParquetFormat)
        register_format("arrow", ArrowIpcFormat)


def use_memory_pool(name: str) -> None:
    """Make ``name`` (``system``, ``mimalloc``, ``jemalloc``) Arrow's default allocator.

    Process-wide: every later Arrow allocation (builders, Parquet/IPC writers and readers)
    uses it.

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
