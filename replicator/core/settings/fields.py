"""The building blocks of the settings models: the frozen base model, duration and size
fields, and which Kafka settings are secrets.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer

from replicator.core.units import format_duration, parse_duration, parse_size


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


def at_least(v: timedelta, minimum: timedelta, why: str) -> timedelta:
    """``v`` when it is at least ``minimum``; else a ``ValueError`` saying why (field
    validators: the process stops at start with exit 2 naming the key).
    """
    if v < minimum:
        raise ValueError(f"must be at least {format_duration(minimum)} ({why}), got "
                         f"{format_duration(v)}")
    return v
Size = Annotated[int, BeforeValidator(_size)]
"""A byte count written as an int or ``64KiB``, ``100MiB``, ``1GiB``."""

KafkaValue = str | int | float | bool


def is_size_field(metadata: list[Any]) -> bool:
    """True when a field's pydantic ``metadata`` marks it as a :data:`Size` (for the docs)."""
    return any(getattr(m, "func", None) is _size for m in metadata)

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


class Model(BaseModel):
    """Every settings section: frozen, unknown keys refused, defaults validated."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class KeyedValueError(ValueError):
    """A model-level validation error that knows the exact key it is about."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)
