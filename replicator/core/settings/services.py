"""The service sections, gathered: ``[egress]`` (``egress.py``), ``[ingress]``
(``ingress.py``) and ``[compaction]`` (``compaction.py``), with the origin header's
default (``names.py``).

Each section lives in its own module; this one keeps the names importable from where they
were first defined.
"""

from __future__ import annotations

from replicator.core.settings.compaction import CompactionSettings, CompactionTopicSettings
from replicator.core.settings.egress import (
    EgressMirrorSettings,
    EgressSelectSettings,
    EgressSettings,
    EgressTopicSettings,
    GroupExportSettings,
)
from replicator.core.settings.ingress import IngressSettings, IngressSourceSettings
from replicator.core.settings.names import ORIGIN_HEADER

__all__ = [
    "ORIGIN_HEADER",
    "CompactionSettings",
    "CompactionTopicSettings",
    "EgressMirrorSettings",
    "EgressSelectSettings",
    "EgressSettings",
    "EgressTopicSettings",
    "GroupExportSettings",
    "IngressSettings",
    "IngressSourceSettings",
]
