"""``Settings``: everything one process needs (the root of the configuration file)."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from replicator.core.errors import ConfigError
from replicator.core.settings.catalog import CatalogSettings
from replicator.core.settings.compaction import CompactionSettings
from replicator.core.settings.egress import EgressSettings
from replicator.core.settings.fields import KeyedValueError, Model
from replicator.core.settings.ingress import IngressSettings
from replicator.core.settings.names import region_name
from replicator.core.settings.sections import (
    FormatSettings,
    KafkaSettings,
    LogSettings,
    MetricsSettings,
    S3Settings,
)

AWS_SUFFIXES = (".amazonaws.com", ".amazonaws.com.cn")


def normal_endpoint(url: str | None) -> str | None:
    """``url`` compared as an endpoint (pure): scheme and host lower-cased, the default
    port and a trailing ``/`` dropped.
    """
    if url is None:
        return None
    u = urlsplit(url.strip())
    host = (u.hostname or "").lower()
    default = {"http": 80, "https": 443}.get(u.scheme.lower())
    port = "" if u.port is None or u.port == default else f":{u.port}"
    return f"{u.scheme.lower()}://{host}{port}{u.path.rstrip('/')}"


def is_aws_endpoint(url: str | None) -> bool:
    """True for AWS S3 (no endpoint, or a host under ``amazonaws.com``): one global
    namespace of bucket names, whichever region's endpoint names it.
    """
    if url is None:
        return True
    return (urlsplit(url.strip()).hostname or "").lower().endswith(AWS_SUFFIXES)


def aws_endpoint_region(url: str | None) -> str | None:
    """The region an AWS S3 endpoint names (``s3.us-west-2.amazonaws.com``,
    ``s3-us-west-2``, ``s3.dualstack.us-west-2``, ``s3-fips.us-west-2``, bucket-style
    hosts too; ``s3.amazonaws.com``: us-east-1); ``None`` for no endpoint, another store,
    or a host whose region cannot be told (pure).
    """
    if url is None or not is_aws_endpoint(url):
        return None
    host = (urlsplit(url.strip()).hostname or "").lower()
    for suffix in AWS_SUFFIXES:
        host = host.removesuffix(suffix)
    labels = host.split(".")
    for i, label in enumerate(labels):
        if label == "s3-accelerate":
            return None                       # global: no region named
        if label in ("s3", "s3-external-1") or label.startswith("s3-"):
            rest = [x for x in labels[i + 1:] if x not in ("dualstack", "fips")]
            if rest:
                return rest[0]
            if label in ("s3", "s3-external-1"):
                return "us-east-1"
            return label.removeprefix("s3-") if label != "s3-fips" else None
    return None


MAX_PARTS = 10_000
"""Parts of one S3 multipart upload, at most."""


class Settings(Model):
    """Everything one process needs. Sections not used by a process may be absent."""

    region: str = Field(description="This process's region (segments are written under it).")
    s3: S3Settings
    kafka: KafkaSettings
    format: FormatSettings = Field(default_factory=FormatSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    egress: EgressSettings | None = None
    ingress: IngressSettings | None = None
    compaction: CompactionSettings | None = None
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)

    @field_validator("region")
    @classmethod
    def _region_ok(cls, v: str) -> str:
        return region_name(v)

    @model_validator(mode="after")
    def _sources_remote(self) -> Settings:
        if self.ingress is not None:
            for i, s in enumerate(self.ingress.sources):
                if s.region == self.region:
                    raise KeyedValueError(
                        f"ingress.sources.{i}.region",
                        f"source region {s.region!r} is this process's own region; ingress "
                        "replays segments of other regions")
        return self

    @model_validator(mode="after")
    def _tables_can_list_the_segments(self) -> Settings:
        # An Iceberg table lists Parquet segments only: with Arrow outputs a compaction
        # swap would take its inputs out of the table and put nothing in.
        if self.catalog.enabled and self.format.name != "parquet":
            raise KeyedValueError(
                "format.name",
                f"{self.format.name!r} segments cannot be Iceberg data files, and "
                "[catalog] enabled = true lists segments as tables: compaction would take "
                "the records it merges out of the tables; use \"parquet\" or disable "
                "[catalog]")
        return self

    @model_validator(mode="after")
    def _catalog_safe(self) -> Settings:
        cat = self.catalog
        if not cat.enabled:
            return self
        if cat.type == "dynamodb":
            raise KeyedValueError(
                "catalog.type", "pyiceberg cannot commit to a DynamoDB catalog (its "
                "commit_table is not implemented): every step would fail; use glue, rest, "
                "hive or sql")
        uri = cat.properties.get("uri", "")
        # Every SQLAlchemy spelling of SQLite: sqlite:, sqlite+pysqlite:, sqlite+aiosqlite:...
        sqlite = re.match(r"sqlite(\+[a-z0-9_]+)?:", uri, re.IGNORECASE)
        if cat.type == "sql" and sqlite:
            rest = uri[sqlite.end():]
            if not rest.startswith("////"):
                raise KeyedValueError(
                    "catalog.properties.uri",
                    f"{uri!r} is not an absolute SQLite path (sqlite:////abs/path.db): a "
                    "relative path gives each process (follower, compaction) a catalog of "
                    "its own over one warehouse, and each deletes the other's metadata")
        # Tables are created at {warehouse}/{namespace levels}/...: explicit warehouses
        # (any S3 spelling) and the default one.
        checks = [("catalog.warehouse", cat.warehouse or f"s3://{self.s3.bucket}/iceberg",
                   cat.warehouse is None),
                  ("catalog.properties.warehouse", cat.properties.get("warehouse"), False)]
        prefix = self.s3.prefix.strip("/")
        for key, where, default in checks:
            path = _bucket_path(where, self.s3.bucket)
            if path is None:
                continue
            tables = "/".join(p for p in (path, *cat.namespace.split(".")) if p)
            if not prefix or tables == prefix or tables.startswith(prefix + "/"):
                what = (f"the default warehouse {where!r}" if default else repr(where))
                raise KeyedValueError(
                    key, f"{what} puts the tables ({cat.namespace} namespace) under the "
                    f"segments' prefix (s3.prefix = {self.s3.prefix!r}): table metadata "
                    "there would be taken for topics and segments; set catalog.warehouse "
                    "beside it (s3://{bucket}/iceberg)")
        return self

    @model_validator(mode="after")
    def _mirror_elsewhere(self) -> Settings:
        # The mirror copies each segment to the same key in another bucket: into this
        # region's own bucket it would copy every segment onto itself. On AWS a bucket
        # name is global, so the same name through any AWS endpoint is the same bucket.
        mirror = self.egress.mirror if self.egress is not None else None
        if mirror is None:
            return self
        own, peer = self.s3.endpoint_url, mirror.endpoint_url
        if mirror.bucket == self.s3.bucket and (
                (is_aws_endpoint(own) and is_aws_endpoint(peer))
                or normal_endpoint(own) == normal_endpoint(peer)):
            raise KeyedValueError(
                "egress.mirror.bucket",
                f"{mirror.bucket!r} is this region's own bucket (s3.bucket): name the "
                "destination region's bucket, the one its ingress reads")
        named = aws_endpoint_region(peer)
        if named is not None and named != mirror.region:
            raise KeyedValueError(
                "egress.mirror.endpoint_url",
                f"{peer!r} is AWS's endpoint of {named}, but egress.mirror.region is "
                f"{mirror.region!r}: the copies must go to the destination bucket's region")
        return self

    @model_validator(mode="after")
    def _segments_fit_in_parts(self) -> Settings:
        # A segment streams into one multipart upload of at most MAX_PARTS parts of
        # s3.part_size bytes (egress writes it, compaction writes its outputs).
        limit = MAX_PARTS * self.s3.part_size
        sections = [("egress", self.egress), ("compaction", self.compaction)]
        for name, section in sections:
            if section is None:
                continue
            for topic, t in section.topics.items():
                if t.max_segment_size > limit:
                    raise KeyedValueError(
                        f"{name}.topics.{topic}.max_segment_size",
                        f"{t.max_segment_size} bytes cannot fit in one upload of 10,000 "
                        f"parts of s3.part_size ({self.s3.part_size} bytes, {limit} in all); "
                        "lower it or raise s3.part_size")
        return self

    @property
    def s3_region(self) -> str:
        """AWS region of the S3 client."""
        return self.s3.region or self.region

    def require(self, section: Literal["egress", "ingress", "compaction"]) -> Any:
        """Return a service section or raise ``ConfigError`` naming it."""
        value = getattr(self, section)
        if value is None:
            raise ConfigError(section, f"section [{section}] is required by this command")
        return value

    def masked(self) -> dict[str, Any]:
        """A JSON-able dump with secrets masked, for the start-up log line."""
        data = self.model_dump(mode="json")
        data["kafka"]["config"] = self.kafka.masked_config()
        data["catalog"]["properties"] = self.catalog.masked_properties()
        return data


def _bucket_path(url: str | None, bucket: str) -> str | None:
    """The key path of ``url`` in ``bucket`` (``s3://``, ``s3a://`` or ``s3n://``, the
    Hadoop spellings Spark users copy), ``None`` for another bucket or scheme.
    """
    m = re.fullmatch(r"s3[an]?://([^/]+)(/.*)?", url or "", re.IGNORECASE)
    if m is None or m.group(1) != bucket:
        return None
    return (m.group(2) or "").strip("/")
