"""docs/configuration.md is generated from the settings models and must match them."""

from __future__ import annotations

from pathlib import Path

from replicator.core.settings import Settings
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
