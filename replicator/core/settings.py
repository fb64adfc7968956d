"""Typed, frozen settings: one TOML file per process plus environment overrides (SPEC 3.4).

``load_settings(path)`` reads the file, applies ``REPLICATOR_<SECTION>__<KEY>`` variables
(``REPLICATOR_REGION``, ``REPLICATOR_S3__BUCKET``,
``REPLICATOR_EGRESS__TOPICS__t__MAX_SEGMENT_AGE``,
``REPLICATOR_INGRESS__SOURCES__0__LATE_SEGMENT_RETRIES``), validates everything and returns a
frozen ``Settings``. Every problem is reported as a ``ConfigError`` naming the dotted key.
Settings are read once, in the entry point, and passed down; nothing else reads the
environment.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from replicator.core.errors import ConfigError, ConfigErrors, KeyFormatError
from replicator.core.keys import check_prefix, check_region, check_topic
from replicator.core.units import format_duration, parse_duration, parse_size

ENV_PREFIX = "REPLICATOR_"


def _duration(v: Any) -> timedelta:
    if isinstance(v, timedelta):
        return v
    if isinstance(v, str):
        return parse_duration(v)
    raise ValueError(f"expected a duration string like '500ms', '30s', '5m', '1h30m', got {v!r}")


def _size(v: Any) -> int:
    if isinstance(v, int | str) and not isinstance(v, bool):
        return parse_size(v)
    raise ValueError(f"expected a size (bytes, or a string like '100MiB'), got {v!r}")


Duration = Annotated[timedelta, BeforeValidator(_duration), PlainSerializer(format_duration)]
"""A duration written as ``500ms``, ``30s``, ``5m``, ``1h30m``."""
Size = Annotated[int, BeforeValidator(_size)]
"""A byte count written as an int or ``64KiB``, ``100MiB``, ``1GiB``."""

KafkaValue = str | int | float | bool

STORAGE_CLASSES = frozenset({
    "STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING",
    "GLACIER", "DEEP_ARCHIVE", "GLACIER_IR", "OUTPOSTS", "SNOW", "EXPRESS_ONEZONE",
})

# librdkafka settings whose values must never be logged.
_SECRET_MARKERS = ("password", "secret", "token", "sasl.oauthbearer.config", "key.pem")


def is_secret_setting(name: str) -> bool:
    """True for setting names whose value must be masked when printed."""
    n = name.lower()
    return any(m in n for m in _SECRET_MARKERS)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


# --- shared sections -----------------------------------------------------------------


class S3Settings(_Model):
    """Where segments live (``[s3]``)."""

    bucket: str = Field(description="Bucket of this region's segments.")
    prefix: str = Field("data", description="Key prefix of final segments (SPEC 3.1).")
    temp_prefix: str = Field("temp", description="Key prefix of objects still being written.")
    endpoint_url: str | None = Field(None, description="Endpoint of an S3-compatible store.")
    region: str | None = Field(
        None, description="AWS region of the bucket's client (default: the process region).")
    access_key_id: SecretStr | None = Field(
        None, description="Static access key (default: the AWS credential chain).")
    secret_access_key: SecretStr | None = Field(None, description="Static secret key.")
    storage_class: dict[int, str] = Field(
        default_factory=dict,
        description="Storage class per segment level, e.g. {\"0\" = \"STANDARD\"}.")
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

    def storage_class_for(self, level: int) -> str | None:
        """Storage class configured for a level, or ``None`` for the bucket default."""
        return self.storage_class.get(level)


class KafkaSettings(_Model):
    """The Kafka cluster of this region (``[kafka]``)."""

    brokers: str = Field(description="bootstrap.servers of this region's cluster.")
    config: dict[str, KafkaValue] = Field(
        default_factory=dict,
        description="Extra librdkafka settings (security.protocol, sasl.*, ssl.*, ...).")

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


class FormatSettings(_Model):
    """Segment file format (``[format]``)."""

    name: str = Field("parquet", description="Segment format: 'parquet' or 'arrow'.")
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


class MetricsSettings(_Model):
    """The /metrics, /healthz and /readyz endpoint (``[metrics]``)."""

    host: str = Field("0.0.0.0", description="Address to listen on.")
    port: int = Field(9464, ge=0, le=65535, description="Port; 0 disables the server.")


class LogSettings(_Model):
    """Logging of the CLIs (``[log]``)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Level.")
    format: Literal["text", "json"] = Field("text", description="Line format.")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


# --- egress --------------------------------------------------------------------------


