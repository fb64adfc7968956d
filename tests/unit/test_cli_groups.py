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

    def plan(config: Path, timeout: float = 30) -> cli.Planned:
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


def test_sync_reports_every_refused_group_and_exits_1(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    from replicator.ops.groups import TO_SYNC, GroupRow

    class Admin:
        altered: list[str] = []

        def alter_group_offsets(self, group: str, offsets: object) -> None:
            if group != "b":
                raise KafkaRetriableError(f"alter offsets of group {group!r}: has members")
            self.altered.append(group)

    rows = [GroupRow(g, "eu", "orders", 0, "orders", 5, 5, 10, None, TO_SYNC, 5)
            for g in ("a", "b", "c")]
    admin = Admin()
    monkeypatch.setattr(cli, "_plan", lambda config, timeout=30: cli.Planned(
        rows, cast(Any, admin), KafkaSettings(brokers="unused:9092"), "map", [], {}))
    res = CliRunner().invoke(main, ["groups", "sync", "--config", str(tmp_path / "x.toml")])
    assert res.exit_code == 1
    assert admin.altered == ["b"]
    assert "committed 1 partition offset(s) of 1 group(s)" in res.output
    assert "group 'a': commit refused" in res.output and "group 'c': commit refused" in res.output
    assert "2 group(s) refused their commit: a, c" in res.output


def test_the_checkpoints_are_read_before_the_map(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    from replicator.core.settings import Settings

    order: list[str] = []
    settings = Settings.model_validate({
        "region": "us", "kafka": {"brokers": "unused:9092"},
        "s3": {"bucket": "b"},
        "ingress": {"group_id": "ing", "sqs_queue": "q",
                    "sources": [{"region": "eu", "topic": "orders"}]}})

    class Store:
        def __init__(self, *a: object, **k: object) -> None: ...

        def load_all(self) -> dict[str, object]:
            order.append("checkpoints")
            return {}

    def read_map(*a: object, **k: object) -> dict[object, object]:
        order.append("map")
        return {}

    monkeypatch.setattr(cli, "settings_store", lambda config: (settings, cast(Any, None)))
    monkeypatch.setattr(cli, "Admin", lambda kafka, timeout=30: cast(Any, None))
    monkeypatch.setattr(cli, "read_exports", lambda *a: [])
    monkeypatch.setattr(cli, "KafkaCheckpointStore", Store)
    monkeypatch.setattr(cli, "read_offset_map", read_map)
    monkeypatch.setattr(cli, "configured_sources", lambda *a: [])
    cli._plan(tmp_path / "x.toml")
    assert order == ["checkpoints", "map"]
