"""What cutting batches to a destination topic's ``max.message.bytes`` costs
(``ingress/limits.py``; ingress/README.md, "Destination limits"). No brokers: the client
calls are the same with and without limits at Kafka's default limit (one ``produce_many``
per batch), so the only cost there is deciding not to cut; at a small limit it is the cut
itself (plus, on a real cluster, one round trip per chunk, not measured here).

    .venv/bin/python bench/destination_limits.py [--records 4000] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from ingress.limits import DestinationLimits
from ingress.rows import Rows

KAFKA_DEFAULT_LIMIT = 1_048_588


def per_call(fn: Callable[[], object], repeat: int) -> float:
    """Median microseconds of one call over 5 rounds of ``repeat`` calls."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        rounds.append((time.perf_counter() - t0) / repeat * 1e6)
    return sorted(rounds)[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=2000)
    a = ap.parse_args()
    rnd = random.Random(7)
    n = a.records
    values: list[bytes | None] = [rnd.randbytes(rnd.randint(10, 300)) for _ in range(n)]
    rows = Rows(list(range(n)), [1] * n, [b"k"] * n, values, [None] * n)
    limits = DestinationLimits()
    limits.update("default", KAFKA_DEFAULT_LIMIT)
    limits.update("small", 100_000)
    raw = sum(len(v or b"") for v in values)
    print(f"batch of {n} records, {raw} value bytes")
    at_default = per_call(lambda: limits.cut("default", rows), a.repeat)
    unknown = per_call(lambda: limits.cut("unknown", rows), a.repeat)
    small = per_call(lambda: limits.cut("small", rows), max(1, a.repeat // 100))
    chunks = len(limits.cut("small", rows))
    print(f"default limit ({KAFKA_DEFAULT_LIMIT}): {at_default:.2f} us per batch (never cut; "
          f"{at_default / n * 1000:.2f} ns per record)")
    print(f"limit not read:          {unknown:.2f} us per batch")
    print(f"limit 100000:            {small:.0f} us per batch, {chunks} chunks "
          f"({small / n * 1000:.0f} ns per record)")


if __name__ == "__main__":
    main()
