"""docs/metrics.md is generated from the controllers' metric definitions and must match."""

from __future__ import annotations

import re
from pathlib import Path

from replicator.reference.metrics import definitions, render_reference

ROOT = Path(__file__).resolve().parents[2]


def test_committed_reference_matches_the_code() -> None:
    assert (ROOT / "docs" / "metrics.md").read_text() == render_reference(), (
        "docs/metrics.md is stale: run `python -m replicator.reference.metrics > "
        "docs/metrics.md`")


def test_every_metric_in_the_source_is_in_the_reference() -> None:
    documented = {d.name for defs in definitions().values() for d in defs}
    pattern = re.compile(r"\.(?:counter|gauge|histogram)\(\s*\"([a-z_]+)\"")
    in_source = set()
    for pkg in ("egress", "ingress", "compaction", "replicator", "formats"):
        for f in (ROOT / pkg).rglob("*.py"):
            in_source |= {"replicator_" + n.removeprefix("replicator_")
                          for n in pattern.findall(f.read_text())}
    assert in_source, "no metric definitions found"
    assert in_source <= documented, sorted(in_source - documented)


def test_names_follow_the_conventions() -> None:
    for defs in definitions().values():
        for d in defs:
            assert d.name.startswith("replicator_")
            assert d.doc
            assert (d.kind == "counter") == d.name.endswith("_total"), d.name
            assert "offset" not in d.labels
