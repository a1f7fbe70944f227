"""`pdbus broker`: run the control-plane broker in the foreground.

Reads `[broker]` (endpoint, max_message_bytes) and `[heartbeat]` (interval_ms, liveness) from
the config; flags override them. SIGINT/SIGTERM stop it cleanly (nodes get DISCONNECT).
"""

from __future__ import annotations

import argparse

from bus import constants as c
from bus.broker import run_broker
from bus.liveness import HeartbeatConfig
from nodes.settings import load_settings, section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help=f"ROUTER endpoint to bind (default {c.DEFAULT_ENDPOINT})")
    parser.add_argument("--heartbeat-ms", type=int, help="heartbeat interval in milliseconds")
    parser.add_argument("--liveness", type=int, help="missed heartbeats before a node is dead")


def heartbeat_config(settings: dict, args: argparse.Namespace) -> HeartbeatConfig:
    """`[heartbeat]` from the config, overridden by --heartbeat-ms / --liveness."""
    heartbeat = dict(section(settings, "heartbeat"))
    if getattr(args, "heartbeat_ms", None):
        heartbeat["interval_ms"] = args.heartbeat_ms
    if getattr(args, "liveness", None):
        heartbeat["liveness"] = args.liveness
    return HeartbeatConfig.from_settings(heartbeat)


def main(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    broker = section(settings, "broker")
    endpoint = args.endpoint or broker.get("endpoint", c.DEFAULT_ENDPOINT)
    max_bytes = int(broker.get("max_message_bytes", c.DEFAULT_MAX_MESSAGE_BYTES))
    return run_broker(endpoint, heartbeat_config(settings, args), max_bytes)
