"""The sections every process has: ``[s3]``, ``[kafka]``, ``[format]``, ``[metrics]``,
``[log]``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from replicator.core.errors import KeyFormatError
from replicator.core.keys import check_prefix
from replicator.core.settings.fields import (
    STORAGE_CLASSES,
    KafkaValue,
    Model,
    Size,
    is_secret_setting,
)


class S3Settings(Model):
    """Where segments live (``[s3]``)."""

    bucket: str = Field(description="Bucket of this region's segments.")
    prefix: str = Field("data", description="Key prefix of final segments "
                                            "(docs/architecture.md, S3 layout).")
    temp_prefix: str = Field("temp", description="Key prefix of objects still being written.")
    endpoint_url: str | None = Field(None, description="Endpoint of an S3-compatible store.")
    region: str | None = Field(
        None, description="AWS region of the bucket's client (default: the process region).")
    access_key_id: SecretStr | None = Field(
        None, description="Static access key (default: the AWS credential chain).")
    secret_access_key: SecretStr | None = Field(None, description="Static secret key.")
    storage_class: dict[int, str] = Field(
        default_factory=dict,
        description="Storage class per segment level, e.g. {\"0\" = \"STANDARD\"}; not "
                    "GLACIER or DEEP_ARCHIVE (segments of every level are read).")
    sse: Literal["AES256", "aws:kms"] | None = Field(
        None, description="Server-side encryption of written objects.")
    sse_kms_key_id: str | None = Field(None, description="KMS key id when sse = 'aws:kms'.")
    part_size: Size = Field(8 * 1024**2, description="Multipart upload part size (>= 5MiB).")
    multipart_copy_threshold: Size = Field(
        5 * 1024**3, description="Objects above this size are copied part by part (<= 5GiB).")
    max_pool_connections: int = Field(32, ge=1, description="HTTP connections per client.")

    @field_validator("prefix", "temp_prefix")
    @classmethod
    def _prefix_ok(cls, v: str) -> str:
        try:
            return check_prefix(v)
        except KeyFormatError as e:
            raise ValueError(str(e)) from e

    @field_validator("storage_class")
    @classmethod
    def _classes_ok(cls, v: dict[int, str]) -> dict[int, str]:
        for level, sc in v.items():
            if level < 0:
                raise ValueError(f"level {level} must be >= 0")
            if sc not in STORAGE_CLASSES:
                raise ValueError(f"level {level}: unknown storage class {sc!r} "
                                 f"(one of {', '.join(sorted(STORAGE_CLASSES))})")
            if sc in ARCHIVE_CLASSES:
                raise ValueError(
                    f"level {level}: {sc} objects cannot be read without a restore, and "
                    "ingress reads segments of every level (compaction its input levels); "
                    "use GLACIER_IR or an IA class, or a lifecycle rule for archives")
        return v

    @field_validator("part_size")
    @classmethod
    def _part_ok(cls, v: int) -> int:
        if not 5 * 1024**2 <= v <= 5 * 1024**3:
            raise ValueError(f"must be between 5MiB and 5GiB (S3 part limits), got {v}")
        return v

    @field_validator("multipart_copy_threshold")
    @classmethod
    def _copy_threshold_ok(cls, v: int) -> int:
        if not 5 * 1024**2 <= v <= 5 * 1024**3:
            raise ValueError(f"must be between 5MiB and 5GiB (a single CopyObject is limited "
                             f"to 5GiB), got {v}")
        return v

    @model_validator(mode="after")
    def _combination_ok(self) -> S3Settings:
        a, b = self.prefix + "/", self.temp_prefix + "/"
        if a.startswith(b) or b.startswith(a):
            raise ValueError(f"prefix {self.prefix!r} and temp_prefix {self.temp_prefix!r} "
                             "must not contain each other")
        if self.sse_kms_key_id and self.sse != "aws:kms":
            raise ValueError("sse_kms_key_id needs sse = 'aws:kms'")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key go together")
        return self

    def static_keys(self) -> tuple[str | None, str | None]:
        """``access_key_id`` and ``secret_access_key`` revealed for a client (both ``None``:
        the AWS credential chain).
        """
        if self.access_key_id is None or self.secret_access_key is None:
            return None, None       # set together or not at all (checked above)
        return self.access_key_id.get_secret_value(), self.secret_access_key.get_secret_value()

    def storage_class_for(self, level: int) -> str | None:
        """Storage class configured for a level, or ``None`` for the bucket default."""
        return self.storage_class.get(level)


ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
"""Storage classes whose objects must be restored before they can be read."""


class KafkaSettings(Model):
    """The Kafka cluster of this region (``[kafka]``)."""

    brokers: str = Field(description="bootstrap.servers of this region's cluster.")
    config: dict[str, KafkaValue] = Field(
        default_factory=dict,
        description="Extra librdkafka settings (security.protocol, sasl.*, ssl.*, ...). "
                    "Egress sets auto.offset.reset = error over it (a deleted position is "
                    "reported, never skipped) and partition.assignment.strategy = "
                    "cooperative-sticky unless given here.")

    @field_validator("brokers")
    @classmethod
    def _brokers_ok(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name at least one host:port")
        return v

    def masked_config(self) -> dict[str, KafkaValue]:
        """``config`` with secret values replaced by ``***``, for logs."""
        return {k: ("***" if is_secret_setting(k) else v) for k, v in self.config.items()}

    def __repr_args__(self) -> Any:
        # repr()/str() of any settings object (an f-string or %r in a log line or an error
        # message) must not show sasl.password & co.: only masked_config() is printed.
        for name, value in super().__repr_args__():
            yield name, (self.masked_config() if name == "config" else value)


class FormatSettings(Model):
    """Segment file format (``[format]``)."""

    name: str = Field("parquet", description=(
        "Segment format written: 'parquet' or 'arrow'. Readers recognise a segment's format "
        "from its own bytes, whatever this says."))
    compression: str = Field("zstd", description="Codec: zstd, lz4, snappy, gzip or none.")
    compression_level: int | None = Field(None, description="Codec level (codec default).")
    created_by: str = Field("kafka-s3-replicator", description="Written into segment footers.")
    row_group_size: Size = Field(
        32 * 1024**2, description="Raw bytes buffered per row group / IPC batch before it is "
                                  "written out; bounds writer memory.")

    @field_validator("compression")
    @classmethod
    def _codec_ok(cls, v: str) -> str:
        allowed = {"zstd", "lz4", "snappy", "gzip", "none", "uncompressed"}
        if v.lower() not in allowed:
            raise ValueError(f"unknown codec {v!r} (one of {', '.join(sorted(allowed))})")
        return v.lower()

    @field_validator("row_group_size")
    @classmethod
    def _rg_ok(cls, v: int) -> int:
        if not 64 * 1024 <= v <= 1024**3:
            raise ValueError(f"must be between 64KiB and 1GiB, got {v}")
        return v


class MetricsSettings(Model):
    """The /metrics, /healthz and /readyz endpoint (``[metrics]``)."""

    host: str = Field("0.0.0.0", description="Address to listen on.")
    port: int = Field(9464, ge=0, le=65535, description="Port; 0 disables the server.")


class LogSettings(Model):
    """Logging of the CLIs (``[log]``)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Level.")
    format: Literal["text", "json"] = Field("text", description="Line format.")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v
