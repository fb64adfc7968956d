"""The embedded stack with Apache Kafka brokers (``--kafka apache``, ``KAFKA_HOME``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from replicator.devstack.stack import LocalStack
from tests.integration.test_local_stack import (
    gone,
    local,
    replicator,
    session_members,
    stack_dir,
)

__all__ = ["stack_dir"]  # the fixture, shared with test_local_stack.py


@pytest.mark.parametrize("command", [["local", "up"], ["demo"]])
def test_apache_without_kafka_home_exits_2_and_starts_nothing(tmp_path: Path,
                                                             command: list[str]) -> None:
    r = replicator(*command, "--kafka", "apache", "--dir", str(tmp_path / "s"),
                   env_update={"KAFKA_HOME": None})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "KAFKA_HOME" in r.stderr
    assert not (tmp_path / "s" / "state.json").exists()


@pytest.mark.apache
def test_up_status_down_with_apache_kafka(stack_dir: Path) -> None:
    r = local("up", "--kafka", "apache", "--dir", str(stack_dir), timeout=180)
    assert r.returncode == 0, r.stderr
    assert "Apache Kafka" in r.stdout
    state = json.loads((stack_dir / "state.json").read_text())
    assert state["kafka"] == "apache"
    assert set(state["servers"]) == {"kafka-source", "kafka-destination", "moto"}
    data_dirs = [Path(s["data_dir"]) for s in state["servers"].values() if "data_dir" in s]
    assert len(data_dirs) == 2 and all(d.is_dir() for d in data_dirs)
    logs = stack_dir / "logs"
    assert (logs / "kafka-source.log").exists() and (logs / "kafka-destination.log").exists()
    ep = state["endpoints"]
    md = AdminClient({"bootstrap.servers": ep["source_kafka"]}).list_topics(timeout=10)
    assert len(md.topics["sensor.events"].partitions) == 4
    # Like production clusters, the brokers create no topic by accident.
    dest = AdminClient({"bootstrap.servers": ep["destination_kafka"]})
    md = dest.list_topics("sensor.events.copy", timeout=10)
    assert md.topics["sensor.events.copy"].error is not None
    assert "sensor.events.copy" not in dest.list_topics(timeout=10).topics

    r = local("status", "--dir", str(stack_dir), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["running"] == {"kafka-source": True,
                                               "kafka-destination": True, "moto": True}
    # `up` again with the other broker kind does not silently hand out this stack.
    r = local("up", "--dir", str(stack_dir))
    assert r.returncode == 1 and "runs apache brokers" in r.stderr
    r = local("produce", "--dir", str(stack_dir), "--records", "400")
    assert r.returncode == 0, r.stderr
    assert "[0]=99" in r.stdout and "[3]=99" in r.stdout

    pids = [s["pid"] for s in state["servers"].values()]
    r = local("down", "--dir", str(stack_dir), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("stopped ") == 3
    for pid in pids:
        assert gone(pid), f"pid {pid} still running"
        assert session_members(pid) == [], f"session {pid} left processes behind"
    assert not any(d.exists() for d in data_dirs), "broker data dirs left behind"


@pytest.mark.apache
def test_python_api_with_apache_kafka(tmp_path: Path) -> None:
    stack = LocalStack.start(tmp_path / "api", topic="api.topic", partitions=2,
                             kafka="apache")
    try:
        again = LocalStack.load(tmp_path / "api")
        assert again is not None and again.kafka == "apache" and again.is_up()
        assert again.endpoints == stack.endpoints
    finally:
        data_dirs = [r.data_dir for r in stack.servers.values() if r.data_dir is not None]
        stopped = stack.stop()
    assert sorted(stopped) == ["kafka-destination", "kafka-source", "moto"]
    assert len(data_dirs) == 2 and not any(d.exists() for d in data_dirs)
