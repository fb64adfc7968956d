"""deploy/k8s/one-way: replication in one direction only. The source region runs egress and
compaction, the destination region ingress and the consumer-group sync; each is the
two-way overlay of its region with the other side's objects deleted and its own
config.toml. The files are checked without kustomize; the render (kustomize or kubectl,
skipped when neither is installed) is checked too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicator.core.settings import Settings, load_settings
from tests.unit.test_deploy_manifests import (
    GROUPS_SYNC,
    K8S,
    KAFKA_SECRETS,
    _base_docs,
    _by_kind,
    _kafka_env_secrets,
    _overlay_settings,
    _pod_spec,
    _render,
    _rendered_config,
    _workloads,
    yaml,
)

ONE_WAY = K8S / "one-way"
SOURCE = ONE_WAY / "us-east-1"
DESTINATION = ONE_WAY / "us-west-1"
KINDS = ("Deployment", "CronJob", "PodDisruptionBudget", "ServiceAccount")
# What each side keeps of the base (the namespace, ConfigMap and NetworkPolicy besides).
KEEPS: dict[Path, dict[str, set[str]]] = {
    SOURCE: {"Deployment": {"replicator-egress"}, "CronJob": {"replicator-compaction"},
             "PodDisruptionBudget": {"replicator-egress"},
             "ServiceAccount": {"replicator-egress", "replicator-compaction"}},
    # The sync reads what ingress reads in the bucket: it runs under ingress's account.
    DESTINATION: {"Deployment": {"replicator-ingress", GROUPS_SYNC}, "CronJob": set(),
                  "PodDisruptionBudget": {"replicator-ingress"},
                  "ServiceAccount": {"replicator-ingress"}},
}
SIDES = pytest.mark.parametrize("side", [SOURCE, DESTINATION],
                                ids=["source", "destination"])


def _settings(side: Path) -> Settings:
    return load_settings(side / "config.toml", environ={})


def _kustomization(side: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((side / "kustomization.yaml").read_text())
    return doc


def test_one_source_and_one_destination() -> None:
    assert sorted(p for p in ONE_WAY.iterdir() if p.is_dir()) == [SOURCE, DESTINATION]


def test_the_source_exports_and_compacts_the_destination_imports() -> None:
    src, dst = _settings(SOURCE), _settings(DESTINATION)
    assert (src.region, dst.region) == (SOURCE.name, DESTINATION.name)
    assert src.egress is not None and src.compaction is not None and src.ingress is None
    assert dst.ingress is not None and dst.egress is None and dst.compaction is None
    assert dst.ingress.sources
    for s in dst.ingress.sources:
        assert s.region == src.region and s.topic in src.egress.topics, s
        assert s.destination not in src.egress.topics
    assert set(src.compaction.topics) <= set(src.egress.topics)
    assert src.s3.sse is not None and dst.s3.sse is not None


@SIDES
def test_each_side_keeps_the_two_way_settings_of_its_region(side: Path) -> None:
    """Only sections are left out: the bucket, cluster, metrics and each kept section are
    those of the region's two-way overlay (one place to change a broker or a key ARN is
    not promised, two files that agree are)."""
    one, two = _settings(side), _overlay_settings(K8S / "overlays" / side.name)
    assert (one.s3, one.kafka, one.metrics, one.log) == (two.s3, two.kafka, two.metrics,
                                                        two.log)
    for section in ("egress", "ingress", "compaction"):
        if getattr(one, section) is not None:
            assert getattr(one, section) == getattr(two, section), section


@SIDES
def test_each_side_deletes_exactly_the_other_sides_objects(side: Path) -> None:
    kust = _kustomization(side)
    parent = K8S / "overlays" / side.name
    assert kust["resources"] == [f"../../overlays/{side.name}"]
    assert (side / kust["resources"][0]).resolve() == parent.resolve()
    # The config replaces the overlay's generated ConfigMap (same name, so the workloads
    # mount this file).
    (gen,) = kust["configMapGenerator"]
    assert gen == {"name": "replicator-config", "behavior": "replace",
                   "files": ["config.toml"]}
    assert [g["name"] for g in _kustomization(parent)["configMapGenerator"]] == [gen["name"]]
    deleted = set()
    for p in kust["patches"]:
        doc = yaml.safe_load(p["patch"])
        assert doc["$patch"] == "delete"
        deleted.add((doc["kind"], doc["metadata"]["name"]))
    base = _base_docs()
    names = {(d["kind"], d["metadata"]["name"]): d for d in base}
    assert deleted <= set(names), deleted - set(names)
    kept = set(names) - deleted
    for kind in KINDS:
        assert {n for k, n in kept if k == kind} == KEEPS[side][kind], kind
    for d in _workloads([names[k] for k in kept]):
        assert _pod_spec(d)["serviceAccountName"] in KEEPS[side]["ServiceAccount"]


def test_the_source_cronjob_schedule_is_its_config_schedule() -> None:
    """The two-way overlay's schedule patch stays: it must equal this config's."""
    compaction = _settings(SOURCE).compaction
    assert compaction is not None
    patches = _kustomization(K8S / "overlays" / SOURCE.name)["patches"]
    (p,) = [p for p in patches if p["target"].get("kind") == "CronJob"]
    (op,) = yaml.safe_load(p["patch"])
    assert op["path"] == "/spec/schedule" and op["value"] == compaction.schedule


@SIDES
def test_each_side_renders_its_workloads_only(side: Path) -> None:
    docs = _render(side)
    for kind in KINDS:
        assert set(_by_kind(docs, kind)) == KEEPS[side][kind], kind
    assert _rendered_config(docs) == _settings(side)
    sas = _by_kind(docs, "ServiceAccount")
    for w in _workloads(docs):
        name = w["metadata"]["name"]
        sa = sas[_pod_spec(w)["serviceAccountName"]]
        role = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
        assert f":role/replicator-{side.name}-" in role, (name, role)
        (c,) = _pod_spec(w)["containers"]
        wanted = KAFKA_SECRETS[name]
        assert set(_kafka_env_secrets(c).values()) == ({wanted} if wanted else set()), name
    if side == SOURCE:
        cron = _by_kind(docs, "CronJob")["replicator-compaction"]
        compaction = _settings(side).compaction
        assert compaction is not None and cron["spec"]["schedule"] == compaction.schedule