class EgressTopicSettings(_Model):
    """Segment thresholds of one source topic (``[egress.topics."name"]``)."""

    max_segment_messages: int = Field(1_000_000, ge=1, description="Close after N messages.")
    max_segment_size: Size = Field(100 * 1024**2, description="Close after N raw record bytes.")
    max_segment_age: Duration = Field(
        timedelta(minutes=5), description="Close this long after the segment's first message.")

    @field_validator("max_segment_size")
    @classmethod
    def _size_ok(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be at least 1 byte")
        return v

    @field_validator("max_segment_age")
    @classmethod
    def _age_ok(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be positive")
        return v


class EgressSettings(_Model):
    """The egress controller (``[egress]``)."""

    group_id: str = Field("replicator.egress", description="Consumer group of egress workers.")
    topics: dict[str, EgressTopicSettings] = Field(description="Source topics to replicate.")
    max_buffered_bytes: Size = Field(
        256 * 1024**2, description="Memory budget of all open segments of this process.")
    shutdown_timeout: Duration = Field(
        timedelta(seconds=30), description="On revoke/SIGTERM, open segments that cannot be made "
                                           "durable within this time are aborted.")
    topic_metadata_interval: Duration = Field(
        timedelta(minutes=1), description="How often partition counts are checked for "
                                          "_topic.json.")
    upload_threads: int = Field(4, ge=1, le=64, description="Parallel S3 uploads.")
    memory_pool: Literal["system", "mimalloc", "jemalloc"] = Field(
        "system", description="Arrow allocator of the egress process. 'system' keeps RSS "
                              "close to max_buffered_bytes whatever the partition count; "
                              "mimalloc keeps freed memory per thread.")

    @field_validator("topics")
    @classmethod
    def _topics_ok(cls, v: dict[str, EgressTopicSettings]) -> dict[str, EgressTopicSettings]:
        if not v:
            raise ValueError("name at least one topic")
        for t in v:
            try:
                check_topic(t)
            except KeyFormatError as e:
                raise ValueError(str(e)) from e
        return v


# --- ingress -------------------------------------------------------------------------


class IngressSourceSettings(_Model):
    """One replicated source (``[[ingress.sources]]``)."""

    region: str = Field(description="Region the source topic lives in.")
    topic: str = Field(description="Source topic name.")
    destination_topic: str | None = Field(None, description="Destination topic (default: same).")
    lost_segment_timeout: Duration = Field(
        timedelta(hours=1), description="How long a gap waits before it is declared lost.")
    late_segment_retries: int = Field(5, description="Segment list reloads within the timeout.")
    first_segment_delay: Duration = Field(
        timedelta(minutes=5), description="Wait for earlier segments when no checkpoint exists.")

    @field_validator("late_segment_retries")
    @classmethod
    def _retries_ok(cls, v: int) -> int:
        if not 1 <= v <= 50:
            raise ValueError(f"must be between 1 and 50, got {v}")
        return v

    @field_validator("topic", "destination_topic")
    @classmethod
    def _topic_ok(cls, v: str | None) -> str | None:
        try:
            return None if v is None else check_topic(v)
        except KeyFormatError as e:
            raise ValueError(str(e)) from e

    @field_validator("region")
    @classmethod
    def _region_ok(cls, v: str) -> str:
        try:
            return check_region(v)
        except KeyFormatError as e:
            raise ValueError(str(e)) from e

    @property
    def destination(self) -> str:
        """The destination topic name."""
        return self.destination_topic or self.topic


class IngressSettings(_Model):
    """The ingress controller (``[ingress]``)."""

    group_id: str = Field("replicator.ingress", description="Consumer group of ingress workers.")
    sqs_queue: str = Field(description="SQS queue (name or URL) receiving the bucket's events.")
    sqs_endpoint_url: str | None = Field(None, description="SQS endpoint (default: AWS / "
                                                           "s3.endpoint_url).")
    segment_events_topic: str = Field("replicator.segmentevents", description="Events topic.")
    segment_events_retention: Duration = Field(timedelta(hours=1), description="Its retention.")
    checkpoint_topic: str = Field("replicator.checkpoint", description="Checkpoint topic.")
    delivery: Literal["exactly-once", "at-least-once"] = Field(
        "exactly-once", description="Transactional or idempotent replay.")
    batch_size: int = Field(10_000, ge=1, description="Records per produced batch/transaction.")
    sources: list[IngressSourceSettings] = Field(description="Sources to replay.")
    sqs_wait_time: Duration = Field(
        timedelta(seconds=20), description="SQS long-poll wait per receive (at most 20s).")
    sqs_max_messages: int = Field(10, ge=1, le=10, description="SQS messages per receive.")
    topic_check_interval: Duration = Field(
        timedelta(seconds=30), description="How often _topic.json of each source is read to "
                                           "create or grow its destination topic.")
    rescan_interval: Duration = Field(
        timedelta(minutes=5), description="An idle worker re-lists its segments this often "
                                          "(a safety net for lost S3 events).")
    revoke_timeout: Duration = Field(
        timedelta(seconds=30), description="On revoke/SIGTERM, how long workers may take to "
                                           "finish their current batch.")
    max_parallel_replays: int = Field(
        8, ge=1, description="Segments replayed at once by this process (each holds about "
                             "two batches in memory), whatever the number of partitions.")

    @field_validator("sqs_wait_time")
    @classmethod
    def _sqs_wait_ok(cls, v: timedelta) -> timedelta:
        # SQS long polls 1-20 whole seconds; 0 would make the relay spin on short polls.
        if not timedelta(seconds=1) <= v <= timedelta(seconds=20) or v.microseconds:
            raise ValueError(f"must be whole seconds between 1s and 20s, got {v}")
        return v

    @model_validator(mode="after")
    def _unique_sources(self) -> IngressSettings:
        seen: set[tuple[str, str]] = set()
        for s in self.sources:
            if (s.region, s.topic) in seen:
                raise ValueError(f"source {s.region}/{s.topic} is listed twice")
            seen.add((s.region, s.topic))
        if not self.sources:
            raise ValueError("sources: name at least one source")
        return self


# --- compaction ----------------------------------------------------------------------


class CompactionTopicSettings(_Model):
    """Compaction thresholds of one topic (``[compaction.topics."name"]``)."""

    min_level: int = Field(0, ge=0, description="Lowest input level.")
    max_level: int = Field(0, ge=0, description="Highest input level.")
    min_segment_age: Duration = Field(timedelta(hours=1), description="Only older inputs.")
    min_segment_count: int = Field(10, ge=1, description="Skip runs with fewer inputs.")
    min_segment_size: Size = Field(1024**3, description="Skip runs with fewer bytes.")
    max_segment_count: int = Field(1000, ge=1, description="Inputs per output, at most.")
    max_segment_size: Size = Field(4 * 1024**3, description="Bytes per output, at most.")
    batch_size: int = Field(10_000, ge=1, description="Records per streamed batch.")
    delete: bool = Field(True, description="Delete inputs after the output is durable.")

    @model_validator(mode="after")
    def _combination_ok(self) -> CompactionTopicSettings:
        if self.min_level > self.max_level:
            raise ValueError(f"min_level ({self.min_level}) > max_level ({self.max_level})")
        if self.min_segment_count > self.max_segment_count:
            raise ValueError(f"min_segment_count ({self.min_segment_count}) > "
                             f"max_segment_count ({self.max_segment_count})")
        if self.min_segment_size > self.max_segment_size:
            raise ValueError(f"min_segment_size ({self.min_segment_size}) > "
                             f"max_segment_size ({self.max_segment_size})")
        return self


class CompactionSettings(_Model):
    """The compaction job (``[compaction]``)."""

    schedule: str = Field("0 1 * * *", description="Cron: 5 fields, or 6 fields seconds-first.")
    parallelism: int = Field(8, ge=1, description="Merge tasks run at once.")
    spark_master: str = Field(
        "local[*]", description="Spark master URL (local[*], spark://..., k8s://...); "
                                "\"inline\" merges in this process without Spark; \"\" "
                                "takes the master from spark-submit.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings.")
    lock_ttl: Duration = Field(timedelta(hours=2), description="Expiry of the region lock.")
    topics: dict[str, CompactionTopicSettings] = Field(description="Topics to compact.")

    @field_validator("schedule")
    @classmethod
    def _cron_ok(cls, v: str) -> str:
        from replicator.core.cron import parse_cron  # local: croniter only when validating

        parse_cron(v)
        return v

    @field_validator("topics")
    @classmethod
    def _topics_ok(cls, v: dict[str, CompactionTopicSettings]) -> dict[str, Any]:
        for t in v:
            try:
                check_topic(t)
            except KeyFormatError as e:
                raise ValueError(str(e)) from e
        return v


# --- root ----------------------------------------------------------------------------


class Settings(_Model):
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

    @field_validator("region")
    @classmethod
    def _region_ok(cls, v: str) -> str:
        try:
            return check_region(v)
        except KeyFormatError as e:
            raise ValueError(str(e)) from e

    @model_validator(mode="after")
    def _sources_remote(self) -> Settings:
        if self.ingress is not None:
            for i, s in enumerate(self.ingress.sources):
                if s.region == self.region:
                    raise _KeyedValueError(
                        f"ingress.sources.{i}.region",
                        f"source region {s.region!r} is this process's own region; ingress "
                        "replays segments of other regions")
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
        return data


class _KeyedValueError(ValueError):
    """A model-level validation error that knows the exact key it is about."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


# --- loading -------------------------------------------------------------------------


def load_settings(path: str | Path | None = None, *, data: Mapping[str, Any] | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    """Read, override and validate settings.

    Args:
        path: the TOML file (``--config``); may be omitted when ``data`` is given.
        data: already-parsed settings (tests, library use); merged under the file.
        environ: environment for overrides (default ``os.environ``).

    Raises:
        ConfigError: for an unreadable file or invalid TOML.
        ConfigErrors: one entry per invalid key, each naming its dotted key.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError("--config", f"file not found: {p}") from e
        except OSError as e:
            raise ConfigError("--config", f"cannot read {p}: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError("--config", f"{p} is not valid TOML: {e}") from e
    if data:
        # Deep copy: the environment overrides below edit the tree in place, and must not
        # edit the caller's mapping.
        raw = _deep_merge(raw, copy.deepcopy(dict(data)))
    origin = apply_env_overrides(raw, os.environ if environ is None else environ)
    return validate_settings(raw, origin)


def validate_settings(raw: Mapping[str, Any], origin: Mapping[str, str] | None = None
                      ) -> Settings:
    """Validate a parsed settings tree; ``origin`` maps dotted keys to env var names."""
    try:
        return Settings.model_validate(raw)
    except ValidationError as e:
        errors = []
        for err in e.errors(include_url=False):
            ctx_err = (err.get("ctx") or {}).get("error")
            loc = ".".join(str(p) for p in err["loc"])
            if isinstance(ctx_err, _KeyedValueError):
                loc = ctx_err.key
            msg = _message(err)
            if origin and loc in origin:
                msg += f" (from environment variable {origin[loc]})"
            errors.append(ConfigError(loc or "<root>", msg))
        raise ConfigErrors(errors) from None


def _message(err: Any) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = str(err["msg"])
    for lead in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(lead)
    if "input" in err and kind not in ("value_error",) and not isinstance(err["input"], dict):
        msg += f" (got {err['input']!r})"
    return msg


def apply_env_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """Apply ``REPLICATOR_<SECTION>__<KEY>`` variables to ``raw`` in place.

    Section and field names match case-insensitively; a path into an existing table
    (a topic name) matches its existing key case-insensitively, and a new key keeps its
    case unless it is all capitals. Tables, arrays and quoted strings are read as TOML
    (``{a = 1}``, ``"x"``); anything else stays text for pydantic to convert.

    Returns:
        dotted key -> environment variable name, for error messages.
    """
    origin: dict[str, str] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        parts = [p for p in name[len(ENV_PREFIX):].split("__")]
        if not all(parts):
            continue
        node: Any = raw
        path: list[str] = []
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(".".join([*path, part.lower()]),
                                      f"no such list entry (from environment variable {name})")
                idx = int(part)
                path.append(str(idx))
                if last:
                    node[idx] = _env_value(environ[name])
                else:
                    node = node[idx]
                continue
            # A new key written in capitals is a field name (``MAX_SEGMENT_AGE``); one with
            # lower-case letters is a name the user chose (a topic ``MyTopic``): keep it.
            new_key = part.lower() if part == part.upper() else part
            key = next((k for k in node if k.lower() == part.lower()), new_key)
            path.append(key)
            if last:
                node[key] = _env_value(environ[name])
            else:
                node = node.setdefault(key, {})
                if not isinstance(node, dict | list):
                    raise ConfigError(".".join(path), f"is not a table (from environment "
                                                      f"variable {name})")
        origin[".".join(path)] = name
    return origin


def _env_value(text: str) -> Any:
    # Tables, arrays and quoted strings are read as TOML; a bare scalar stays the text, so
    # a string setting may be "123" or "true" (a bucket named 123) and pydantic still turns
    # "10" or "true" into an int or bool where the field wants one.
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return value if isinstance(value, dict | list | str) else text


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
