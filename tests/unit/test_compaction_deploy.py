"""deploy/compaction/: the Spark-on-Kubernetes manifests agree with their config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from replicator.core.cron import parse_cron
from replicator.core.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "deploy" / "compaction"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(kind: str) -> dict[str, Any]:
    found = [d for d in docs(DIR / "spark-on-k8s.yaml") if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def test_config_loads_and_manifests_agree_with_it() -> None:
    settings = load_settings(DIR / "config-spark-on-k8s.toml", environ={})
    cfg = settings.compaction
    assert cfg is not None and cfg.spark_master.startswith("k8s://")
    conf = cfg.spark_conf

    cron = by_kind("CronJob")
    assert cron["spec"]["schedule"] == cfg.schedule
    parse_cron(cron["spec"]["schedule"])
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] < cfg.lock_ttl.total_seconds()
    pod = job["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][-1] == "--once"

    # executors reach the driver through the headless Service, on the configured ports
    svc = by_kind("Service")
    assert conf["spark.driver.host"].startswith(f"{svc['metadata']['name']}.")
    assert conf["spark.kubernetes.namespace"] in conf["spark.driver.host"]
    selector = svc["spec"]["selector"]
    labels = job["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in selector.items())
    ports = {p["containerPort"] for p in container["ports"]}
    assert {int(conf["spark.driver.port"]), int(conf["spark.blockManager.port"])} <= ports

    # the driver's ServiceAccount can manage pods; executors use the base IRSA account
    assert pod["serviceAccountName"] == by_kind("ServiceAccount")["metadata"]["name"]
    role = by_kind("Role")
    assert "pods" in role["rules"][0]["resources"] and "create" in role["rules"][0]["verbs"]
    base_sas = {d["metadata"]["name"]
                for d in docs(ROOT / "deploy" / "k8s" / "base" / "serviceaccounts.yaml")}
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] in base_sas

    # the executor pod template is mounted where the config says
    template = Path(conf["spark.kubernetes.executor.podTemplateFile"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(template.parent) == mounts["spark-templates"]
    kust = docs(DIR / "kustomization.yaml")[0]
    generated = {g["name"]: g["files"] for g in kust["configMapGenerator"]}
    volumes = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert template.name in generated[volumes["spark-templates"]]
    assert "config.toml=config-spark-on-k8s.toml" in generated[volumes["config"]]
    for files in generated.values():
        for f in files:
            assert (DIR / f.split("=")[-1]).is_file()
    assert docs(DIR / "executor-pod-template.yaml")[0]["kind"] == "Pod"
