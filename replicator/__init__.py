"""kafka-s3-replicator: replicate Kafka topics between regions through S3.

Library use, like the original's Go API::

    from replicator import Egress, Ingress, Compaction, load_settings
    Egress(load_settings("egress.toml")).start()
"""

from __future__ import annotations

from typing import Any

from replicator.core.settings import Settings, load_settings

__all__ = ["Compaction", "Egress", "Ingress", "Settings", "load_settings"]


def __getattr__(name: str) -> Any:
    # The controllers are imported lazily so that importing ``replicator`` (or its core)
    # never pulls in every service; compaction's Spark parts stay optional.
    if name == "Egress":
        from egress.controller import Egress

        return Egress
    if name == "Ingress":
        from ingress.controller import Ingress

        return Ingress
    if name == "Compaction":
        from compaction.controller import Compaction

        return Compaction
    raise AttributeError(name)
