"""``replicator groups sync --every``: a failed round is reported and tried again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from replicator.cli import groups as cli
from replicator.cli.main import main
from replicator.core.errors import KafkaRetriableError
from replicator.core.settings import KafkaSettings


class Stop(Exception):
    pass


def test_sync_every_goes_on_after_a_failed_round(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    rounds: list[int] = []

    def plan(config: Path) -> cli.Planned:
        rounds.append(1)
        if len(rounds) == 1:
            raise KafkaRetriableError("destination cluster unreachable")
        return cli.Planned([], cast(Any, None), KafkaSettings(brokers="unused:9092"), "map",
                           [], {})

    def sleep(seconds: float) -> None:
        assert seconds == 30
        if len(rounds) >= 2:
            raise Stop

    monkeypatch.setattr(cli, "_plan", plan)
    monkeypatch.setattr(time, "sleep", sleep)
    res = CliRunner().invoke(main, ["groups", "sync", "--config", str(tmp_path / "x.toml"),
                                    "--every", "30s"])
    assert isinstance(res.exception, Stop)
    assert "sync failed, trying again in 30s: destination cluster unreachable" in res.output
    assert "committed 0 partition offset(s) of 0 group(s)" in res.output
    assert len(rounds) == 2   # the failed round, then one read of the stores per round


def test_sync_every_refuses_a_bad_duration(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["groups", "sync", "--config", str(tmp_path / "x.toml"),
                                    "--every", "0s"])
    assert res.exit_code == 2 and "--every" in res.output
