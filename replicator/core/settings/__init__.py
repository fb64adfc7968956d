"""Typed, frozen settings: one TOML file per process plus environment overrides
(docs/configuration.md lists every key; docs/architecture.md, "Configuration").

``load_settings(path)`` reads the file, applies ``REPLICATOR_<SECTION>__<KEY>`` variables
(``REPLICATOR_REGION``, ``REPLICATOR_S3__BUCKET``,
``REPLICATOR_EGRESS__TOPICS__t__MAX_SEGMENT_AGE``,
``REPLICATOR_INGRESS__SOURCES__0__LATE_SEGMENT_RETRIES``), validates everything and returns a
frozen ``Settings``. Every problem is reported as a ``ConfigError`` naming the dotted key.

Modules: ``fields`` (base model, durations, sizes, secrets), ``sections`` (s3, kafka,
format, metrics, log), ``egress``, ``ingress`` and ``compaction`` (the service sections;
``services`` gathers them), ``names`` (name checks they share), ``root`` (``Settings``),
``loader`` (file, environment, validation).
"""

from __future__ import annotations

from replicator.core.settings.catalog import CatalogSettings
from replicator.core.settings.fields import (
    STORAGE_CLASSES,
    Duration,
    KafkaValue,
    Size,
    is_secret_setting,
    is_size_field,
)
from replicator.core.settings.loader import (
    ENV_PREFIX,
    apply_env_overrides,
    load_settings,
    validate_settings,
)
from replicator.core.settings.root import Settings
from replicator.core.settings.sections import (
    FormatSettings,
    KafkaSettings,
    LogSettings,
    MetricsSettings,
    S3Settings,
)
from replicator.core.settings.services import (
    CompactionSettings,
    CompactionTopicSettings,
    EgressMirrorSettings,
    EgressSelectSettings,
    EgressSettings,
    EgressTopicSettings,
    GroupExportSettings,
    IngressSettings,
    IngressSourceSettings,
)

__all__ = [
    "ENV_PREFIX",
    "STORAGE_CLASSES",
    "CatalogSettings",
    "CompactionSettings",
    "CompactionTopicSettings",
    "Duration",
    "EgressMirrorSettings",
    "EgressSelectSettings",
    "EgressSettings",
    "EgressTopicSettings",
    "FormatSettings",
    "GroupExportSettings",
    "IngressSettings",
    "IngressSourceSettings",
    "KafkaSettings",
    "KafkaValue",
    "LogSettings",
    "MetricsSettings",
    "S3Settings",
    "Settings",
    "Size",
    "apply_env_overrides",
    "is_secret_setting",
    "is_size_field",
    "load_settings",
    "validate_settings",
]
