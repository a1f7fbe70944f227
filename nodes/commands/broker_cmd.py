"""`pdbus broker`: run the control-plane broker in the foreground.

Reads `[broker]` (endpoint, max_message_bytes), `[heartbeat]` (interval_ms, liveness) and
`[scheduler]` (the cluster routing policy: vnodes, epsilon, queue_size, queue_timeout_s,
retry_after_s, min_free_blocks, prefill_tokens_estimate, max_sessions) from the config; flags
override them. `--policy least-outstanding` runs the bus's default policy instead of the
scheduler. `[security]` (see nodes.commands.keys_cmd): CURVE with the `broker` key pair, admitting the
keys listed per role; on by default for a non-loopback endpoint. SIGINT/SIGTERM stop it cleanly
(nodes get DISCONNECT). With several brokers listed (comma-separated), `--index i` binds the i-th
(or the one `--endpoint` names); every broker of a cluster runs the same settings. `[broker] bind`,
a list parallel to `endpoint`, binds another address than the one peers dial (`tcp://0.0.0.0:5555`
where they dial a name that follows the broker, a Kubernetes Service).
"""

from __future__ import annotations

import argparse

from bus import constants as c
from bus.broker import run_broker
from bus.routing import LeastOutstandingPolicy, RoutingPolicy
from bus.security import SecurityError
from nodes.bus_config import heartbeat_config, security_config
from nodes.config_file import SettingsError, load_settings, section
from scheduler.policy import ClusterPolicy, SchedulerSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help=f"ROUTER endpoint to bind (default: [broker] endpoint, {c.DEFAULT_ENDPOINT})")
    parser.add_argument("--index", type=int, default=0,
                        help="with several brokers in [broker] endpoint (comma-separated): bind the INDEX-th (from 0)")
    parser.add_argument("--heartbeat-ms", type=int, help="heartbeat interval in milliseconds")
    parser.add_argument("--heartbeat-idle-ms", type=int,
                        help="heartbeat interval of a serving node's link with no request (default 1000)")
    parser.add_argument("--liveness", type=int, help="missed heartbeats before a node is dead")
    parser.add_argument("--policy", choices=["cluster", "least-outstanding"], default="cluster",
                        help="routing policy: the cluster scheduler (default) or fewest outstanding")


def routing_policy(settings: dict, name: str = "cluster") -> RoutingPolicy:
    """The broker's routing policy; `cluster` reads `[scheduler]`."""
    if name == "least-outstanding":
        return LeastOutstandingPolicy()
    try:
        return ClusterPolicy(SchedulerSettings.from_settings(section(settings, "scheduler")))
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"[scheduler]: {exc}") from exc


def own_endpoint(listed: str, index: int) -> str:
    """This broker's address among the cluster's brokers (docs/PROTOCOL.md §1.12)."""
    brokers = [part.strip() for part in str(listed).split(",")]
    if not 0 <= index < len(brokers) or not brokers[index]:
        raise SettingsError(f"--index {index}: [broker] endpoint lists {len(brokers)} broker(s): {listed!r}")
    return brokers[index]


def bind_address(broker: dict, endpoint: str, index: int) -> str:
    """Where this broker binds: `[broker] bind`'s entry for it when the config has one (a list
    parallel to `[broker] endpoint`: bind `tcp://0.0.0.0:5555` where peers dial a name that follows
    the broker, a Kubernetes Service), else the address peers dial."""
    if not broker.get("bind"):
        return endpoint
    listed = [part.strip() for part in str(broker.get("endpoint", c.DEFAULT_ENDPOINT)).split(",")]
    binds = [part.strip() for part in str(broker["bind"]).split(",")]
    if len(binds) != len(listed) or not all(binds):
        raise SettingsError(f"[broker] bind lists {len(binds)} address(es) for {len(listed)} broker(s) in endpoint")
    return binds[listed.index(endpoint) if endpoint in listed else index]


def main(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    broker = section(settings, "broker")
    index = getattr(args, "index", 0)
    endpoint = args.endpoint or own_endpoint(broker.get("endpoint", c.DEFAULT_ENDPOINT), index)
    endpoint = bind_address(broker, endpoint, index)
    max_bytes = int(broker.get("max_message_bytes", c.DEFAULT_MAX_MESSAGE_BYTES))
    policy = routing_policy(settings, getattr(args, "policy", "cluster"))
    try:
        security = security_config(settings, "broker", endpoint)
    except SecurityError as exc:
        raise SettingsError(f"[security]: {exc}") from exc
    return run_broker(endpoint, heartbeat_config(settings, args), max_bytes, policy, security)
