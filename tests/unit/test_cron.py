"""Cron schedules: 5-field crontab and the original's 6-field seconds-first form."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from replicator.core.cron import parse_cron

T0 = datetime(2026, 3, 10, 0, 30, 0, tzinfo=UTC)


def test_five_fields_daily_at_one() -> None:
    s = parse_cron("0 1 * * *")
    assert not s.seconds_first
    assert s.next_after(T0) == datetime(2026, 3, 10, 1, 0, 0, tzinfo=UTC)
    assert s.next_after(datetime(2026, 3, 10, 1, 0, 0, tzinfo=UTC)) == \
        datetime(2026, 3, 11, 1, 0, 0, tzinfo=UTC)


def test_six_fields_are_seconds_first() -> None:
    s = parse_cron("0 0 1 * * *")  # the original's default: 01:00:00 daily
    assert s.seconds_first
    assert s.next_after(T0) == datetime(2026, 3, 10, 1, 0, 0, tzinfo=UTC)
    assert s.next_after(datetime(2026, 3, 10, 1, 0, 0, tzinfo=UTC)) == \
        datetime(2026, 3, 11, 1, 0, 0, tzinfo=UTC)


def test_six_fields_with_seconds() -> None:
    s = parse_cron("*/15 * * * * *")
    assert s.next_after(T0) == datetime(2026, 3, 10, 0, 30, 15, tzinfo=UTC)
    s = parse_cron("30 5 * * * *")
    assert s.next_after(T0) == datetime(2026, 3, 10, 1, 5, 30, tzinfo=UTC)


def test_extra_whitespace_is_fine() -> None:
    s = parse_cron("  */5   *  * * * ")
    assert s.next_after(T0) == datetime(2026, 3, 10, 0, 35, tzinfo=UTC)
    assert s.expression == "  */5   *  * * * "


@pytest.mark.parametrize("expr", ["", "* * * *", "* * * * * * *", "61 * * * *",
                                  "0 25 * * *", "0 0 25 * * *", "a b c d e", "60 0 1 * * *",
                                  "0 1 * * 8"])
def test_invalid(expr: str) -> None:
    with pytest.raises(ValueError, match="cron expression"):
        parse_cron(expr)
