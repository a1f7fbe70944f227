"""`pdbus keys generate|list`: CURVE key pairs for the bus, and the `[security]` section they serve.

Contract:
- `pdbus keys generate --name NAME [--dir DIR]` writes `NAME.key` and `NAME.key_secret` (0600,
  never overwritten) and prints the public key (the only key ever printed).
- `pdbus keys list` prints, per role, the keys `[security] admit` admits (name and fingerprint) and
  whether this process's own key pair loads.
- `security_config(settings, key_name, endpoint) -> SecurityConfig | None`: what every process
  (broker, nodes, gateway) builds its sockets with. `[security] enabled = "auto"` (the default)
  turns CURVE on for any non-loopback endpoint and stays plain on loopback; `true` / `false` force
  it; a plain non-loopback endpoint logs `bus_plaintext` as a warning. Missing keys fail closed with
  a SecurityError saying which file to create.

[security] keys: enabled ("auto" | true | false), key_dir (default "keys"), key (this process's key
pair name; default the caller's, e.g. its role), broker_key (name or inline public key of the
broker, default "broker"), admit = {prefill = [...], decode = [...], both = [...], gateway = [...]}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bus.log import get_logger
from bus.security import (
    SecurityConfig,
    SecurityError,
    admitted_keys,
    fingerprint,
    generate_keypair,
    is_loopback,
    load_keypair,
    load_public_key,
)
from nodes.settings import load_settings, section

DEFAULT_KEY_DIR = "keys"
log = get_logger("security")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # One positional action rather than nested subparsers: the common flags (--config, --log-*)
    # that cli.py adds must stay valid after the action.
    parser.add_argument("action", choices=["generate", "list"],
                        help="generate: write a key pair and print its public key; list: what the config admits")
    parser.add_argument("--name", help="key name for generate, e.g. broker, prefill-1, gateway")
    parser.add_argument("--dir", help="key directory (default: [security] key_dir)")


def _key_dir(settings: dict, override: str | None = None) -> Path:
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
    key_dir = _key_dir(settings)
    public, secret = load_keypair(key_dir, security.get("key") or key_name)
    admit = security.get("admit", {})
    if not isinstance(admit, dict):
        raise SecurityError("[security] admit must be a table of role = [key names]")
    server_key = load_public_key(key_dir, security.get("broker_key", "broker"))
    return SecurityConfig(public, secret, server_key, admitted_keys(key_dir, admit))


def _generate(args: argparse.Namespace, settings: dict) -> int:
    key_dir = _key_dir(settings, args.dir)
    public, _ = generate_keypair(key_dir, args.name)
    print(f"wrote {key_dir / args.name}.key and {args.name}.key_secret (0600)", file=sys.stderr)
    print(public.decode())
    return 0


def _list(args: argparse.Namespace, settings: dict) -> int:
    key_dir = _key_dir(settings, args.dir)
    admit: dict[str, Any] = section(settings, "security").get("admit", {})
    print(f"key dir: {key_dir}  enabled: {section(settings, 'security').get('enabled', 'auto')}")
    if not admit:
        print("no keys admitted ([security] admit is empty): a CURVE broker would refuse everyone")
    for role, names in sorted(admit.items()):
        for name in names:
            try:
                shown = fingerprint(load_public_key(key_dir, name))
            except SecurityError as exc:
                shown = f"MISSING ({exc})"
            print(f"{role:8} {name:24} {shown}")
    return 0


def main(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if args.action == "generate" and not args.name:
        print("pdbus keys generate: --name is required", file=sys.stderr)
        return 2
    try:
        return _generate(args, settings) if args.action == "generate" else _list(args, settings)
    except SecurityError as exc:
        print(f"pdbus keys: {exc}", file=sys.stderr)
        return 2
