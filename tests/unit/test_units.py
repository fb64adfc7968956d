"""Durations and sizes as people write them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.core.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("500ms", timedelta(milliseconds=500)),
    ("30s", timedelta(seconds=30)),
    ("5m", timedelta(minutes=5)),
    ("1h30m", timedelta(hours=1, minutes=30)),
    ("1h30m15s250ms", timedelta(hours=1, minutes=30, seconds=15, milliseconds=250)),
    ("2d", timedelta(days=2)),
    ("1.5h", timedelta(minutes=90)),
    ("0s", timedelta(0)),
    (" 5M ", timedelta(minutes=5)),
])
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5", "5x", "m", "1h 30m", "-5m", "5m-", "h1", "1e3s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(("d", "text"), [
    (timedelta(0), "0s"),
    (timedelta(milliseconds=250), "250ms"),
    (timedelta(minutes=90), "1h30m"),
    (timedelta(days=1, seconds=1), "1d1s"),
])
def test_format_duration(d: timedelta, text: str) -> None:
    assert format_duration(d) == text


@given(st.integers(0, 10**12))
def test_duration_round_trip(ms: int) -> None:
    d = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(d)) == d


@pytest.mark.parametrize(("value", "expected"), [
    (0, 0), (1234, 1234), ("1234", 1234), ("100MiB", 100 * 1024**2), ("1GiB", 1024**3),
    ("64KiB", 65536), ("64KB", 64000), ("1.5MiB", 1572864), ("4 GiB", 4 * 1024**3),
    ("10b", 10), ("2TiB", 2 * 1024**4),
])
def test_parse_size(value: int | str, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", [-1, True, "", "MiB", "10XB", "-5MiB", "1,5MiB"])
def test_parse_size_rejects(value: int | str) -> None:
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1572864, "1.5 MiB"),
    (5 * 1024**3, "5.0 GiB"), (3 * 1024**5, "3072.0 TiB"),
])
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text
