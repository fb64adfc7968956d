"""``replicator cutover from-mm2`` and ``replicator failback record-start``: bad use exits 2
naming what is wrong, before anything is read."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from replicator.cli.main import main
from replicator.core.settings import KafkaSettings, load_settings
from replicator.core.wire import Checkpoint
from replicator.ops import mm2_cutover
from replicator.ops.mm2_cutover import CutoverError, PartitionCutover, write_cutover

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


def test_a_destination_that_grew_since_it_was_read_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MM2 (or another producer) still writing: the checkpoint would fall behind the end."""
    settings = load_settings(data={"region": "us-west-1", "s3": {"bucket": "b"},
                                   "kafka": {"brokers": "127.0.0.1:1"},
                                   "ingress": {"sqs_queue": "q", "sources": [
                                       {"region": "us-east-1", "topic": "t"}]}}, environ={})
    cp = Checkpoint(41, "seg", datetime.now(UTC))
    plan = [PartitionCutover("us-east-1", "t", 0, "t", 42, cp),
            PartitionCutover("us-east-1", "t", 1, "t", 10, None)]
    monkeypatch.setattr(mm2_cutover, "destination_ends", lambda *_: [42, 12])

    def no_kafka(*_: object, **__: object) -> None:
        raise AssertionError("nothing may be written")
    monkeypatch.setattr(mm2_cutover, "Admin", no_kafka)
    monkeypatch.setattr(mm2_cutover, "Producer", no_kafka)
    assert settings.ingress is not None
    with pytest.raises(CutoverError, match=r"destination grew .*t\[1\] 10 -> 12"):
        write_cutover(KafkaSettings(brokers="127.0.0.1:1"), settings.ingress, plan)
