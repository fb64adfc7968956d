"""Where egress memory comes from: the Parquet encoders' Arrow pool and glibc's retention
(``egress.allocators``). Each check runs in a fresh interpreter: both settings are
process-wide and only take effect before pyarrow loads / before the blocks are allocated.
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap

import pytest

from egress.allocators import ARROW_POOL_ENV, choose_arrow_pool

GLIBC = sys.platform == "linux" and ctypes.util.find_library("c") is not None


def run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != ARROW_POOL_ENV}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True,
                         capture_output=True, text=True, env=env)
    return out.stdout.strip()


ENCODE = """
    import io
    from egress.allocators import choose_arrow_pool
    print(choose_arrow_pool("system"))
    import pyarrow as pa
    from formats.base import SEGMENT_SCHEMA, WriterOptions
    from formats.parquet import ParquetSegmentWriter
    rows = 20000
    batch = pa.RecordBatch.from_pydict({
        "offset": list(range(rows)), "timestamp": [0] * rows, "timestamp_type": [0] * rows,
        "key": [b"k%05d" % i for i in range(rows)], "value": [b"v" * 200] * rows,
        "headers": [[] for _ in range(rows)]}, schema=SEGMENT_SCHEMA)
    before = pa.mimalloc_memory_pool().max_memory()
    w = ParquetSegmentWriter(io.BytesIO(), WriterOptions())
    w.write_batch(batch)
    w._write_group(w._buffer.take())
    print(pa.mimalloc_memory_pool().max_memory() - before)
"""


def test_the_parquet_encoder_allocates_from_the_chosen_pool() -> None:
    # Chosen before pyarrow loads: the encoder's pages come from the system allocator.
    chosen, mimalloc = run(ENCODE).splitlines()
    assert chosen == "True"
    assert int(mimalloc) == 0


def test_without_the_choice_the_encoder_uses_arrows_own_default() -> None:
    # What the choice guards against: pa.set_memory_pool does not reach the encoder.
    code = ENCODE.replace('print(choose_arrow_pool("system"))',
                          'import pyarrow as pa; pa.set_memory_pool(pa.system_memory_pool())'
                          '; print(True)')
    _, mimalloc = run(code).splitlines()
    assert int(mimalloc) > 0


def test_an_operators_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARROW_POOL_ENV, "jemalloc")
    monkeypatch.delitem(sys.modules, "pyarrow", raising=False)
    assert choose_arrow_pool("system") is False
    assert os.environ[ARROW_POOL_ENV] == "jemalloc"


def test_too_late_once_pyarrow_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow  # noqa: F401

    monkeypatch.delenv(ARROW_POOL_ENV, raising=False)
    assert choose_arrow_pool("system") is False
    assert ARROW_POOL_ENV not in os.environ


RETENTION = """
    import ctypes
    from egress.allocators import limit_malloc_retention

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    assert limit_malloc_retention()
    # A freed 4 MiB mapping raises glibc's dynamic threshold to 4 MiB ...
    libc.free(libc.malloc(4 * 1024**2))
    # ... so a later 1 MiB block comes from the heap and stays there after free, unless
    # the threshold is fixed: then it is a mapping of its own, returned on free.
    # (Counted as a change: what the imports before left mapped is not this block.)
    mapped = libc.mallinfo2().hblkhd
    block = libc.malloc(1024**2)
    print(libc.mallinfo2().hblkhd - mapped >= 1024**2)
    libc.free(block)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_freed_large_blocks_go_back_to_the_system() -> None:
    assert run(RETENTION) == "True"


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_without_the_limit_glibc_keeps_them_in_its_heap() -> None:
    code = RETENTION.replace("assert limit_malloc_retention()", "pass")
    assert run(code) == "False"


@pytest.mark.skipif(not GLIBC, reason="glibc only")
@pytest.mark.parametrize("release", [True, False])
def test_egress_release_freed_memory_decides_the_thresholds(release: bool) -> None:
    """``egress.release_freed_memory`` as ``Egress.start`` applies it: true returns freed
    large blocks to the system, false leaves glibc's own (faster) thresholds."""
    code = RETENTION.replace(
        "assert limit_malloc_retention()",
        f"from egress.allocators import prepare_allocators\n"
        f"    prepare_allocators('system', {release})")
    assert run(code) == str(release)


def test_arrow_allocated_bytes_follows_arrow_allocations() -> None:
    import pyarrow as pa

    from egress.allocators import arrow_allocated_bytes

    before = arrow_allocated_bytes()
    held = pa.array(range(1_000_000), pa.int64(), memory_pool=pa.mimalloc_memory_pool())
    assert arrow_allocated_bytes() - before >= 8_000_000
    del held
    assert arrow_allocated_bytes() - before < 8_000_000


def test_replicator_egress_chooses_the_pool_before_pyarrow_loads() -> None:
    out = run("""
        import os, sys
        from replicator.cli.egress import _build
        from replicator.core.settings import load_settings
        settings = load_settings(data={
            "region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "127.0.0.1:1"},
            "egress": {"group_id": "g", "memory_pool": "jemalloc", "topics": {"t": {}}}},
            environ={})
        assert "pyarrow" not in sys.modules
        _build(settings)
        print(os.environ["ARROW_DEFAULT_MEMORY_POOL"], "pyarrow" in sys.modules)
    """)
    assert out == "jemalloc True"


def test_an_operators_malloc_thresholds_win(monkeypatch: pytest.MonkeyPatch) -> None:
    from egress.allocators import limit_malloc_retention

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4194304")
    assert limit_malloc_retention() is False
