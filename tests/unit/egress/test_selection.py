"""Egress topic selection: explicit tables plus whole-name include/exclude patterns, internal
topics never matched by a pattern (egress.selection; docs/configuration.md, [egress.select]).
"""

from __future__ import annotations

from egress.selection import TopicSelection, select

CLUSTER = ["sensor.a", "sensor.b", "my.sensor.a", "sensorx", "orders", "orders.dlq",
           "__consumer_offsets", "__transaction_state", "_schemas", "replicator.checkpoint",
           "replicator.segmentevents", "other.c"]
OWN = ["replicator.checkpoint", "replicator.segmentevents"]


def test_patterns_match_whole_names() -> None:
    got = select(CLUSTER, [r"sensor\..*", "orders"], [], [], OWN)
    # "orders" selects orders, not orders.dlq; "sensor\..*" not my.sensor.a nor sensorx.
    assert got == {"sensor.a", "sensor.b", "orders"}


def test_exclude_removes_what_include_selects() -> None:
    got = select(CLUSTER, [r"sensor\..*", "orders.*"], [r".*\.dlq", "sensor.b"], [], OWN)
    assert got == {"sensor.a", "orders"}


def test_internal_topics_are_never_selected_by_a_pattern() -> None:
    assert select(CLUSTER, [".*"], [], [], OWN) == {
        "sensor.a", "sensor.b", "my.sensor.a", "sensorx", "orders", "orders.dlq", "other.c"}
    assert select(["__x", "_schemas", "replicator.checkpoint"], ["_.*", "replicator\\..*"],
                  [], [], OWN) == set()


def test_internal_topics_are_selected_when_named_explicitly() -> None:
    got = select(CLUSTER, [".*"], [], ["_schemas", "replicator.checkpoint"], OWN)
    assert {"_schemas", "replicator.checkpoint"} <= got
    assert "__consumer_offsets" not in got


def test_explicit_tables_win_over_exclude_and_need_not_exist_yet() -> None:
    got = select(CLUSTER, [r"sensor\..*"], [r"sensor\.a"], ["sensor.a", "later"], OWN)
    assert got == {"sensor.a", "sensor.b", "later"}


def test_without_include_only_the_explicit_topics() -> None:
    sel = TopicSelection.of([], [".*"], ["orders"], OWN)
    assert not sel.dynamic
    assert sel.select(CLUSTER) == {"orders"}


def test_a_deleted_topic_leaves_the_selection() -> None:
    sel = TopicSelection.of([r"sensor\..*"], [], [], OWN)
    assert sel.dynamic
    assert sel.select(CLUSTER) == {"sensor.a", "sensor.b"}
    assert sel.select([t for t in CLUSTER if t != "sensor.b"]) == {"sensor.a"}
