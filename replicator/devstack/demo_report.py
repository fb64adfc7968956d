"""What the demo measured (``DemoResult``) and the summary it prints at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from replicator.devstack.sample import ProduceResult
from replicator.ops.verify import VerifyReport


@dataclass
class Stage:
    """Start and end of one pipeline stage (monotonic seconds)."""

    started: float | None = None
    finished: float | None = None

    @property
    def seconds(self) -> float | None:
        if self.started is None or self.finished is None:
            return None
        return max(self.finished - self.started, 1e-9)


@dataclass
class DemoResult:
    """Everything the summary shows."""

    topic: str = ""
    destination_topic: str = ""
    produced: ProduceResult = field(default_factory=ProduceResult)
    stages: dict[str, Stage] = field(default_factory=lambda: {
        n: Stage() for n in ("produce", "egress", "ingress", "compaction")})
    segments_before: dict[int, int] = field(default_factory=dict)
    segments_after: dict[int, int] = field(default_factory=dict)
    compaction_outcome: str = "not run"
    verify: VerifyReport | None = None
    errors: list[str] = field(default_factory=list)
    peak_rss_mib: float = 0.0
    log_path: Path | None = None

    @property
    def passed(self) -> bool:
        return not self.errors and self.verify is not None and self.verify.ok


def levels_text(levels: dict[int, int]) -> str:
    """``L0: 18, L1: 6``: segments per level."""
    return ", ".join(f"L{lv}: {n}" for lv, n in sorted(levels.items())) or "none"


def render_summary(r: DemoResult) -> str:
    """The table printed at the end of the demo."""
    mb = r.produced.raw_bytes / 1e6
    rows = [("stage", "records", "MB", "seconds", "records/s", "MB/s")]
    for name in ("produce", "egress", "ingress"):
        s = r.stages[name].seconds
        if s is None:
            rows.append((name, "-", "-", "-", "-", "-"))
            continue
        rows.append((name, f"{r.produced.records:,}", f"{mb:,.1f}", f"{s:,.1f}",
                     f"{r.produced.records / s:,.0f}", f"{mb / s:,.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    prod, ing = r.stages["produce"], r.stages["ingress"]
    lag = (ing.finished - prod.finished) if ing.finished and prod.finished else None
    comp = r.stages["compaction"].seconds
    lines += [
        "",
        f"segments (source region): before compaction {levels_text(r.segments_before)}; "
        f"after {levels_text(r.segments_after)}"
        + (f" ({r.compaction_outcome}, {comp:.1f}s incl. Spark start)" if comp else ""),
        "end-to-end: last record produced → replayed in the destination: "
        + (f"{lag:.1f}s" if lag is not None else "-"),
        f"peak memory of the demo process (all controllers, Spark driver): "
        f"{r.peak_rss_mib:,.0f} MiB",
    ]
    if r.verify is not None:
        t = r.verify.totals()
        lines.append(f"verify: source {t['source_records']:,} records, destination "
                     f"{t['destination_records']:,}; lost {t['lost']}, duplicated "
                     f"{t['duplicated']}, reordered {t['reordered']}")
        for p in r.verify.problems:
            lines.append(f"  problem: {p}")
        for pv in r.verify.partitions:
            if pv.first_difference is not None:
                lines.append(f"  partition {pv.partition}: first difference "
                             f"{pv.first_difference}")
    for e in r.errors:
        lines.append(f"error: {e}")
    if r.log_path is not None:
        lines.append(f"log: {r.log_path}")
    lines.append("")
    lines.append("PASS" if r.passed else "FAIL")
    return "\n".join(lines)
