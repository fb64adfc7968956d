"""The follower's lazy reduction of a key's values gives what reading them all gives."""

from __future__ import annotations

import random

from ingress.checkpoints import latest_from_end, latest_valid


def value(rnd: random.Random, i: int) -> bytes | None:
    pick = rnd.random()
    if pick < 0.15:
        return None                                   # tombstone
    if pick < 0.3:
        return b"not json %d" % i                     # invalid
    return b'{"offset": %d, "segment": "s", "updated_at": "2026-11-21T00:00:00Z"}' % i


def test_latest_from_end_equals_latest_valid_also_when_reduced_in_steps() -> None:
    rnd = random.Random(5)
    for _ in range(300):
        values = [value(rnd, i) for i in range(rnd.randint(0, 12))]
        want = latest_valid("k", values, None)
        got, reduced = latest_from_end("k", values, None)
        assert got == want
        # Reduced at any point, then more values: still the same answer.
        cut = rnd.randint(0, len(values))
        _, head = latest_from_end("k", values[:cut], None)
        assert latest_from_end("k", head + values[cut:], None)[0] == want
        assert len(reduced) <= 1
