"""The TOML writer of the configs the embedded stack, tests and benchmarks write."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from replicator.core.settings import load_settings
from replicator.devstack.toml_writer import to_toml, toml_value, write_toml


def test_round_trips_tables_arrays_of_tables_and_quoted_keys(tmp_path: Path) -> None:
    data = {"region": "r", "kafka": {"brokers": "b:1", "config": {"a.b": 1, "x": True}},
            "egress": {"topics": {"t.x": {"max_segment_age": "1s", "n": 3}}},
            "ingress": {"sources": [{"region": "r", "topic": "t", "tags": ["a", "b\"c"]},
                                    {"region": "s", "topic_pattern": "t\\..*"}],
                        "flag": True, "empty": [], "ratio": 0.5}}
    path = write_toml(tmp_path / "c.toml", data)
    assert tomllib.loads(path.read_text()) == data


def test_a_written_ingress_config_is_read_by_the_settings(tmp_path: Path) -> None:
    """Sources written as an array of tables are what ``[[ingress.sources]]`` means."""
    cfg = write_toml(tmp_path / "ingress.toml", {
        "region": "us-west-1", "s3": {"bucket": "b"}, "kafka": {"brokers": "k:9092"},
        "ingress": {"sqs_queue": "q", "sources": [
            {"region": "us-east-1", "topic": "orders", "destination_topic": "orders.copy"},
            {"region": "eu-west-1", "topic": "orders", "destination_topic": "orders.eu"}]}})
    settings = load_settings(cfg)
    assert settings.ingress is not None
    assert [(s.region, s.destination_topic) for s in settings.ingress.sources] == [
        ("us-east-1", "orders.copy"), ("eu-west-1", "orders.eu")]


def test_a_value_toml_cannot_hold_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="NoneType"):
        toml_value(None)
    with pytest.raises(TypeError, match="set"):
        to_toml({"x": {1, 2}})
