"""Cron schedules: 5 fields are standard crontab; 6 fields are seconds-first (the original's).

``"0 1 * * *"`` and ``"0 0 1 * * *"`` both mean 01:00:00 every day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from croniter import croniter


@dataclass(frozen=True)
class CronSchedule:
    """A parsed schedule; ``next_after`` gives the next fire time strictly after ``t``."""

    expression: str
    croniter_expression: str
    seconds_first: bool

    def next_after(self, t: datetime) -> datetime:
        """Next fire time after ``t`` (keeps ``t``'s timezone)."""
        it = croniter(self.croniter_expression, t, second_at_beginning=self.seconds_first)
        nxt = it.get_next(datetime)
        assert isinstance(nxt, datetime)
        return nxt


def parse_cron(expression: str) -> CronSchedule:
    """Parse a 5- or 6-field cron expression.

    Raises:
        ValueError: naming the expression, for anything croniter refuses or a wrong field count.
    """
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"cron expression {expression!r} must have 5 fields (minute-first) "
                         f"or 6 fields (seconds-first), has {len(fields)}")
    seconds_first = len(fields) == 6
    expr = " ".join(fields)
    if not croniter.is_valid(expr, second_at_beginning=seconds_first):
        raise ValueError(f"invalid cron expression {expression!r}")
    return CronSchedule(expression, expr, seconds_first)
