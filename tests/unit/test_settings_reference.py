"""docs/configuration.md is generated from the settings models and must match them."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from replicator.core.settings import (
    EgressSettings,
    IngressSettings,
    S3Settings,
    Settings,
    is_size_field,
)
from replicator.reference.configuration import SECTIONS, render_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_committed_reference_matches_the_models() -> None:
    assert DOC.read_text() == render_reference(), (
        "docs/configuration.md is stale: run "
        "`python -m replicator.reference.configuration > docs/configuration.md`")


def test_every_key_is_documented_with_a_description() -> None:
    for _title, model, _about in SECTIONS:
        for name, field in model.model_fields.items():
            if model is Settings and name != "region":
                continue  # the sections have their own tables
            assert field.description, f"{model.__name__}.{name} has no description"


def _models_under(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """Every settings model reachable from ``model`` (tables, arrays and maps of tables)."""
    for name, field in model.model_fields.items():
        stack: list[Any] = [field.annotation]
        while stack:
            a = stack.pop()
            if isinstance(a, type) and issubclass(a, BaseModel):
                yield f"{path}.{name}".lstrip("."), a
                yield from _models_under(a, f"{path}.{name}")
            else:
                stack.extend(typing.get_args(a))


def _documented_keys() -> dict[str, set[str]]:
    """Section title → the keys of its table, read from the committed docs/configuration.md."""
    keys: dict[str, set[str]] = {}
    section = ""
    for line in DOC.read_text().splitlines():
        if m := re.fullmatch(r"## `(.+)`", line):
            section = m.group(1)
            keys[section] = set()
        elif m := re.match(r"\| `([^`]+)` \|", line):
            keys[section].add(m.group(1))
    return keys


def test_every_settings_key_nested_ones_included_is_in_the_reference() -> None:
    documented = _documented_keys()
    titles = {model: title for title, model, _about in reversed(SECTIONS)}
    missing = []
    for path, model in _models_under(Settings, ""):
        title = titles.get(model)
        if title is None:
            missing.append(f"{path} ({model.__name__}): no section")
            continue
        missing += [f"{path}.{name}" for name in model.model_fields
                    if name not in documented.get(title, set())]
    missing += [name for name in ("region",) if name not in documented["(top level)"]]
    assert not missing, f"settings keys missing from docs/configuration.md: {missing}"


def test_size_and_nested_table_keys_are_shown_as_such() -> None:
    text = DOC.read_text()
    assert "(table) |" not in text, "a nested table is shown as one row '(table)'"
    for model in (IngressSettings, EgressSettings, S3Settings):
        for name, field in model.model_fields.items():
            if is_size_field(field.metadata):
                row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
                assert row.split(" | ")[1] == "size", row
