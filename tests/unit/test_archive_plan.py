"""Which segments a table lists (``replicator.archive.plan``) and table names
(``replicator.archive.naming``): pure logic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.archive.naming import TableIdentity, sanitize, table_identifier
from replicator.archive.plan import Piece, claims, plan_table, split_at, visible
from replicator.core.errors import ConfigError
from replicator.core.keys import SegmentKey
from replicator.core.settings import CatalogSettings, load_settings


def k(level: int, start: int, end: int, partition: int = 0) -> SegmentKey:
    return SegmentKey("data", "r1", "t", partition, level, start, end)


def url(key: SegmentKey) -> str:
    return f"s3://b/{key.to_key()}"


def key_of(path: str) -> SegmentKey | None:
    return SegmentKey.try_parse(path.removeprefix("s3://b/"))


def test_an_output_hides_its_inputs_and_equal_ranges_prefer_the_higher_level() -> None:
    inputs = [k(0, 0, 9), k(0, 10, 19)]
    out = k(1, 0, 19)
    assert visible([*inputs, out, k(0, 20, 29)]) == {out, k(0, 20, 29)}
    assert visible([k(0, 0, 9), k(1, 0, 9)]) == {k(1, 0, 9)}
    # Another partition is never hidden.
    assert visible([k(1, 0, 19), k(0, 0, 9, partition=1)]) == {k(1, 0, 19),
                                                               k(0, 0, 9, partition=1)}


def test_plan_adds_what_is_new_and_removes_covered_and_gone_files() -> None:
    table = [url(k(0, 0, 9)), url(k(0, 10, 19)), url(k(0, 30, 39)), "s3://other/x"]
    listed = [k(0, 0, 9), k(0, 10, 19), k(1, 0, 19), k(0, 20, 29)]
    plan = plan_table(table, listed, url=url, key_of=key_of)
    assert plan.add == [k(0, 20, 29), k(1, 0, 19)]
    assert plan.remove_covered == [url(k(0, 0, 9)), url(k(0, 10, 19))]
    assert plan.remove_gone == [url(k(0, 30, 39))]   # a foreign file stays
    # Applied, nothing is left to do (idempotent).
    after = [url(x) for x in visible(listed)] + ["s3://other/x"]
    assert plan_table(after, listed, url=url, key_of=key_of).empty


def test_deleting_and_unaddable_segments_never_enter_and_never_hide() -> None:
    listed = [k(0, 0, 9), k(0, 10, 19), k(1, 0, 19)]
    # The output is not Parquet: the inputs stay listed while they exist.
    plan = plan_table([], listed, url=url, key_of=key_of, unaddable=[k(1, 0, 19)])
    assert plan.add == [k(0, 0, 9), k(0, 10, 19)]
    # Inputs about to be deleted leave the table even so.
    plan = plan_table([url(k(0, 0, 9)), url(k(0, 10, 19))], listed, url=url, key_of=key_of,
                      deleting=[k(0, 0, 9), k(0, 10, 19)])
    assert plan.add == [k(1, 0, 19)] and plan.trim == []
    assert plan.remove_covered == [url(k(0, 0, 9)), url(k(0, 10, 19))]
    # An output over an input the table never listed holds listed and new positions: it
    # is split there (the first part swapped in, the second appended), and the two
    # copies are its listing from then on.
    plan = plan_table([url(k(0, 0, 9))], listed, url=url, key_of=key_of,
                      deleting=[k(0, 0, 9), k(0, 10, 19)])
    out = k(1, 0, 19)
    assert plan.add == [] and plan.trim == [Piece(out, 0, 9), Piece(out, 10, 19)]
    assert plan.remove_covered == [url(k(0, 0, 9))]
    copies = {f"s3://b/trimmed/{p.lo}-{p.hi}": p for p in plan.trim}
    assert plan_table(list(copies), [out], url=url, key_of=key_of,
                      trim_of=copies.get).empty


def test_split_at_cuts_where_held_positions_begin_and_end() -> None:
    a = k(0, 0, 20)
    held = [(0, 4, a), (5, 7, a), (12, 30, a)]
    assert split_at(Piece(a, 2, 15), held) == [Piece(a, 2, 7), Piece(a, 8, 11),
                                               Piece(a, 12, 15)]
    assert split_at(Piece(a, 8, 11), held) == [Piece(a, 8, 11)]
    assert split_at(Piece(a, 13, 14), held) == [Piece(a, 13, 14)]
    assert split_at(Piece.of(a), []) == [Piece.of(a)]


ranges = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 10),
                            st.integers(0, 1)), max_size=25)


@settings(max_examples=200, deadline=None)
@given(ranges)
def test_visible_keys_hold_every_listed_position_once_unless_segments_partly_overlap(
        specs: list[tuple[int, int, int, int]]) -> None:
    keys = {k(level, s, s + n, p) for level, s, n, p in specs}
    vis = visible(keys)
    for key in keys:   # every position of every key is in a visible key
        for pos in (key.start, key.end):
            assert any(v.partition == key.partition and v.start <= pos <= v.end for v in vis)
    for a in vis:      # no visible key covers another
        assert not any(b != a and b.partition == a.partition and b.covers(a) for b in vis)
    assert visible(vis) == vis


def test_table_names_are_sanitized_and_the_template_is_checked() -> None:
    cfg = CatalogSettings()
    ident = TableIdentity("us-east-1", "Sensor.Events-v2")
    assert table_identifier(cfg, ident) == ("replicator", "us_east_1", "sensor_events_v2")
    cfg = CatalogSettings(namespace="lake", table_name="{region}_{topic}_{incarnation}")
    assert table_identifier(cfg, TableIdentity("r1", "t", "AbC")) == ("lake", "r1_t_abc")
    assert sanitize("9lives") == "_9lives"
    base = {"region": "r1", "s3": {"bucket": "b"}, "kafka": {"brokers": "x:1"}}
    with pytest.raises(ConfigError, match=r"catalog\.table_name"):
        load_settings(data={**base, "catalog": {"table_name": "{region}"}}, environ={})
    with pytest.raises(ConfigError, match=r"catalog\.table_name"):
        load_settings(data={**base, "catalog": {"table_name": "{x}.{topic}"}}, environ={})
    with pytest.raises(ConfigError, match=r"catalog\.namespace"):
        load_settings(data={**base, "catalog": {"namespace": "A-b"}}, environ={})
    assert not load_settings(data=base, environ={}).catalog.enabled


@settings(max_examples=300, deadline=None)
@given(ranges, st.data())
def test_claims_hold_every_position_of_every_key_exactly_once(
        specs: list[tuple[int, int, int, int]], data: st.DataObject) -> None:
    keys = sorted({k(level, s, s + n, p) for level, s, n, p in specs})
    prefer = data.draw(st.sets(st.sampled_from(keys)) if keys else st.just(set()))
    pieces = claims(keys, prefer)
    for p in pieces:
        assert p.key in keys and p.key.start <= p.lo <= p.hi <= p.key.end
    for part in {key.partition for key in keys}:
        want = sorted({o for key in keys if key.partition == part
                       for o in range(key.start, key.end + 1)})
        got = sorted(o for p in pieces if p.key.partition == part
                     for o in range(p.lo, p.hi + 1))
        assert got == want   # every position once
    # Segments that merely cover one another are listed as before: the visible ones, whole.
    if all(a == b or not (a.partition == b.partition and a.start <= b.end
                          and b.start <= a.end) or a.covers(b) or b.covers(a)
           for a in keys for b in keys):
        assert pieces == {Piece.of(v) for v in visible(keys)}
    # Without a listing to keep, a trimmed copy is never of the widest segment.
    for p in claims(keys) if prefer else pieces:
        if not p.whole:
            assert any(o.partition == p.key.partition and o.span >= p.key.span
                       and o != p.key for o in keys)


def test_overlapping_rewrites_are_listed_once_and_late_segments_are_the_ones_trimmed() -> None:
    a, b, c = k(0, 0, 99), k(0, 50, 149), k(0, 150, 199)
    plan = plan_table([], [a, b, c], url=url, key_of=key_of)
    assert plan.add == [a, c] and plan.trim == [Piece(b, 100, 149)]
    # b listed first, a arrives late: a is trimmed (an append), b stays whole.
    plan = plan_table([url(b)], [a, b], url=url, key_of=key_of)
    assert plan.add == [] and plan.trim == [Piece(a, 0, 49)] and not plan.remove
    # A trimmed copy stays while its piece is wanted, and leaves when an output covers it.
    trims = {"w/trim-b": Piece(b, 100, 149)}
    table = [url(a), "w/trim-b", url(c)]
    assert plan_table(table, [a, b, c], url=url, key_of=key_of, trim_of=trims.get).empty
    out = k(1, 0, 199)
    plan = plan_table(table, [a, b, c, out], url=url, key_of=key_of, trim_of=trims.get,
                      deleting=[a, b, c])
    assert plan.add == [out] and plan.trim == []
    assert plan.remove_covered == sorted([url(a), "w/trim-b", url(c)])
    # Its segment left the bucket otherwise: the copy is gone too.
    plan = plan_table(table, [a, c], url=url, key_of=key_of, trim_of=trims.get)
    assert plan.remove_gone == ["w/trim-b"] and plan.add == [] and plan.trim == []
