"""``replicator local up|status|down`` as a user runs them, and the ``LocalStack`` API, on
the default (Tansu) stack; ``test_local_stack_kafka.py`` runs it with Apache Kafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote_plus

import boto3
import psutil
import pytest
from confluent_kafka.admin import AdminClient

from replicator.core.settings import load_settings
from replicator.devstack.configs import (
    DEST_BUCKET,
    DEST_REGION,
    QUEUE,
    SOURCE_BUCKET,
    SOURCE_REGION,
)
from replicator.devstack.stack import LocalStack

REPLICATOR = str(Path(sys.executable).parent / "replicator")

# The default stack stays covered in CI, where KAFKA_HOME selects Apache Kafka elsewhere.
pytestmark = pytest.mark.tansu


def replicator(*args: str, cwd: Path | None = None, timeout: float = 120,
               env_update: dict[str, str | None] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Run ``replicator ARGS`` (``env_update``: variables to set, or to remove with None)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLICATOR_")}
    for k, v in (env_update or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([REPLICATOR, *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                          check=False)


def local(*args: str, cwd: Path | None = None, timeout: float = 120
          ) -> subprocess.CompletedProcess[str]:
    return replicator("local", *args, cwd=cwd, timeout=timeout)


def gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (a zombie waiting for its parent counts as gone)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def session_members(sid: int) -> list[psutil.Process]:
    """Live processes of session ``sid`` (each server runs in its own session)."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return out


@pytest.fixture
def stack_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "stack"
    yield d
    # Whatever the test did, leave nothing running.
    if (d / "state.json").exists():
        local("down", "--dir", str(d))


def s3(endpoint: str, region: str) -> object:
    return boto3.client("s3", endpoint_url=endpoint, region_name=region,
                        aws_access_key_id="test", aws_secret_access_key="test")


