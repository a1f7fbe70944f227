"""`pdbus keys generate|list`: CURVE key pairs for the bus, and the `[security]` section they serve.

Contract:
- `pdbus keys generate --name NAME [--dir DIR]` writes `NAME.key` and `NAME.key_secret` (0600,
  never overwritten) and prints the public key (the only key ever printed).
- `pdbus keys list` prints, per role, the keys `[security] admit` admits (name and fingerprint) and
  whether this process's own key pair loads.
The `[security]` section itself is read by `nodes/bus_config.py` (`security_config`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bus.security import (
    SecurityError,
    fingerprint,
    generate_keypair,
    load_public_key,
)
from nodes.bus_config import key_dir_of
from nodes.config_file import load_settings, section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # One positional action rather than nested subparsers: the common flags (--config, --log-*)
    # that cli.py adds must stay valid after the action.
    parser.add_argument("action", choices=["generate", "list"],
                        help="generate: write a key pair and print its public key; list: what the config admits")
    parser.add_argument("--name", help="key name for generate, e.g. broker, prefill-1, gateway")
    parser.add_argument("--dir", help="key directory (default: [security] key_dir)")


def _generate(args: argparse.Namespace, settings: dict) -> int:
    folder = key_dir_of(settings, args.dir)
    public, _ = generate_keypair(folder, args.name)
    print(f"wrote {folder / args.name}.key and {args.name}.key_secret (0600)", file=sys.stderr)
    print(public.decode())
    return 0


def _list(args: argparse.Namespace, settings: dict) -> int:
    folder = key_dir_of(settings, args.dir)
    admit: dict[str, Any] = section(settings, "security").get("admit", {})
    print(f"key dir: {folder}  enabled: {section(settings, 'security').get('enabled', 'auto')}")
    if not admit:
        print("no keys admitted ([security] admit is empty): a CURVE broker would refuse everyone")
    for role, names in sorted(admit.items()):
        for name in names:
            try:
                shown = fingerprint(load_public_key(folder, name))
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
