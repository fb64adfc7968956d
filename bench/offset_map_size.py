"""Size of the offset map (docs/failover.md) per million replicated records.

    python bench/offset_map_size.py [--records 1000000]

Encodes the entries ingress would write (``replicator.core.offset_map``: the real key and
value encoders) for batches of several sizes (``ingress.batch_size`` caps them; a trickle
makes smaller ones) over three kinds of source: contiguous offsets, a transactional source
(a marker after every 500 records) and a compacted one (a hole between most records).
Prints entries and bytes (key + value, before the topic's compression) per million
records. No broker needed: the sizes are those of the records ingress produces.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replicator.core.offset_map import entries_of, map_key

SOURCES: dict[str, Callable[[int], np.ndarray]] = {
    "contiguous": lambda n: np.arange(n, dtype=np.int64),
    "transactional (marker every 500)": lambda n: np.arange(n, dtype=np.int64)
    + np.arange(n, dtype=np.int64) // 500,
    "compacted (hole after 2 of 3)": lambda n: np.arange(n, dtype=np.int64) * 3 // 2,
}


def size(offsets: np.ndarray, batch: int) -> tuple[int, int]:
    """Entries and bytes for ``offsets`` replayed in batches of ``batch`` records."""
    entries = total = 0
    dest = 0
    for i in range(0, len(offsets), batch):
        chunk = offsets[i:i + batch]
        for e in entries_of(chunk, dest):
            key = map_key("us-east-1", "sensor.events", 17, "sensor.events", e.src_first)
            total += len(key.encode()) + len(e.encode())
            entries += 1
        dest += len(chunk) + 1
    return entries, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.records
    scale = 1_000_000 / n
    print(f"offset map per million records ({n:,} records encoded)")
    print(f"  {'source':34} {'batch':>7} {'entries/M':>10} {'bytes/M':>12}")
    for name, make in SOURCES.items():
        offsets = make(n)
        for batch in (100, 1_000, 10_000):
            entries, total = size(offsets, batch)
            print(f"  {name:34} {batch:>7,} {entries * scale:>10,.0f} {total * scale:>12,.0f}")


if __name__ == "__main__":
    main()
