"""What a compaction run looked at and did: ``RunScope``, ``PlannedTask``, ``RunReport``
(printed by ``replicator-compaction --once`` and ``--dry-run``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from compaction.planner import CompactionTask


@dataclass(frozen=True)
class RunScope:
    """What a run looks at: the CLI's ``--topic/--partition/--min-level/--max-level``."""

    topic: str | None = None
    partition: int | None = None
    min_level: int | None = None
    max_level: int | None = None


@dataclass
class PlannedTask:
    """One task of a report: segments in, segment out, bytes, and what became of it."""

    topic: str
    partition: int
    inputs: list[str]
    output: str
    bytes: int
    covered: list[str]
    outcome: str = "planned"   # planned | merged | existing | failed | not-run
    records: int = 0
    bytes_out: int = 0
    error: str | None = None


@dataclass
class RunReport:
    """What one run did (printed by ``--once`` and ``--dry-run``)."""

    region: str
    started_at: str
    outcome: str = "success"   # success | skipped | failed
    dry_run: bool = False
    reason: str | None = None
    duration_seconds: float = 0.0
    partitions: int = 0
    tasks: list[PlannedTask] = field(default_factory=list)
    covered_to_delete: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    holes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def planned(t: CompactionTask) -> PlannedTask:
    """The report entry of a planned task."""
    return PlannedTask(t.output.topic, t.output.partition, [k.to_key() for k in t.inputs],
                       t.output.to_key(), t.bytes, [k.to_key() for k in t.covered])
