"""Cluster configuration: TOML files under `config/`, overridden by environment and flags.

Contract: `load_settings(path)` returns a plain nested dict. Precedence, lowest first:
built-in defaults given by each consumer, the TOML file, then environment variables named
`PDBUS__<SECTION>__<KEY>` (values parsed as TOML literals, so `250`, `true`, `"tcp://..."`
all work; a bare word is taken as a string), then CLI flags applied by the caller.
Sections are owned by their consumers (`[broker]`, `[heartbeat]`, `[engine]`, `[kv]`, ...).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

ENV_PREFIX = "PDBUS__"
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config" / "local.toml"


class SettingsError(ValueError):
    """The configuration file is missing, unreadable or malformed."""


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _apply_env(settings: dict[str, Any], environ: dict[str, str]) -> None:
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split("__") if part]
        if not path:
            continue
        node = settings
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _parse_env_value(raw)


def load_settings(path: str | Path | None = None,
                  environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Read the TOML file at `path` (default `config/local.toml` when present) plus env overrides."""
    settings: dict[str, Any] = {}
    file = Path(path) if path else (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    if file is not None:
        try:
            settings = tomllib.loads(file.read_text())
        except FileNotFoundError as exc:
            raise SettingsError(f"config file not found: {file}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {file} is not valid TOML: {exc}") from exc
    _apply_env(settings, dict(os.environ if environ is None else environ))
    return settings


def whole_number(value: object, where: str) -> int:
    """`value` when it is a whole number >= 0 (a bool is not); else a SettingsError naming `where`,
    the setting as a reader finds it ("[decode] lend_max_running")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"{where} must be a whole number >= 0, got {value!r}")
    return value


def section(settings: dict[str, Any], name: str) -> dict[str, Any]:
    """The `[name]` table, or an empty dict when absent."""
    value = settings.get(name, {})
    if not isinstance(value, dict):
        raise SettingsError(f"[{name}] must be a table, got {type(value).__name__}")
    return value
