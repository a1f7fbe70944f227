"""The bus sections of the cluster config, as every process builds its sockets from them.

Contract:
- `heartbeat_config(settings, args) -> HeartbeatConfig`: `[heartbeat]`, overridden by the
  --heartbeat-ms / --heartbeat-idle-ms / --liveness flags when `args` has them.
- `security_config(settings, key_name, endpoint) -> SecurityConfig | None`: this process's CURVE
  settings for a bus at `endpoint` (None: plain TCP). `[security] enabled = "auto"` (the default)
  turns CURVE on for any non-loopback endpoint and stays plain on loopback; `true` / `false` force
  it; a plain non-loopback endpoint logs `bus_plaintext` as a warning. Missing keys fail closed
  with a SecurityError saying which file to create. `wants_curve`, `key_dir_of` are its parts.
[security] keys: enabled ("auto" | true | false), key_dir (default "keys"), key (this process's key
pair name; default the caller's, e.g. its role), broker_key (name or inline public key of the
broker, default "broker"), admit = {prefill = [...], decode = [...], both = [...], gateway = [...]}.
Settings modules never import the CLI: `nodes/commands/` imports this, not the other way round.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bus.liveness import HeartbeatConfig
from bus.log import get_logger
from bus.security import (
    SecurityConfig,
    SecurityError,
    admitted_keys,
    is_loopback,
    load_keypair,
    load_public_key,
)
from nodes.config_file import section

DEFAULT_KEY_DIR = "keys"
log = get_logger("security")


def heartbeat_config(settings: dict, args: argparse.Namespace) -> HeartbeatConfig:
    """`[heartbeat]` from the config, overridden by --heartbeat-ms / --heartbeat-idle-ms / --liveness."""
    heartbeat = dict(section(settings, "heartbeat"))
    if getattr(args, "heartbeat_ms", None):
        heartbeat["interval_ms"] = args.heartbeat_ms
    if getattr(args, "heartbeat_idle_ms", None):
        heartbeat["idle_interval_ms"] = args.heartbeat_idle_ms
    if getattr(args, "liveness", None):
        heartbeat["liveness"] = args.liveness
    return HeartbeatConfig.from_settings(heartbeat)


def key_dir_of(settings: dict, override: str | None = None) -> Path:
    return Path(override or section(settings, "security").get("key_dir", DEFAULT_KEY_DIR)).expanduser()


def wants_curve(settings: dict, endpoint: str) -> bool:
    enabled = section(settings, "security").get("enabled", "auto")
    if enabled == "auto":
        return not is_loopback(endpoint)
    if not isinstance(enabled, bool):
        raise SecurityError(f'[security] enabled must be "auto", true or false, got {enabled!r}')
    return enabled


def security_config(settings: dict, key_name: str, endpoint: str) -> SecurityConfig | None:
    """This process's CURVE settings for a bus at `endpoint`; None means plain TCP."""
    if not wants_curve(settings, endpoint):
        if not is_loopback(endpoint):
            log.warning("bus_plaintext", endpoint=endpoint,
                        why="[security] enabled = false on a non-loopback endpoint: prompts and KV "
                            "cross the network unencrypted and anyone reaching it may join the bus")
        return None
    security = section(settings, "security")
    folder = key_dir_of(settings)
    public, secret = load_keypair(folder, security.get("key") or key_name)
    admit = security.get("admit", {})
    if not isinstance(admit, dict):
        raise SecurityError("[security] admit must be a table of role = [key names]")
    server_key = load_public_key(folder, security.get("broker_key", "broker"))
    return SecurityConfig(public, secret, server_key, admitted_keys(folder, admit))
