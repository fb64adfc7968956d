"""Hand-offs between threads: ``read_ahead``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replicator.core.errors import SegmentCorrupt
from replicator.core.queues import read_ahead


def test_read_ahead_keeps_order_forwards_errors_and_stops_its_producer() -> None:
    assert list(read_ahead(iter(range(100)), 2)) == list(range(100))
    closed: list[bool] = []

    def failing() -> Iterator[int]:
        try:
            yield 1
            raise SegmentCorrupt("boom")
        finally:
            closed.append(True)

    with pytest.raises(SegmentCorrupt, match="boom"):
        list(read_ahead(failing(), 2))
    assert closed == [True]

    produced: list[int] = []

    def endless() -> Iterator[int]:
        try:
            i = 0
            while True:
                produced.append(i)
                yield i
                i += 1
        finally:
            closed.append(True)

    it = read_ahead(endless(), 2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()   # the consumer gives up: the producer stops and closes its iterator
    assert closed == [True, True]
    assert len(produced) <= 3 + 2 + 1   # never more than depth (+1 in hand) ahead
