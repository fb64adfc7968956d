"""Where egress memory comes from besides the records it counts: Arrow's allocator for the
Parquet encoders, and what glibc ``malloc`` keeps after a free.

``egress.max_buffered_bytes`` bounds the bytes egress holds; RSS also holds what the
allocators keep. Three measures bring that close to the bytes held
(``bench/egress_memory.py``; bench/RESULTS.md, "Allocators and the flush size"):

* **The Parquet encoders' allocator.** ``pa.set_memory_pool`` (``egress.memory_pool``)
  reaches Arrow arrays and Python-side buffers, but the Parquet writer takes its page and
  compression buffers from Arrow's C++ default pool, which is mimalloc unless the
  ``ARROW_DEFAULT_MEMORY_POOL`` environment variable names another one *before pyarrow is
  loaded*. ``choose_arrow_pool`` sets it (``replicator-egress`` calls it before importing
  the controller); an operator's own value of the variable wins.
* **The encoders' working memory** (pages, compression buffers) is not held by any
  segment; ``arrow_allocated_bytes`` reads it from Arrow's pools and the poll loop charges
  it against the budget.
* **glibc's retention.** By default glibc raises its mmap threshold to the size of every
  large block freed (up to 32 MiB), so the 1-4 MiB column buffers and encoder pages of
  later segments come from its arenas, and what they free stays resident in the arena of
  the thread that freed it: at the RSS peak malloc held 39-111 MiB of free memory beyond
  a 64 MiB budget (1 KiB records). ``limit_malloc_retention`` fixes the threshold (blocks
  from ``MMAP_THRESHOLD`` up are mapped and unmapped, so freeing them returns the memory)
  and the trim threshold. No effect where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
"""Arrow reads its C++ default pool (the Parquet encoders' allocator) from this variable
once, when pyarrow is loaded."""

MMAP_THRESHOLD = 128 * 1024
"""glibc serves blocks from this size up with their own mapping (glibc's initial value,
fixed instead of rising with every large free)."""
TRIM_THRESHOLD = 128 * 1024
"""glibc returns the free top of a heap to the system above this size (glibc's initial
value, fixed instead of rising to twice the mmap threshold, up to 64 MiB)."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_pools: list[object] = []


def choose_arrow_pool(name: str) -> bool:
    """Make ``name`` (``system``, ``mimalloc``, ``jemalloc``) Arrow's C++ default pool, the
    one the Parquet encoders allocate from; only possible before pyarrow is loaded.

    Returns:
        Whether the choice takes effect: ``False`` when pyarrow was already loaded, or
        when ``ARROW_DEFAULT_MEMORY_POOL`` is set already (that value is used).
    """
    if "pyarrow" in sys.modules or ARROW_POOL_ENV in os.environ:
        return False
    os.environ[ARROW_POOL_ENV] = name
    return True


def limit_malloc_retention() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD`` and its trim threshold at
    ``TRIM_THRESHOLD`` for this process.

    An operator's ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` in the environment
    (glibc reads them at start) wins: then nothing is changed.

    Returns:
        Whether both were set (``False`` without glibc ``mallopt``, or when the
        environment sets either).
    """
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path)
        mallopt = libc.mallopt
        # gnu_get_libc_version exists only in glibc: another libc's mallopt (musl has a
        # stub) takes different parameter numbers.
        libc.gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    ok = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and ok
    if not ok:
        log.warning("glibc mallopt refused the mmap/trim thresholds: freed memory may stay "
                    "resident beyond egress.max_buffered_bytes")
    return ok


def prepare_allocators(memory_pool: str, release_freed_memory: bool) -> None:
    """What an egress process does to its allocators at start: ``memory_pool`` becomes
    pyarrow's default pool (``egress.memory_pool``) and, with ``release_freed_memory``
    (``egress.release_freed_memory``), glibc's thresholds are fixed
    (``limit_malloc_retention``), trading about a third more CPU per GB for memory that
    stays close to the budget.
    """
    from formats.registry import use_memory_pool

    use_memory_pool(memory_pool)
    if release_freed_memory:
        limit_malloc_retention()


def arrow_allocated_bytes() -> int:
    """Bytes Arrow's allocators hold for live allocations now, over all of its pools.

    Segments' batches are Python buffers (``egress.columns``) and are counted by the
    segments themselves; what Arrow allocates is mostly the Parquet encoders' pages and
    compression buffers (about a fifth of the row group being encoded), which the
    budget charges through this. All pools, because the encoders use Arrow's C++ default
    pool whether or not ``choose_arrow_pool`` came in time. Process-wide: where egress
    shares its process with other Arrow users (``replicator demo``), their allocations
    count too; egress then closes segments earlier, and it is never paused for them alone
    (``egress.poll_loop``).
    """
    import pyarrow as pa

    if not _pools:
        for factory in (pa.system_memory_pool, pa.mimalloc_memory_pool,
                        pa.jemalloc_memory_pool):
            try:
                pool = factory()
            except NotImplementedError:
                continue  # not built into this pyarrow: nothing can be allocated from it
            _pools.append(pool)
    return sum(p.bytes_allocated() for p in _pools)  # type: ignore[attr-defined]
