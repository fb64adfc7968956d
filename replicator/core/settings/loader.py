"""Loading settings: the TOML file, ``REPLICATOR_<SECTION>__<KEY>`` environment overrides,
validation with every problem named by its dotted key.

Settings are read once, in the entry point, and passed down; nothing else reads the
environment.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from replicator.core.errors import ConfigError, ConfigErrors
from replicator.core.settings.fields import KeyedValueError
from replicator.core.settings.root import Settings

ENV_PREFIX = "REPLICATOR_"


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
            if isinstance(ctx_err, KeyedValueError):
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
