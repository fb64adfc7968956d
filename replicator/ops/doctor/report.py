"""What every doctor check returns: a name, PASS/WARN/FAIL, what was seen and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """PASS: as the services need it. WARN: works, but slower, costlier or riskier than it
    should be. FAIL: a service would stop or lose its way; the fix is needed.
    """

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's table."""

    name: str
    status: Status
    seen: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.name, "status": self.status.value, "seen": self.seen,
                "fix": self.fix}


def passed(name: str, seen: str) -> Check:
    """A PASS line (nothing to fix)."""
    return Check(name, Status.PASS, seen)


def warn(name: str, seen: str, fix: str) -> Check:
    """A WARN line."""
    return Check(name, Status.WARN, seen, fix)


def fail(name: str, seen: str, fix: str) -> Check:
    """A FAIL line."""
    return Check(name, Status.FAIL, seen, fix)


def overall(checks: Sequence[Check]) -> Status:
    """The worst status of ``checks`` (PASS when there are none)."""
    statuses = {c.status for c in checks}
    for s in (Status.FAIL, Status.WARN):
        if s in statuses:
            return s
    return Status.PASS


def exit_code(checks: Sequence[Check]) -> int:
    """0 when nothing failed (PASS and WARN), 1 when a check failed."""
    return 1 if overall(checks) is Status.FAIL else 0
