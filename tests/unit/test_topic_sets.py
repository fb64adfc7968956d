"""Sources named by pattern: the settings, the discovery decision (``discover``), the listing
of a region's topics, and the relay's filter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.selection import TopicSelection
from ingress.discovery import SourceFilter, TopicDiscovery
from ingress.metrics import IngressMetrics
from replicator.cli.common import load_or_exit
from replicator.core.metrics import Metrics
from replicator.core.settings import IngressSourceSettings, load_settings
from replicator.core.storage import MemoryObjectStore
from replicator.core.topic_sets import discover, region_topics
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
    named = [src(region="a", topic="sensor.x", destination_topic="fixed")]
    patterns = [src(region="a", topic_pattern=r"sensor\..*", destination_topic="{topic}.copy"),
                src(region="a", topic_pattern=r".*", destination_topic="all"),
                src(region="b", topic_pattern=r".*", destination_topic="{topic}.copy")]
    d = discover(patterns, {"a": ["sensor.x", "sensor.y", "other", "more"],
                            "b": ["sensor.y"]}, named)
    got = sorted((s.region, s.name, s.destination) for s in d.sources)
    # sensor.x is named; sensor.y by the first pattern; other takes "all" first (sorted
    # order), more is refused; region b may feed the same topic as region a (aggregation).
    assert got == [("a", "more", "all"), ("a", "sensor.y", "sensor.y.copy"),
                   ("b", "sensor.y", "sensor.y.copy")]
    assert [(r.region, r.topic, r.destination) for r in d.refused] == \
        [("a", "other", "all")]
    assert "a/more is replicated into all already" in d.refused[0].reason
    # Found before: nothing new, and a known destination still refuses.
    again = discover(patterns, {"a": ["sensor.x", "sensor.y", "other", "more"]},
                     [*named, *d.sources])
    assert again.sources == [] and [r.topic for r in again.refused] == ["other"]


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
    known = disc.run(store, [])
    assert [x.name for x in known] == ["t1"] and lists == ["data/a/"]
    store.put("data/a/t2/_topic.json", b"")
    now[0] = 10.0                      # within topic_check_interval (30 s): no LIST
    assert disc.run(store, known) == [] and len(lists) == 1
    disc.poke()
    assert disc.run(store, known) == [] and len(lists) == 2   # t2 refused: "all" is t1's
    now[0] = 100.0
    assert disc.run(store, known) == [] and len(lists) == 3
    assert metrics.value("replicator_ingress_sources_refused_total",
                         {"region": "a", "topic": "t2"}) == 1


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
