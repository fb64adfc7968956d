"""Sources named by pattern: the settings, the discovery decision (``discover``), the listing
of a region's topics, and the relay's filter."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from egress.selection import TopicSelection
from ingress.discovery import Changes, SourceFilter, TopicDiscovery
from ingress.metrics import IngressMetrics
from replicator.cli.common import load_or_exit
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSettings, IngressSourceSettings, load_settings
from replicator.core.storage import MemoryObjectStore
from replicator.core.topic_sets import discover, region_topics
from tests.unit.test_ingress_controller import make, meta
from tests.unit.test_settings import errors_of, with_


def ingress(*sources: dict[str, Any]) -> dict[str, Any]:
    return with_(ingress={"sqs_queue": "q", "sources": list(sources)})


def src(**kw: Any) -> IngressSourceSettings:
    return IngressSourceSettings.model_validate(kw)


def test_topic_and_topic_pattern_are_exclusive_and_one_is_required() -> None:
    errs = errors_of(ingress({"region": "a", "topic": "t", "topic_pattern": "t.*"},
                             {"region": "a"}))
    assert set(errs) == {"ingress.sources.0", "ingress.sources.1"}
    assert "exactly one of topic and topic_pattern" in errs["ingress.sources.0"]


def test_bad_patterns_and_templates_name_their_key() -> None:
    errs = errors_of(ingress({"region": "a", "topic_pattern": "sensor.(*"},
                             {"region": "a", "topic_pattern": "x", "destination_topic":
                              "{topic}.{cluster}"},
                             {"region": "a", "topic_pattern": "y", "destination_topic":
                              "{topic}/copy"},
                             {"region": "a", "topic_pattern": "z", "destination_topic":
                              "{topic"}))
    assert set(errs) == {"ingress.sources.0.topic_pattern",
                         "ingress.sources.1.destination_topic",
                         "ingress.sources.2.destination_topic",
                         "ingress.sources.3.destination_topic"}
    assert "not a regular expression" in errs["ingress.sources.0.topic_pattern"]
    assert "cluster" in errs["ingress.sources.1.destination_topic"]


def test_templates_fill_in_topic_and_region() -> None:
    s = load_settings(data=ingress(
        {"region": "eu-1", "topic": "orders", "destination_topic": "{region}.{topic}"},
        {"region": "eu-1", "topic_pattern": r"sensor\..*", "destination_topic": "{topic}.copy"},
        {"region": "eu-2", "topic": "orders"}), environ={})
    assert s.ingress is not None
    named, pattern, plain = s.ingress.sources
    assert (named.name, named.destination) == ("orders", "eu-1.orders")
    assert plain.destination == "orders"
    assert pattern.destination_for("sensor.b") == "sensor.b.copy"
    assert pattern.matches("sensor.b") and not pattern.matches("my.sensor.b")
    assert not pattern.matches("sensor")    # whole names only
    found = pattern.for_topic("sensor.b")
    assert (found.name, found.destination, found.topic_pattern) == \
        ("sensor.b", "sensor.b.copy", None)
    assert found.lost_segment_timeout == pattern.lost_segment_timeout


def test_discover_named_first_then_the_first_pattern_and_refuses_shared_destinations() -> None:
    named = [src(region="a", topic="sensor.x", destination_topic="fixed"),
             src(region="a", topic="orders", destination_topic="orders.copy")]
    patterns = [src(region="a", topic_pattern=r"sensor\..*", destination_topic="{topic}.copy"),
                src(region="a", topic_pattern=r"ord.*", destination_topic="orders.copy"),
                src(region="a", topic_pattern=r".*", destination_topic="all"),
                src(region="b", topic_pattern=r".*", destination_topic="{topic}.copy")]
    d = discover(patterns, {"a": ["sensor.x", "sensor.y", "other", "more", "ord"],
                            "b": ["sensor.y"]}, named)
    got = sorted((s.region, s.name, s.destination) for s in d.sources)
    # sensor.x is named; sensor.y by the first pattern; region b may feed the same topic as
    # region a (aggregation). other and more both match into "all": both refused, whichever
    # was found first; ord's destination is fed by a named source of its region: refused.
    assert got == [("a", "sensor.y", "sensor.y.copy"), ("b", "sensor.y", "sensor.y.copy")]
    assert [(r.region, r.topic, r.destination) for r in d.refused] == \
        [("a", "more", "all"), ("a", "ord", "orders.copy"), ("a", "other", "all")]
    assert "a/more, a/other all match a topic_pattern into all" in d.refused[0].reason
    assert "a/orders (an entry with topic) is replicated into orders.copy" in \
        d.refused[1].reason
    many = discover(patterns, {"a": [f"t{i}" for i in range(8)]}, named)
    assert "a/t0, a/t1, a/t2, a/t3, a/t4 and 3 more all match" in many.refused[7].reason
    # One of them alone is replicated; the decision needs nothing but the names.
    alone = discover(patterns, {"a": ["more"]}, named)
    assert [(s.name, s.destination) for s in alone.sources] == [("more", "all")]


def test_a_destination_that_is_no_topic_name_is_refused() -> None:
    p = src(region="a", topic_pattern=r".*", destination_topic="{topic}.copy")
    d = discover([p], {"a": ["x" * 245]}, [])
    assert d.sources == [] and d.refused[0].destination is None


def test_region_topics_are_the_folders_under_the_region() -> None:
    store = MemoryObjectStore()
    for k in ["data/a/t1/_topic.json", "data/a/t2/0/0/00000000000000000000-00000000000000000009",
              "data/a/_compaction.lock", "data/b/t3/_topic.json", "other/a/t4/_topic.json"]:
        store.put(k, b"")
    store.put("data/a/_orders/_topic.json", b"")   # a topic whose name starts with _
    assert region_topics(store, "data", "a") == ["_orders", "t1", "t2"]
    assert region_topics(store, "data", "c") == []


def test_the_relay_filter_follows_patterns_and_named_sources() -> None:
    f = SourceFilter([src(region="a", topic="t"), src(region="a", topic_pattern=r"s\..*"),
                      src(region="b", topic_pattern="z")])
    assert ("a", "t") in f and ("a", "s.new") in f and ("b", "z") in f
    assert ("a", "x") not in f and ("b", "s.new") not in f and ("b", "zz") not in f
    assert "a" not in f


def test_discovery_lists_once_per_interval_unless_poked_and_reports_a_refusal_once() -> None:
    s = load_settings(data=ingress(
        {"region": "a", "topic_pattern": r".*", "destination_topic": "all"}), environ={})
    assert s.ingress is not None
    now = [0.0]
    metrics = Metrics()
    disc = TopicDiscovery(s.ingress, "data", IngressMetrics.create(metrics), lambda: now[0])
    store = MemoryObjectStore()
    lists: list[str] = []
    real = store.list_folders

    def counted(prefix: str) -> list[str]:
        lists.append(prefix)
        return real(prefix)

    store.list_folders = counted  # type: ignore[method-assign]
    store.put("data/a/t1/_topic.json", b"")
    first = disc.run(store)
    assert [x.name for x in first.added] == ["t1"] and lists == ["data/a/"]
    store.put("data/a/t2/_topic.json", b"")
    now[0] = 10.0                      # within topic_check_interval (30 s): no LIST
    assert disc.run(store) == Changes() and len(lists) == 1
    assert disc.wants("a", "t2")
    disc.poke()
    # t1 and t2 into "all": both refused, and t1, replicated until now, is withdrawn.
    assert disc.run(store) == Changes(withdrawn=[("a", "t1")]) and len(lists) == 2
    assert not disc.wants("a", "t2")   # its events no longer ask for a LIST each
    now[0] = 100.0
    assert disc.run(store) == Changes() and len(lists) == 3
    for t in ("t1", "t2"):
        assert metrics.value("replicator_ingress_sources_refused_total",
                             {"region": "a", "topic": t}) == 1


def test_two_named_sources_of_one_region_into_one_destination_exit_2_naming_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    errs = errors_of(ingress({"region": "a", "topic": "orders", "destination_topic": "all"},
                             {"region": "b", "topic": "orders", "destination_topic": "all"},
                             {"region": "a", "topic": "all"}))
    msg = errs["ingress.sources"]
    assert "ingress.sources.0 (a/orders)" in msg and "ingress.sources.2 (a/all)" in msg
    assert "destination topic 'all'" in msg and "b/orders" not in msg
    # Several regions into one topic (fan-in) stays allowed.
    load_settings(data=ingress({"region": "a", "topic": "orders", "destination_topic": "all"},
                               {"region": "b", "topic": "orders", "destination_topic": "all"}),
                  environ={})
    path = tmp_path / "r.toml"
    path.write_text('region = "w"\n[s3]\nbucket = "b"\n[kafka]\nbrokers = "x:1"\n'
                    '[ingress]\nsqs_queue = "q"\n'
                    '[[ingress.sources]]\nregion = "a"\ntopic = "x"\ndestination_topic = "d"\n'
                    '[[ingress.sources]]\nregion = "a"\ntopic = "y"\ndestination_topic = "d"\n')
    with pytest.raises(SystemExit) as exc:
        load_or_exit(path, "ingress")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "ingress.sources" in err and "a/x" in err and "a/y" in err


NAMES = st.text(alphabet="abz._-", min_size=1, max_size=6).filter(lambda t: t not in (".", ".."))
"""Kafka topic names, short and often starting with _ or __."""


@given(st.lists(st.one_of(NAMES, st.sampled_from(
    ["_orders", "__consumer_offsets", "_schemas", "replicator.checkpoint",
     "replicator.segmentevents", "replicator.offsetmap", "_confluent-metrics"])),
    unique=True, max_size=12))
def test_ingress_patterns_find_exactly_what_egress_patterns_select(names: list[str]) -> None:
    """One rule for both sides: a topic egress's `.*` archives is one ingress's `.*` finds
    (a topic named with _ was archived and then never found)."""
    egress = TopicSelection.of([".*"], [], [])
    ingress_ = src(region="a", topic_pattern=".*", destination_topic="{topic}.copy")
    store = MemoryObjectStore()
    for t in egress.select(names):
        store.put(f"data/a/{t}/_topic.json", b"")
    found = discover([ingress_], {"a": region_topics(store, "data", "a")}, [])
    assert {s.name for s in found.sources} == egress.select(names)
    # A topic egress selects only when a table names it (in the bucket all the same) is
    # found only by a named ingress source too.
    everything = discover([ingress_], {"a": names}, [])
    assert {s.name for s in everything.sources} == egress.select(names)


def test_internal_topics_are_found_only_by_a_named_source() -> None:
    p = src(region="a", topic_pattern=".*", destination_topic="{topic}.copy")
    names = ["_orders", "__consumer_offsets", "_schemas", "replicator.checkpoint", "orders"]
    d = discover([p], {"a": names}, [])
    assert sorted(s.name for s in d.sources) == ["_orders", "orders"]
    assert d.refused == []
    f = SourceFilter([p])
    assert ("a", "_orders") in f and ("a", "__consumer_offsets") not in f


# --- the decision is the same whatever the order of discovery (property-based) -----------

REGIONS = ["a", "b"]
TOPIC_NAMES = ["s.1", "s.2", "s.x", "all", "b", "m", "z", "_u", "__c", "_schemas"]
PATTERN = st.tuples(st.sampled_from(REGIONS),
                    st.sampled_from([".*", r"s\..*", "[a-m].*", "_.*", "s.1|z"]),
                    st.sampled_from(["{topic}", "all", "{region}.all", "{topic}.c", "s.1"]))
NAMED = st.tuples(st.sampled_from(REGIONS), st.sampled_from(TOPIC_NAMES),
                  st.sampled_from(["{topic}", "all", "s.1.c"]))


@st.composite
def configs(draw: st.DrawFn) -> IngressSettings:
    """Pattern entries whose destinations often collide, and a few named entries (valid
    settings: no two named topics of one region into one destination)."""
    patterns = draw(st.lists(PATTERN, min_size=1, max_size=4,
                             unique_by=lambda p: (p[0], p[1])))
    named = draw(st.lists(NAMED, max_size=2, unique_by=lambda n: (n[0], n[1])))
    sources = [{"region": r, "topic_pattern": p, "destination_topic": d}
               for r, p, d in patterns]
    sources += [{"region": r, "topic": t, "destination_topic": d} for r, t, d in named]
    try:
        return IngressSettings.model_validate({"sqs_queue": "q", "sources": sources})
    except ValidationError:
        assume(False)
        raise


def split(cfg: IngressSettings) -> tuple[list[IngressSourceSettings],
                                         list[IngressSourceSettings]]:
    return ([s for s in cfg.sources if s.topic_pattern is not None],
            [s for s in cfg.sources if s.topic is not None])


BUCKET = st.lists(st.tuples(st.sampled_from(REGIONS), st.sampled_from(TOPIC_NAMES)),
                  unique=True, max_size=12)


def by_region(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {r: [] for r in REGIONS}
    for r, t in pairs:
        out[r].append(t)
    return out


@given(configs(), BUCKET, st.randoms(use_true_random=False))
def test_discover_depends_on_the_set_of_names_only(cfg: IngressSettings,
                                                   topics: list[tuple[str, str]],
                                                   rnd: random.Random) -> None:
    patterns, named = split(cfg)
    decided = discover(patterns, by_region(topics), named)
    shuffled = topics + rnd.sample(topics, k=len(topics) // 2)    # duplicates, too
    rnd.shuffle(shuffled)
    assert discover(patterns, by_region(shuffled), named) == decided
    # Never two topics of one region into one destination, named ones included.
    feeds = [(s.region, s.destination) for s in [*named, *decided.sources]]
    assert len(feeds) == len(set(feeds))


@settings(max_examples=150, deadline=None)
@given(configs(), BUCKET, st.lists(st.sampled_from(["appear", "run 0", "run 1", "restart 1"]),
                                   max_size=40))
def test_two_instances_agree_whatever_the_order_topics_appear_and_are_found_in(
        cfg: IngressSettings, order: list[tuple[str, str]], steps: list[str]) -> None:
    """Topics appear in the bucket one by one (in a random order) while two instances list
    it at random moments, one of them restarting: at every moment at most one topic of a
    region has ever been replicated into a destination, by any instance; at the end both
    decide what a fresh instance decides."""
    store = MemoryObjectStore()
    pending = list(order)
    instances = [TopicDiscovery(cfg, "data", IngressMetrics.create(Metrics()))
                 for _ in range(2)]
    running: list[dict[tuple[str, str], str]] = [{}, {}]
    patterns, named = split(cfg)
    ever: dict[tuple[str, str], set[str]] = {}
    for s in named:
        ever.setdefault((s.region, s.destination), set()).add(s.name)

    def run(i: int) -> None:
        instances[i].poke()
        changes = instances[i].run(store)
        for key in changes.withdrawn:
            del running[i][key]
        for s in changes.added:
            running[i][(s.region, s.name)] = s.destination
            ever.setdefault((s.region, s.destination), set()).add(s.name)
        assert {k: s.destination for k, s in instances[i].active.items()} == running[i]

    for step in [*steps, *["appear"] * len(order), "run 0", "run 1"]:
        if step == "appear" and pending:
            region, topic = pending.pop(0)
            store.put(f"data/{region}/{topic}/_topic.json", b"{}")
        elif step.startswith("run"):
            run(int(step[-1]))
        elif step == "restart 1":
            instances[1] = TopicDiscovery(cfg, "data", IngressMetrics.create(Metrics()))
            running[1] = {}
        assert all(len(topics) <= 1 for topics in ever.values()), ever
    fresh = discover(patterns, by_region(order), named)
    want = {(s.region, s.name): s.destination for s in fresh.sources}
    assert running[0] == running[1] == want


def test_a_running_source_stops_when_a_second_topic_of_its_region_matches_its_destination(
        ) -> None:
    """Two ingress instances on one bucket: the one that found ``b`` alone replays it; once
    ``a`` appears with the same destination, it stops ``b``'s workers, and an instance
    started since replays neither (before, it replayed ``a``, the first name it listed,
    into the partitions the other filled with ``b``)."""
    sources = [{"region": "us-east-1", "topic_pattern": ".*", "destination_topic": "all"}]
    one, store, admin = make(sources)
    two = None
    try:
        meta(store, "us-east-1", "b", 2)
        one._check_topics()
        one.assigned = {("all", 0), ("all", 1)}
        one._reconcile()
        assert sorted(one.workers) == [("us-east-1", "b", 0), ("us-east-1", "b", 1)]
        meta(store, "us-east-1", "a", 2)
        two, _, _ = make(sources)
        two.store, two.admin = store, admin
        two._check_topics()
        assert ("us-east-1", "a") not in two.sources and ("us-east-1", "b") not in two.sources
        one.discovery.poke()     # as a segment event of a does, or the next interval
        one._check_topics()
        assert ("us-east-1", "b") not in one.sources and one.workers == {}
        one._reconcile()
        assert one.workers == {}
        assert one.metrics.value("replicator_ingress_sources_refused_total",
                                 {"region": "us-east-1", "topic": "b"}) == 1
    finally:
        one.close()
        if two is not None:
            two.close()
