"""Key fixtures for security tests: a key directory with broker, node and intruder key pairs."""

from __future__ import annotations

from pathlib import Path

from bus.security import SecurityConfig, admitted_keys, generate_keypair

ADMIT = {"prefill": ["prefill"], "decode": ["decode"], "both": ["both"], "gateway": ["gateway"]}


def make_keys(key_dir: Path) -> dict[str, tuple[bytes, bytes]]:
    """Key pairs broker, prefill, decode, both, gateway (admitted) and intruder (not)."""
    return {name: generate_keypair(key_dir, name)
            for name in ("broker", "prefill", "decode", "both", "gateway", "intruder")}


def config_for(keys: dict, key_dir: Path, name: str, admit: dict | None = None) -> SecurityConfig:
    public, secret = keys[name]
    return SecurityConfig(public, secret, keys["broker"][0], admitted_keys(key_dir, admit or ADMIT))
