"""``replicator cutover from-mm2`` and ``replicator failback record-start``: bad use exits 2
naming what is wrong, before anything is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from replicator.cli.main import main

EGRESS_ONLY = '''region = "us-east-1"
[s3]
bucket = "b"
endpoint_url = "http://127.0.0.1:1"
[kafka]
brokers = "127.0.0.1:1"
[egress.topics."t"]
'''

INGRESS = '''region = "us-west-1"
[s3]
bucket = "b"
endpoint_url = "http://127.0.0.1:1"
[kafka]
brokers = "127.0.0.1:1"
[ingress]
sqs_queue = "q"
[[ingress.sources]]
region = "us-east-1"
topic = "t"
destination_topic = "primary.{topic}"
'''


@pytest.mark.parametrize("args", [["cutover", "from-mm2"], ["failback", "record-start"]])
def test_a_config_without_ingress_exits_2(tmp_path: Path, args: list[str]) -> None:
    config = tmp_path / "egress.toml"
    config.write_text(EGRESS_ONLY)
    res = CliRunner().invoke(main, [*args, "--config", str(config)])
    assert res.exit_code == 2 and "[ingress] is required" in res.output, res.output


@pytest.mark.parametrize("lookback", ["soon", "-5m"])
def test_a_bad_lookback_exits_2_naming_it(tmp_path: Path, lookback: str) -> None:
    config = tmp_path / "ingress.toml"
    config.write_text(INGRESS)
    res = CliRunner().invoke(main, ["cutover", "from-mm2", "--config", str(config),
                                    "--lookback", lookback])
    assert res.exit_code == 2 and "--lookback" in res.output, res.output
