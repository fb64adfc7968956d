"""Name checks and defaults shared by the service sections: topic, region and header
names, and the origin marker header.

Separate so that the ``[egress]``, ``[ingress]`` and ``[compaction]`` modules can share
them without importing each other.
"""

from __future__ import annotations

from replicator.core.errors import KeyFormatError
from replicator.core.keys import check_region, check_topic


def topic_name(name: str) -> str:
    """``name`` if it is a legal Kafka topic name, else ``ValueError`` (pydantic names the key)."""
    try:
        return check_topic(name)
    except KeyFormatError as e:
        raise ValueError(str(e)) from e


ORIGIN_HEADER = "replicator.origin"
"""Default name of the origin marker header (docs/architecture.md, "Origin marker")."""

ORIGIN_HEADER_HELP = (
    "Name of the record header that names the region a record was replicated from "
    "(docs/architecture.md, \"Origin marker\"); ingress's [ingress] origin_header and "
    "egress's [egress] origin_header must be the same.")


def header_name(name: str) -> str:
    """``name`` if it is a usable header name (not empty), else ``ValueError``."""
    if not name:
        raise ValueError("must not be empty")
    return name


def region_name(name: str) -> str:
    """``name`` if it is a legal region name, else ``ValueError`` (pydantic names the key)."""
    try:
        return check_region(name)
    except KeyFormatError as e:
        raise ValueError(str(e)) from e
