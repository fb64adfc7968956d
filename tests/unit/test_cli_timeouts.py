"""Read commands take ``--timeout``: a cluster that does not answer fails the command with
exit code 1 naming what it read, instead of waiting on librdkafka's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from replicator.cli.main import main

CONFIG = """region = "us-west-1"
[kafka]
brokers = "127.0.0.1:1"
[s3]
bucket = "b"
endpoint_url = "http://127.0.0.1:1"
[ingress]
sqs_queue = "q"
[[ingress.sources]]
region = "us-east-1"
topic = "t"
"""


@pytest.mark.parametrize("command", [["checkpoints", "show"], ["topics"]])
def test_a_cluster_that_does_not_answer_fails_the_read_naming_it(
        command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    cfg = tmp_path / "ingress.toml"
    cfg.write_text(CONFIG)
    result = CliRunner().invoke(main, [*command, "--config", str(cfg), "--timeout", "1"])
    assert result.exit_code == 1, result.output
    assert "replicator.checkpoint" in result.output


def test_a_timeout_below_half_a_second_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "ingress.toml"
    cfg.write_text(CONFIG)
    result = CliRunner().invoke(main, ["groups", "show", "--config", str(cfg),
                                       "--timeout", "0.1"])
    assert result.exit_code == 2
    assert "--timeout" in result.output
