"""Pure flow-control decisions of the egress: memory victims, memory pressure, pauses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from egress.flow import (
    MAX_CLOSING,
    FlowLimits,
    PartitionLoad,
    memory_pressure,
    paused_partitions,
    pick_memory_victims,
)


def test_no_victims_within_budget() -> None:
    assert pick_memory_victims({"a": 10, "b": 20}, 30) == []
    assert pick_memory_victims({"a": 10}, 30, in_flight=20) == []


def test_victims_largest_first_until_under_budget() -> None:
    held = {"a": 10, "b": 50, "c": 30, "d": 5}
    assert pick_memory_victims(held, 60) == ["b"]           # 95 -> 45
    assert pick_memory_victims(held, 15) == ["b", "c"]      # 95 -> 45 -> 15
    assert pick_memory_victims(held, 9) == ["b", "c", "a"]  # ... -> 5


def test_in_flight_counts_but_cannot_be_picked() -> None:
    assert pick_memory_victims({"a": 10, "b": 20}, 40, in_flight=25) == ["b"]
    # Everything open closed and still above: nothing more to pick.
    assert pick_memory_victims({"a": 10}, 5, in_flight=100) == ["a"]


def test_tiny_segments_are_not_victims() -> None:
    assert pick_memory_victims({"a": 3, "b": 2}, 1, in_flight=1, min_victim_bytes=4) == []
    assert pick_memory_victims({"a": 30, "b": 2}, 1, in_flight=1,
                               min_victim_bytes=4) == ["a"]


@given(st.dictionaries(st.integers(0, 50), st.integers(0, 10_000), max_size=30),
       st.integers(0, 100_000), st.integers(0, 50_000))
def test_victims_property(held: dict[int, int], budget: int, in_flight: int) -> None:
    victims = pick_memory_victims(held, budget, in_flight=in_flight)
    left = sum(held.values()) + in_flight - sum(held[v] for v in victims)
    sizes = [held[v] for v in victims]
    assert sizes == sorted(sizes, reverse=True)
    assert len(set(victims)) == len(victims)
    if sum(held.values()) + in_flight <= budget:
        assert victims == []
    # Either under budget, or every non-empty open segment was picked.
    assert left <= budget or all(v in victims for v, n in held.items() if n > 0)
    # Minimal: without the last victim the budget would still be exceeded.
    if victims:
        assert left + held[victims[-1]] > budget


def test_memory_pressure_hysteresis() -> None:
    assert memory_pressure(101, 100, paused=False)
    assert not memory_pressure(100, 100, paused=False)
    assert memory_pressure(90, 100, paused=True)      # stays paused above 80 %
    assert not memory_pressure(80, 100, paused=True)


# --- segment starts ----------------------------------------------------------------------


def test_small_segments_are_closed_when_nothing_else_frees_memory() -> None:
    # 64 partitions of 1 MiB each over a 32 MiB budget, nothing closing: without picking
    # below min_victim_bytes a process paused for memory would wait forever.
    held = {p: 1024**2 for p in range(64)}
    victims = pick_memory_victims(held, 32 * 1024**2, min_victim_bytes=2 * 1024**2)
    assert len(victims) == 32
    # With closes in flight the small ones wait for those to finish.
    assert pick_memory_victims(held, 32 * 1024**2, in_flight=1,
                               min_victim_bytes=2 * 1024**2) == []


def test_limits_for_a_budget() -> None:
    assert FlowLimits.for_budget(256 * 1024**2) == FlowLimits(256 * 1024**2, 64 * 1024**2,
                                                              1024**2)
    # A small budget keeps a 4 MiB backlog floor and a proportional smallest victim.
    assert FlowLimits.for_budget(8 * 1024**2) == FlowLimits(8 * 1024**2, 4 * 1024**2,
                                                            128 * 1024)


def test_pauses_the_partitions_that_fall_behind() -> None:
    limits = FlowLimits(100, 40, 1)
    loads = {"ok": PartitionLoad(MAX_CLOSING - 1, 39, failing=False),
             "closing": PartitionLoad(MAX_CLOSING, 0, failing=False),
             "backlog": PartitionLoad(0, 40, failing=False),
             "failing": PartitionLoad(0, 0, failing=True)}
    assert paused_partitions(loads, limits, memory_paused=False) == {
        "closing", "backlog", "failing"}
    assert paused_partitions(loads, limits, memory_paused=True) == set(loads)
    assert paused_partitions({}, limits, memory_paused=True) == set()
