"""The three entry points refuse bad configuration with exit code 2 and name the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent

BASE = """
region = "us-east-1"
[s3]
bucket = "b"
endpoint_url = "http://127.0.0.1:9"
[kafka]
brokers = "127.0.0.1:9"
"""

SECTIONS = {
    "egress": '[egress]\n[egress.topics."sensor.events"]\nmax_segment_age = "5m"\n',
    "ingress": ('[ingress]\nsqs_queue = "q"\n[[ingress.sources]]\nregion = "us-west-1"\n'
                'topic = "sensor.events"\n'),
    "compaction": '[compaction]\n[compaction.topics."sensor.events"]\nmin_segment_count = 2\n',
}

# (service, extra TOML appended to its section, the dotted key the error must name)
UNKNOWN_KEY = {
    "egress": ("max_segment_agee = \"5m\"\n", "egress.topics.sensor.events.max_segment_agee"),
    "ingress": ("late_segment_retriez = 3\n", "ingress.sources.0.late_segment_retriez"),
    "compaction": ("min_segment_cont = 3\n", "compaction.topics.sensor.events.min_segment_cont"),
}
BAD_DURATION = {
    "egress": ('[egress.topics."t2"]\nmax_segment_age = "5 minutes"\n',
               "egress.topics.t2.max_segment_age"),
    "ingress": ('lost_segment_timeout = "1hour"\n', "ingress.sources.0.lost_segment_timeout"),
    "compaction": ('min_segment_age = "10"\n', "compaction.topics.sensor.events.min_segment_age"),
}


def run(service: str, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REPLICATOR_")}
    return subprocess.run([str(BIN / f"replicator-{service}"), *args], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**clean, **(env or {})}, check=False)


def write(tmp_path: Path, service: str, extra: str = "") -> Path:
    path = tmp_path / f"{service}.toml"
    path.write_text(BASE + SECTIONS[service] + extra)
    return path


@pytest.mark.parametrize("service", list(SECTIONS))
def test_unknown_key_exits_2(tmp_path: Path, service: str) -> None:
    extra, key = UNKNOWN_KEY[service]
    r = run(service, "--config", str(write(tmp_path, service, extra)))
    assert r.returncode == 2, r.stderr
    assert key in r.stderr
    assert "unknown key" in r.stderr


@pytest.mark.parametrize("service", list(SECTIONS))
def test_bad_duration_exits_2(tmp_path: Path, service: str) -> None:
    extra, key = BAD_DURATION[service]
    r = run(service, "--config", str(write(tmp_path, service, extra)))
    assert r.returncode == 2, r.stderr
    assert key in r.stderr
    assert "duration" in r.stderr


@pytest.mark.parametrize("service", list(SECTIONS))
def test_missing_file_exits_2(tmp_path: Path, service: str) -> None:
    r = run(service, "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2, r.stderr
    assert "nope.toml" in r.stderr
    assert "not found" in r.stderr


@pytest.mark.parametrize("service", list(SECTIONS))
def test_missing_section_exits_2(tmp_path: Path, service: str) -> None:
    other = "ingress" if service != "ingress" else "egress"
    r = run(service, "--config", str(write(tmp_path, other)))
    assert r.returncode == 2, r.stderr
    assert f"[{service}]" in r.stderr


def test_bad_env_override_exits_2_naming_the_variable(tmp_path: Path) -> None:
    r = run("egress", "--config", str(write(tmp_path, "egress")),
            env={"REPLICATOR_EGRESS__TOPICS__sensor.events__MAX_SEGMENT_AGE": "soon"})
    assert r.returncode == 2, r.stderr
    assert "egress.topics.sensor.events.max_segment_age" in r.stderr
    assert "REPLICATOR_EGRESS__TOPICS__sensor.events__MAX_SEGMENT_AGE" in r.stderr


def test_config_from_environment_variable(tmp_path: Path) -> None:
    r = run("ingress", env={"REPLICATOR_CONFIG": str(write(
        tmp_path, "ingress", 'late_segment_retries = 0\n'))})
    assert r.returncode == 2, r.stderr
    assert "ingress.sources.0.late_segment_retries" in r.stderr


def test_invalid_toml_and_missing_option_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("region = [\n")
    r = run("compaction", "--config", str(bad))
    assert r.returncode == 2
    assert "not valid TOML" in r.stderr
    r = run("egress")
    assert r.returncode == 2
    assert "--config" in r.stderr
