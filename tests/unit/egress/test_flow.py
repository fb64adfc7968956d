"""Pure flow-control decisions of the egress: memory victims, memory pressure, pauses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.flow import (
    MAX_CLOSING,
    MAX_FLUSH_BYTES,
    MAX_UNCOUNTED,
    MIN_FLUSH_BYTES,
    MIN_PREFETCH,
    PREFETCH_SHARE,
    QUEUED_MESSAGE_BYTES,
    FlowLimits,
    PartitionLoad,
    Prefetch,
    flush_bytes,
    memory_pressure,
    paused_partitions,
    pick_memory_victims,
    prefetch_overrides,
    segment_budget,
    uncounted_reserve,
)
from replicator.core.kafka import Consumer
from replicator.core.settings import KafkaSettings


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


MiB = 1024**2


def test_prefetch_is_a_share_of_the_budget() -> None:
    p = Prefetch.for_budget(64 * MiB)
    assert (p.queue_bytes, p.fetch_bytes) == (MiB, MiB)
    assert p.queue_messages == MiB // QUEUED_MESSAGE_BYTES
    assert p.client_config() == {"queued.max.messages.kbytes": 1024,
                                 "fetch.max.bytes": MiB,
                                 "queued.min.messages": 4096}
    # The default budget (256 MiB): 8 MiB prefetched instead of librdkafka's 64 MiB queue of
    # up to 100 000 messages plus a 50 MB fetch.
    assert Prefetch.for_budget(256 * MiB).nbytes == 8 * MiB
    # ...and 32 MiB kept for what nothing counts (an eighth, at most 32 MiB).
    assert segment_budget(256 * MiB) == 216 * MiB


def test_the_budget_keeps_a_reserve_for_uncounted_memory() -> None:
    # 64 MiB, many partitions of 30-byte records: RSS grew 1.52-1.56 x the budget while
    # segments held all of B - P; an eighth less for segments made it 1.37-1.39 x.
    assert uncounted_reserve(64 * MiB) == 8 * MiB
    assert segment_budget(64 * MiB) == 64 * MiB - 2 * MiB - 8 * MiB
    # The uncounted costs are fixed, not a share: large budgets keep 32 MiB at most.
    assert uncounted_reserve(4 * 1024 * MiB) == MAX_UNCOUNTED == 32 * MiB
    assert segment_budget(4 * 1024 * MiB) == 4 * 1024 * MiB - 128 * MiB - 32 * MiB


def test_small_budgets_keep_a_working_prefetch() -> None:
    # One 1 MiB partition fetch (max.partition.fetch.bytes) must still fit.
    p = Prefetch.for_budget(4 * MiB)
    assert p.fetch_bytes == MiB and p.queue_bytes == MiB and p.queue_messages >= 1000
    assert segment_budget(4 * MiB) == 2 * MiB      # never less than half the budget


@given(st.integers(min_value=1, max_value=64 * 1024**3))
def test_prefetch_and_segments_stay_within_the_budget(budget: int) -> None:
    p = Prefetch.for_budget(budget)
    assert p.nbytes <= max(budget // PREFETCH_SHARE, MIN_PREFETCH)
    assert p.queue_messages * QUEUED_MESSAGE_BYTES <= max(p.queue_bytes, 1000 * 256)
    if budget >= 2 * MIN_PREFETCH:
        assert segment_budget(budget) + p.nbytes <= budget
    # Segments get what the prefetch and the uncounted reserve leave, at least half.
    segments = segment_budget(budget)
    assert segments >= budget // 2
    if segments > budget // 2:
        assert segments + p.nbytes + uncounted_reserve(budget) == budget


def test_prefetch_settings_in_kafka_config_win() -> None:
    over = prefetch_overrides(64 * MiB, {"fetch.max.bytes": 52428800, "client.id": "x"})
    assert over == {"queued.max.messages.kbytes": 1024, "queued.min.messages": 4096}


@pytest.mark.parametrize("budget", [MiB, 64 * MiB, 256 * MiB, 8 * 1024 * MiB])
def test_librdkafka_accepts_the_derived_settings(budget: int) -> None:
    # Constructing a consumer validates the configuration; no broker is contacted.
    c = Consumer(KafkaSettings(brokers="127.0.0.1:9"), "g",
                 Prefetch.for_budget(budget).client_config())
    c.close()


def test_bytes_no_segment_holds_count_but_do_not_raise_the_victim_floor() -> None:
    # Arrow's allocations are never zero, unlike closes in flight: counted as in flight,
    # they would keep min_victim_bytes on, and 256 segments each below it could never be
    # closed: a process paused for memory for good (seen in bench/egress_memory.py).
    small = {p: 240_000 for p in range(256)}
    budget = 50_000_000
    assert pick_memory_victims(small, budget, in_flight=1, min_victim_bytes=1_000_000) == []
    victims = pick_memory_victims(small, budget, unpickable=1,
                                  min_victim_bytes=1_000_000)
    assert 0 < len(victims) < 256
    assert 240_000 * (256 - len(victims)) + 1 <= budget
    # ... and counted: the same segments need more victims with more bytes outside them.
    assert len(pick_memory_victims(small, budget, unpickable=10_000_000)) > len(victims)


def test_flush_size_is_a_quarter_of_each_partitions_share_of_the_budget() -> None:
    MiB = 1024**2
    assert flush_bytes(256 * MiB, 4) == MAX_FLUSH_BYTES          # few partitions: 4 MiB
    assert flush_bytes(64 * MiB, 64) == 256 * 1024               # 64 MiB / 64 / 4
    assert flush_bytes(1024 * MiB, 1000) == 1024 * MiB // 4000
    assert flush_bytes(64 * MiB, 256) == MIN_FLUSH_BYTES         # floor: 128 KiB
    assert flush_bytes(64 * MiB, 0) == MAX_FLUSH_BYTES


@given(st.integers(1, 2**40), st.integers(0, 100_000))
def test_flush_size_stays_within_its_bounds(budget: int, partitions: int) -> None:
    assert MIN_FLUSH_BYTES <= flush_bytes(budget, partitions) <= MAX_FLUSH_BYTES
