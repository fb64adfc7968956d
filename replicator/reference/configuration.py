"""The configuration reference, generated from the settings models.

``python -m replicator.reference.configuration > docs/configuration.md`` rewrites it; a test
fails when the committed file and the models disagree, so the reference is never stale.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from datetime import timedelta
from importlib import resources
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from replicator.core.settings import (
    CatalogSettings,
    CompactionSettings,
    CompactionTopicSettings,
    EgressMirrorSettings,
    EgressSelectSettings,
    EgressSettings,
    EgressTopicSettings,
    FormatSettings,
    GroupExportSettings,
    IngressSettings,
    IngressSourceSettings,
    KafkaSettings,
    LogSettings,
    MetricsSettings,
    S3Settings,
    Settings,
    is_size_field,
)
from replicator.core.units import format_duration

SECTIONS: list[tuple[str, type[BaseModel], str]] = [
    ("(top level)", Settings, "Keys outside any table."),
    ("[s3]", S3Settings, "The bucket of this process's region."),
    ("[kafka]", KafkaSettings, "The Kafka cluster of this process's region."),
    ("[format]", FormatSettings, "How segments are encoded."),
    ("[metrics]", MetricsSettings, "The /metrics, /healthz and /readyz endpoint."),
    ("[log]", LogSettings, "Logging of the entry points."),
    ("[egress]", EgressSettings, "The egress controller (source region)."),
    ("[egress.select]", EgressSelectSettings, "Topics selected by name pattern."),
    ('[egress.topics."NAME"]', EgressTopicSettings,
     "Segment thresholds per source topic; [egress.topic_defaults] has the same keys (the "
     "thresholds of selected topics, and of keys a table leaves out)."),
    ("[egress.group_export]", GroupExportSettings,
     "Source consumer-group offsets exported next to the segments (docs/failover.md)."),
    ("[egress.mirror]", EgressMirrorSettings,
     "The low-RPO mode: each segment also copied into the destination region's bucket "
     "(off when absent; docs/sizing.md, \"Low-RPO mode\")."),
    ("[ingress]", IngressSettings, "The ingress controller (destination region)."),
    ("[[ingress.sources]]", IngressSourceSettings, "One entry per replicated source topic."),
    ("[compaction]", CompactionSettings, "The compaction job (per region)."),
    ('[compaction.topics."NAME"]', CompactionTopicSettings, "Compaction thresholds per topic."),
    ("[catalog]", CatalogSettings,
     "The archive as Apache Iceberg tables (docs/archive.md)."),
]

# Where a nested model is documented: the first section that shows its keys.
_SECTION_OF: dict[type[BaseModel], str] = {}
for _title, _model, _about in SECTIONS:
    _SECTION_OF.setdefault(_model, _title)


def _type_name(field: FieldInfo, annotation: Any) -> str:
    if annotation is timedelta:
        return "duration"
    if is_size_field(field.metadata):
        return "size"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = " \\| ".join(_type_name(field, a) for a in args)
        return f"{inner} (optional)" if len(args) < len(typing.get_args(annotation)) else inner
    if origin is dict:
        return "table"
    if origin is list:
        return "array of strings" if typing.get_args(annotation) == (str,) else "array of tables"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        title = _SECTION_OF.get(annotation)
        return f"table (`{title}`)" if title else "table"
    return getattr(annotation, "__name__", str(annotation)).replace("SecretStr", "string (secret)")


def _default(field: FieldInfo) -> str:  # noqa: C901 - one case per value kind
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            title = _SECTION_OF.get(type(value))
            return f"the defaults of `{title}`" if title else "(table)"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "**required**"
    if value is None:
        return "none"
    if isinstance(value, timedelta):
        return f'`"{format_duration(value)}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if is_size_field(field.metadata) and isinstance(value, int):
        for unit, n in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value % n == 0:
                return f'`"{value // n}{unit}"`'
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict) and not value:
        return "`{}`"
    if isinstance(value, list):
        return f"`{json.dumps(value)}`"  # TOML writes a list of strings the same way
    return f"`{value}`"


START_OPTIONS = (resources.files("replicator.reference") / "start_options.md").read_text()
"""The section after the tables: what each combination of egress and ingress ``start``
copies and skips (prose, kept as Markdown beside this module)."""


def render_reference() -> str:
    """Markdown: one table per section with key, type, default and meaning."""
    out = [
        "# Configuration reference",
        "",
        "Generated from `replicator/core/settings/` by "
        "`python -m replicator.reference.configuration`; do not edit by hand.",
        "",
        "Every key can be overridden by an environment variable "
        "`REPLICATOR_<SECTION>__<KEY>` (for example `REPLICATOR_S3__BUCKET`, "
        "`REPLICATOR_EGRESS__TOPICS__sensor.events__MAX_SEGMENT_AGE`, "
        "`REPLICATOR_INGRESS__SOURCES__0__LATE_SEGMENT_RETRIES`). Durations are strings such "
        "as `500ms`, `30s`, `5m`, `1h30m`; sizes are bytes or strings such as `64KiB`, "
        "`100MiB`, `1GiB`. Unknown keys, wrong types and impossible combinations stop the "
        "process at start (exit code 2) with the dotted key named.",
    ]
    for title, model, about in SECTIONS:
        out += ["", f"## `{title}`", "", about, "", "| key | type | default | meaning |",
                "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            if model is Settings and name not in ("region",):
                continue
            desc = (field.description or "").replace("|", "\\|")
            out.append(f"| `{name}` | {_type_name(field, field.annotation)} | "
                       f"{_default(field)} | {desc} |")
    return "\n".join(out) + "\n\n" + START_OPTIONS


if __name__ == "__main__":
    sys.stdout.write(render_reference())
