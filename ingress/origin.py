"""The origin marker ingress adds to replayed records (docs/architecture.md, "Origin
marker"): with ``[ingress] mark_origin``, every record replayed from a source region carries
one more header, ``origin_header`` = the region's name in UTF-8, after its own headers, so
the egress of this region can leave it out (``[egress] skip_origins``) and active-active
replication never sends a record back where it came from.
"""

from __future__ import annotations

from ingress.rows import Header
from replicator.core.settings import IngressSettings


def origin_marker(cfg: IngressSettings, source_region: str) -> Header | None:
    """The header appended to records replayed from ``source_region``, or ``None`` when
    ``mark_origin`` is off (records are then copied byte for byte).
    """
    if not cfg.mark_origin:
        return None
    return (cfg.origin_header, source_region.encode("utf-8"))
