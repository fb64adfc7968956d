"""The metrics reference, generated from the controllers' metric definitions.

``python -m replicator.reference.metrics > docs/metrics.md`` rewrites it; a test fails when
the committed file and the code disagree.
"""

from __future__ import annotations

import sys

from compaction.metrics import CompactionMetrics
from egress.metrics import EgressMetrics
from ingress.checkpoints import KafkaCheckpointStore
from ingress.metrics import IngressMetrics
from replicator.archive.metrics import ArchiveMetrics
from replicator.core.metrics import MetricDefinition, Metrics
from replicator.core.reachability import dependency_gauge
from replicator.core.settings import KafkaSettings
from replicator.ops.groups import GroupMetrics


def definitions() -> dict[str, list[MetricDefinition]]:
    """Controller name -> the metrics it exports, in definition order."""
    out = {}
    for name in ("egress", "ingress", "compaction", "groups sync", "archive"):
        m = Metrics()
        if name == "egress":
            EgressMetrics(m)
            dependency_gauge(m)
        elif name == "ingress":
            IngressMetrics.create(m)
            dependency_gauge(m)
            # Constructing the store only registers its metric; it connects on load().
            KafkaCheckpointStore(KafkaSettings(brokers="unused:9092"), "unused", m)
        elif name == "compaction":
            CompactionMetrics(m, "region")
        elif name == "archive":
            ArchiveMetrics(m)
        else:
            GroupMetrics(m)
        out[name] = list(m.definitions)
    return out


def render_reference() -> str:
    """Markdown: one table per controller."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from the code by `python -m replicator.reference.metrics`; do not edit by "
        "hand. Every controller serves these on `http://<metrics.host>:<metrics.port>/metrics`"
        " (Prometheus text format), next to `/healthz` (alive) and `/readyz` (working). "
        "Counters end in `_total`; labels never carry offsets.",
    ]
    for controller, defs in definitions().items():
        lines += ["", f"## {controller}", "", "| metric | type | labels | meaning |",
                  "| --- | --- | --- | --- |"]
        for d in defs:
            labels = ", ".join(d.labels) or "-"
            lines.append(f"| `{d.name}` | {d.kind} | {labels} | {d.doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_reference())
