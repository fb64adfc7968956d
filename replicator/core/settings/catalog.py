"""``[catalog]``: the archive as Apache Iceberg tables (docs/archive.md)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from replicator.core.errors import KeyFormatError
from replicator.core.keys import check_region, check_topic
from replicator.core.settings.fields import Duration, Model

TEMPLATE_FIELDS = frozenset({"region", "topic", "incarnation"})
"""The placeholders ``table_name`` may use."""

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_URL_PASSWORD = re.compile(r"(://[^/@:\s]*:)[^/@\s]*@")
"""The password of ``scheme://user:password@host`` (a SQL catalog's ``uri``)."""
_QUERY_SECRET = re.compile(
    r"([?&;][^=&;#\s]*(?:password|passwd|pwd|secret|token|key|credential|auth)"
    r"[^=&;#\s]*=)[^&;#\s]*", re.IGNORECASE)
"""A secret query parameter of a URL (``postgresql://host/db?user=u&password=...``, the
libpq/SQLAlchemy form; ``?sslpassword=``, ``?access_token=``...)."""
_SECRET_PROPERTY = ("key", "credential", "auth", "header.", "cookie", "signature")
"""Marks of catalog property names whose values are secret besides ``is_secret_setting``'s:
``credential``, ``s3.secret-access-key``, a REST catalog's ``header.Authorization`` (every
``header.*`` value: requests' headers carry tokens)."""
_NAMESPACE = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)*")


def redact_urls(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` and every
    secret query parameter (``?password=...``) masked.
    """
    return _QUERY_SECRET.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


class CatalogSettings(Model):
    """The Iceberg catalog that lists the segments as tables (``[catalog]``)."""

    enabled: bool = Field(False, description="Keep an Iceberg table per replicated topic "
                                             "over the segment files (needs format.name = "
                                             "\"parquet\": refused otherwise).")
    type: str = Field("sql", description="pyiceberg catalog type: sql, glue, rest, hive "
                                         "(only sql is tested here; dynamodb is refused: "
                                         "pyiceberg cannot commit to it).")
    properties: dict[str, str] = Field(
        default_factory=lambda: {"uri": "sqlite:///replicator-catalog.sqlite"},
        description="pyiceberg catalog properties (uri, warehouse, credentials, ...). The "
                    "S3 FileIO properties (s3.endpoint, s3.region, keys) default to [s3]'s. "
                    "With type sql, a SQLite uri (any driver: sqlite+pysqlite:...) must be "
                    "an absolute path (sqlite:////var/lib/replicator/catalog.db): the "
                    "relative default is refused when enabled, as each process would get a "
                    "catalog of its own. Logged with passwords (in the uri, as user:pw@ or "
                    "?password=), keys, credentials and header.* values masked.")
    warehouse: str | None = Field(
        None, description="Where table metadata (metadata.json, manifests) is written "
                          "(default: s3://{s3.bucket}/iceberg; s3a:// and s3n:// are read as "
                          "s3://). Refused, the default too, when the tables "
                          "({warehouse}/{namespace levels}/...) would be under s3.prefix.")
    namespace: str = Field("replicator", description="Namespace of the tables "
                                                     "(dot-separated levels).")
    table_name: str = Field(
        "{region}.{topic}",
        description="Table name template: {region}, {topic}, {incarnation} (the source "
                    "topic id, or \"\"). Dots add namespace levels; every part is lowercased "
                    "and characters outside [a-z0-9_] become _.")
    regions: list[str] = Field(
        default_factory=list,
        description="Source regions whose segments get tables (default: this process's "
                    "region).")
    topics: list[str] = Field(
        default_factory=list,
        description="Topics that get tables (default: every topic found in the bucket).")
    commit_interval: Duration = Field(
        timedelta(seconds=30),
        description="How often `replicator archive follow` commits new and removed segments "
                    "(one commit per table per interval); a segment is in its table within "
                    "this plus one listing.")
    full_listing_interval: Duration = Field(
        timedelta(minutes=5),
        description="How often a committer step lists a topic's segments in full; the steps "
                    "between list only the keys after the newest one of each partition's "
                    "level (one LIST request each). A segment published below the newest "
                    "one of its level, or deleted by a lifecycle rule, reaches its table "
                    "within this plus one commit_interval; 0s lists in full at every step.")
    sync_workers: int = Field(
        8, ge=1, le=64,
        description="Tables `replicator archive follow` brings up to date at once (a "
                    "bounded pool: one table's step in memory per worker); a slow or failing "
                    "table holds one worker, the others go on.")
    lock_ttl: Duration = Field(
        timedelta(minutes=2),
        description="Expiry of the committer's lease ({prefix}/{region}/_archive.lock).")

    snapshot_retention: Duration = Field(
        timedelta(hours=1),
        description="How long a segment compaction swapped out of a table stays in the "
                    "bucket (with the snapshots that list it) before compaction deletes it: "
                    "queries planned before the swap, time travel, streaming readers and "
                    "`restore --snapshot` within it keep working. 0s deletes at once. A table "
                    "keeps every snapshot current within it (one per busy "
                    "`catalog.commit_interval`: ~120 at the defaults; its metadata.json grows "
                    "~0.8 kB per snapshot).")

    @field_validator("snapshot_retention", "full_listing_interval")
    @classmethod
    def _not_negative(cls, v: timedelta) -> timedelta:
        if v < timedelta(0):
            raise ValueError("must not be negative")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace_ok(cls, v: str) -> str:
        if not _NAMESPACE.fullmatch(v):
            raise ValueError(f"{v!r}: dot-separated parts of [a-z0-9_]")
        return v

    @field_validator("table_name")
    @classmethod
    def _template_ok(cls, v: str) -> str:
        names = set(_PLACEHOLDER.findall(v))
        unknown = names - TEMPLATE_FIELDS
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join(sorted(unknown))} (known: "
                             f"{', '.join(sorted(TEMPLATE_FIELDS))})")
        if "topic" not in names:
            raise ValueError("must contain {topic} (one table per topic)")
        return v

    @field_validator("regions", "topics")
    @classmethod
    def _names_ok(cls, v: list[str], info: ValidationInfo) -> list[str]:
        check = check_region if info.field_name == "regions" else check_topic
        try:
            return [check(name) for name in v]
        except KeyFormatError as e:
            raise ValueError(str(e)) from e

    @field_validator("commit_interval", "lock_ttl")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be positive")
        return v

    def masked_properties(self) -> dict[str, Any]:
        """``properties`` with secret values masked, for logs."""
        from replicator.core.settings.fields import is_secret_setting

        def mask(name: str, value: str) -> str:
            n = name.lower()
            if is_secret_setting(n) or any(m in n for m in _SECRET_PROPERTY):
                return "***"
            return redact_urls(value)

        return {k: mask(k, v) for k, v in self.properties.items()}