def test_up_status_down(stack_dir: Path) -> None:
    r = local("up", "--dir", str(stack_dir))
    assert r.returncode == 0, r.stderr
    # The summary tells what was started and how to stop it.
    for text in ("tansu-source", "tansu-destination", "moto", SOURCE_BUCKET, DEST_BUCKET,
                 QUEUE, "egress.toml", "ingress.toml", "compaction.toml", "local down"):
        assert text in r.stdout
    state = json.loads((stack_dir / "state.json").read_text())
    pids = [s["pid"] for s in state["servers"].values()]
    assert len(set(pids)) == 3
    ep = state["endpoints"]

    # Kafka: both brokers answer, the source topic exists with its partitions.
    md = AdminClient({"bootstrap.servers": ep["source_kafka"]}).list_topics(timeout=10)
    assert len(md.topics["sensor.events"].partitions) == 4
    AdminClient({"bootstrap.servers": ep["destination_kafka"]}).list_topics(timeout=10)

    # S3: buckets in their regions, lifecycle for temp/, notifications to the queue.
    src, dst = s3(ep["s3"], SOURCE_REGION), s3(ep["s3"], DEST_REGION)
    assert src.get_bucket_location(Bucket=SOURCE_BUCKET)["LocationConstraint"] in (  # type: ignore[attr-defined]
        None, "us-east-1")
    assert dst.get_bucket_location(Bucket=DEST_BUCKET)["LocationConstraint"] == DEST_REGION  # type: ignore[attr-defined]
    rules = dst.get_bucket_lifecycle_configuration(Bucket=DEST_BUCKET)["Rules"]  # type: ignore[attr-defined]
    assert any(r.get("Filter", {}).get("Prefix") == "temp/" for r in rules)
    notif = dst.get_bucket_notification_configuration(Bucket=DEST_BUCKET)  # type: ignore[attr-defined]
    (qc,) = notif["QueueConfigurations"]
    assert set(qc["Events"]) == {"s3:ObjectCreated:*", "s3:ObjectRemoved:*"}
    assert qc["QueueArn"] == state["queue"]["arn"]

    # SQS: an object written to the destination data prefix produces an event.
    sqs = boto3.client("sqs", endpoint_url=ep["sqs"], region_name=DEST_REGION,
                       aws_access_key_id="test", aws_secret_access_key="test")
    url = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    key = "data/us-east-1/sensor.events/0/0/00000000000000000000-00000000000000000009"
    dst.put_object(Bucket=DEST_BUCKET, Key=key, Body=b"x")  # type: ignore[attr-defined]
    keys: list[str] = []
    deadline = time.monotonic() + 10
    while key not in keys and time.monotonic() < deadline:
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                     WaitTimeSeconds=1).get("Messages", []):
            body = json.loads(m["Body"])
            keys += [unquote_plus(rec["s3"]["object"]["key"])
                     for rec in body.get("Records", [])]
    assert key in keys

    # The configs are valid and point at the stack.
    for role in ("egress", "ingress", "compaction"):
        s = load_settings(stack_dir / f"{role}.toml", environ={})
        assert s.s3.endpoint_url == ep["s3"]
        assert s.kafka.config["session.timeout.ms"] == 6000
    ingress = load_settings(stack_dir / "ingress.toml", environ={})
    assert ingress.region == DEST_REGION
    assert ingress.s3.bucket == DEST_BUCKET
    assert ingress.kafka.brokers == ep["destination_kafka"]
    assert ingress.ingress is not None
    assert ingress.ingress.sqs_endpoint_url == ep["sqs"]
    assert ingress.ingress.sources[0].region == SOURCE_REGION
    egress = load_settings(stack_dir / "egress.toml", environ={})
    assert (egress.region, egress.s3.bucket) == (SOURCE_REGION, SOURCE_BUCKET)
    assert egress.kafka.brokers == ep["source_kafka"]
    assert egress.egress is not None
    assert "sensor.events" in egress.egress.topics

    r = local("status", "--dir", str(stack_dir), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["running"] == {"tansu-source": True,
                                               "tansu-destination": True, "moto": True}
    r = local("up", "--dir", str(stack_dir))
    assert r.returncode == 0
    assert "already up" in r.stdout
    assert json.loads((stack_dir / "state.json").read_text())["servers"] == state["servers"]

    # Sample data for trying the controllers by hand.
    r = local("produce", "--dir", str(stack_dir), "--records", "400")
    assert r.returncode == 0, r.stderr
    assert "produced 400 records" in r.stdout
    assert "[0]=99" in r.stdout and "[3]=99" in r.stdout  # round-robin over 4 partitions

    r = local("down", "--dir", str(stack_dir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("stopped ") == 3
    assert not (stack_dir / "state.json").exists()
    for pid in pids:
        assert gone(pid), f"pid {pid} still running"
        assert session_members(pid) == [], f"session {pid} left processes behind"
    assert local("status", "--dir", str(stack_dir)).returncode == 1
    r = local("down", "--dir", str(stack_dir))
    assert (r.returncode, "Nothing to stop" in r.stdout) == (0, True)


def test_default_dir_is_under_the_current_directory(tmp_path: Path) -> None:
    r = local("status", cwd=tmp_path)
    assert r.returncode == 1
    assert str(tmp_path / ".local-stack") in r.stdout


def _fake_state(d: Path, pid: int, cmdline: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    server = {"pid": pid, "port": 1, "cmdline": cmdline, "log": str(d / "x.log")}
    (d / "state.json").write_text(json.dumps({
        "version": 1, "servers": {"tansu-source": server, "tansu-destination": server,
                                  "moto": server}}))


def test_down_never_kills_a_reused_pid(tmp_path: Path) -> None:
    # A live process whose PID is in the state file but whose command line is not the one
    # recorded (the PID was reused): down must leave it alone.
    other = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        _fake_state(tmp_path, other.pid, "/some/tansu broker --listener-url tcp://x ")
        r = local("down", "--dir", str(tmp_path))
        assert r.returncode == 0, r.stderr
        assert "no longer running; left alone" in r.stdout
        assert other.poll() is None
        assert not (tmp_path / "state.json").exists()
    finally:
        other.kill()
        other.wait()


def test_up_with_stale_state_cleans_up_and_exits_1(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    _fake_state(tmp_path, dead.pid, "true ")
    r = local("up", "--dir", str(tmp_path))
    assert r.returncode == 1
    assert "stale" in r.stderr
    assert not (tmp_path / "state.json").exists()


def test_unreadable_state_exits_1(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    r = local("status", "--dir", str(tmp_path))
    assert r.returncode == 1
    assert "cannot read" in r.stderr


def test_python_api(tmp_path: Path) -> None:
    stack = LocalStack.start(tmp_path / "api", topic="api.topic", partitions=2)
    try:
        assert stack.is_up()
        again = LocalStack.load(tmp_path / "api")
        assert again is not None
        assert again.endpoints == stack.endpoints
        assert again.is_up()
        with pytest.raises(Exception, match="already up"):
            LocalStack.start(tmp_path / "api")
        s = stack.settings_for("compaction")
        assert s.compaction is not None
        assert list(s.compaction.topics) == ["api.topic"]
        assert stack.settings_for("ingress").ingress.sources[0].destination == "api.topic.copy"  # type: ignore[union-attr]
        md = AdminClient({"bootstrap.servers": stack.endpoints["source_kafka"]}).list_topics(
            timeout=10)
        assert len(md.topics["api.topic"].partitions) == 2
    finally:
        pids = [r.pid for r in stack.servers.values()]
        stopped = stack.stop()
    assert sorted(stopped) == ["moto", "tansu-destination", "tansu-source"]
    assert all(gone(pid) for pid in pids)
    assert LocalStack.load(tmp_path / "api") is None


def test_failed_start_stops_what_it_started(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list[int]] = {}

    def broken(self: LocalStack) -> None:
        seen["pids"] = [r.pid for r in self.servers.values()]
        assert json.loads((tmp_path / "state.json").read_text())["servers"].keys() == {
            "tansu-source", "tansu-destination", "moto"}  # recorded before provisioning
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalStack, "_provision", broken)
    with pytest.raises(KeyboardInterrupt):
        LocalStack.start(tmp_path)
    assert len(seen["pids"]) == 3
    assert all(gone(pid) for pid in seen["pids"])
    assert not (tmp_path / "state.json").exists()
