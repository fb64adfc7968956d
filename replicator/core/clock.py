"""The clocks services take as arguments, so tests can drive time.

``Clock`` is the wall clock (timezone-aware, UTC by default): segment footers, checkpoints,
schedules, ages of segments. ``Monotonic`` measures intervals (egress segment ages,
backoff): seconds that never jump.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware."""

Monotonic = Callable[[], float]
"""Returns seconds from an arbitrary start that never go backwards."""


def utc_now() -> datetime:
    """The wall clock in UTC (the default ``Clock``)."""
    return datetime.now(UTC)


monotonic: Monotonic = time.monotonic
"""The default ``Monotonic``."""
