"""The alert rules of deploy/prometheus evaluated over scrapes of the controllers' own
metrics taken at simulated times: each fires in its scenario and stays silent on a quiet
topic; every rule links to its section of docs/alerts.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from egress.metrics import EgressMetrics
from ingress.metrics import IngressMetrics
from replicator.core.metrics import Metrics
from replicator.ops.groups import ACTIVE, SYNCED, WAITING, GroupMetrics, GroupRow
from tests.promql import History, evaluate_at, scrape

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the alert rules")

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "replicator-alerts.yaml"
T0 = 1_800_000_000.0
MIN = 60.0


def rules() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def rule(name: str) -> str:
    for r in rules():
        if r["alert"] == name:
            return str(r["expr"])
    raise AssertionError(f"no alert {name}")


def firing(name: str, history: History, now: float) -> set[tuple[tuple[str, str], ...]]:
    v = evaluate_at(rule(name), history, now)
    assert isinstance(v, dict)
    return {tuple(sorted(lab)) for lab in v}


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings."""
    out = set()
    for title in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_rule_links_to_its_section_and_every_section_is_a_rule() -> None:
    doc = (ROOT / "docs" / "alerts.md").read_text()
    have = anchors(doc)
    names = set()
    for r in rules():
        annotations = r["annotations"]
        assert isinstance(annotations, dict)
        url = str(annotations.get("runbook_url", ""))
        path, _, anchor = url.partition("#")
        assert path == "docs/alerts.md", f"{r['alert']}: runbook_url {url!r}"
        assert anchor in have, f"{r['alert']}: docs/alerts.md has no section #{anchor}"
        names.add(str(r["alert"]))
    sections = set(re.findall(r"^### (Replicator\w+)$", doc, re.M))
    assert sections == names, (sections ^ names)


class Scrapes:
    """Scrapes of one registry (or several, merged) at simulated times."""

    def __init__(self, *registries: Metrics) -> None:
        self.registries = list(registries)
        self.history: History = []

    def at(self, t: float) -> None:
        merged: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
        for m in self.registries:
            for name, vec in scrape(m.render().decode()).items():
                merged.setdefault(name, {}).update(vec)
        self.history.append((t, merged))


def _part(region: str, topic: str, p: int) -> tuple[tuple[str, str], ...]:
    return (("partition", str(p)), ("region", region), ("topic", topic))


def test_egress_no_progress_fires_for_one_stuck_partition_not_for_the_topic() -> None:
    m = Metrics()
    em = EgressMetrics(m, "us-east-1")
    s = Scrapes(m)
    for i in range(25):                      # a scrape a minute
        t = T0 + i * MIN
        em.lag.labels("us-east-1", "orders", "0").set(500)            # stuck behind
        em.lag.labels("us-east-1", "orders", "1").set(40)             # behind, moving
        em.messages.labels("us-east-1", "orders", "1").inc(100)
        em.lag.labels("us-east-1", "orders", "2").set(0)              # quiet, caught up
        em.messages.labels("us-east-1", "orders", "2").inc(0)
        s.at(t)
    now = T0 + 24 * MIN
    assert firing("ReplicatorEgressNoProgress", s.history, now) == {_part("us-east-1",
                                                                            "orders", 0)}


def test_replication_stalled_fires_from_positions_and_not_on_a_quiet_partition() -> None:
    src, dst = Metrics(), Metrics()
    em = EgressMetrics(src, "us-east-1")
    im = IngressMetrics.create(dst, "us-west-1")
    s = Scrapes(src, dst)
    for i in range(20):
        t = T0 + i * MIN
        for p in (0, 1):                     # the source produces on 0 and 1
            em.messages.labels("us-east-1", "orders", str(p)).inc(1000)
        im.checkpoint_offset.labels("us-east-1", "orders", "0").set(5000)      # stalled
        im.checkpoint_offset.labels("us-east-1", "orders", "1").set(1000 * i)  # follows
        em.messages.labels("us-east-1", "orders", "2").inc(0)                  # quiet
        im.checkpoint_offset.labels("us-east-1", "orders", "2").set(77)
        s.at(t)
    assert firing("ReplicatorReplicationStalled", s.history, T0 + 19 * MIN) == {
        _part("us-east-1", "orders", 0)}


def test_replication_that_never_started_fires_before_any_record() -> None:
    m = Metrics()
    im = IngressMetrics.create(m, "us-west-1")
    im.source_not_started.labels("us-east-1", "orders").set(1)
    im.source_not_started.labels("us-east-1", "payments").set(0)
    s = Scrapes(m)
    s.at(T0)
    assert firing("ReplicatorReplicationNotStarted", s.history, T0) == {
        (("region", "us-east-1"), ("topic", "orders"))}


def test_one_regions_ingress_vanishing_is_seen_on_a_prometheus_of_both_regions() -> None:
    east, west = Metrics(), Metrics()
    IngressMetrics.create(east, "us-east-1")
    IngressMetrics.create(west, "us-west-1")
    both, one = Scrapes(east, west), Scrapes(east)
    for i in range(5):
        both.at(T0 + i * MIN)
    for i in range(5, 30):
        one.at(T0 + i * MIN)
    s = both.history + one.history
    assert not firing("ReplicatorIngressGoneFromRegion", s, T0 + 4 * MIN)
    assert firing("ReplicatorIngressGoneFromRegion", s, T0 + 29 * MIN) == {
        (("home_region", "us-west-1"),)}
    assert not firing("ReplicatorIngressAbsent", s, T0 + 29 * MIN)   # what absent() misses


def _row(group: str, p: int, state: str) -> GroupRow:
    return GroupRow(group=group, region="us-east-1", topic="orders", partition=p,
                    destination_topic="orders", source_committed=10, translated=10,
                    replicated_to=10, destination_committed=10, state=state)


def test_a_group_active_in_both_regions_warns_once_and_is_not_reported_unsynced() -> None:
    m = Metrics()
    gm = GroupMetrics(m)
    gm.observe([_row("billing", 0, ACTIVE), _row("billing", 1, SYNCED),
                _row("audit", 0, WAITING)])
    s = Scrapes(m)
    s.at(T0)
    assert firing("ReplicatorConsumerGroupActiveInBothRegions", s.history, T0) == {
        (("group", "billing"),)}
    assert firing("ReplicatorConsumerGroupsNotSynced", s.history, T0) == {
        (("group", "audit"),)}


def test_mirror_failing_fires_on_failed_or_dropped_copies_not_on_a_quiet_topic() -> None:
    m = Metrics()
    em = EgressMetrics(m, "us-east-1")
    s = Scrapes(m)
    for i in range(20):                      # a scrape a minute, a segment a minute each
        for topic in ("orders", "payments", "clicks", "audit"):
            em.segments.labels("us-east-1", topic, "0", "age").inc()
        em.mirror_failures.labels("us-east-1", "orders").inc()        # every copy fails
        em.mirror_dropped.labels("us-east-1", "payments").inc()       # every copy dropped
        em.mirror_copies.labels("us-east-1", "clicks").inc()          # healthy
        em.mirror_copies.labels("us-east-1", "audit").inc()
        if i == 15:
            em.mirror_failures.labels("us-east-1", "clicks").inc()    # one blip: 1 in 10
        s.at(T0 + i * MIN)
    em.mirror_copies.labels("us-east-1", "quiet").inc(0)              # no segments at all
    assert firing("ReplicatorEgressMirrorFailing", s.history, T0 + 19 * MIN) == {
        (("region", "us-east-1"), ("topic", "orders")),
        (("region", "us-east-1"), ("topic", "payments"))}
