"""`pdbus gateway`: the OpenAI-compatible HTTP/SSE + WebSocket gateway (docs/API.md).

Contract: `add_arguments(parser)` and `main(args) -> int`. Reads `[gateway]` (host, port,
model_name, api_keys, rate limits, limits, stall timeout), `[broker] endpoint`, `[engine] model`
(for the tokenizer; the weights stay on the nodes) and `[kv]` (the KV mode it reports); flags
override; `[security]` (CURVE with the `gateway` key pair, see nodes.commands.keys_cmd) and
`[gateway] tls_cert`/`tls_key` (HTTPS/WSS). Registers with the broker as a bus client (waits up to `--broker-timeout`), logs
`gateway_started` with its URL, serves until SIGINT/SIGTERM. Exit 1 when no broker answers or
the port is taken, 2 for bad settings or model.
"""

from __future__ import annotations

import argparse
import sys

from bus.security import SecurityError
from nodes.bus_config import security_config
from nodes.config_file import SettingsError, load_settings, section
from nodes.node_settings import DEFAULT_MODEL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (default: [gateway] host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: [gateway] port, 8000; 0 = any free port)")
    parser.add_argument("--broker", help="broker endpoint (default: [broker] endpoint)")
    parser.add_argument("--model", help="the cluster's model, for its tokenizer (default: [engine] model)")
    parser.add_argument("--model-dir", help="model cache directory")
    parser.add_argument("--model-name", help="the name clients use in `model` (default: [gateway] model_name)")
    parser.add_argument("--node-id", help="bus node id (default: gateway-<random>)")
    parser.add_argument("--key", help="CURVE key pair name in [security] key_dir (default: gateway)")
    parser.add_argument("--broker-timeout", type=float, default=30.0, help="seconds to wait for the broker")


def main(args: argparse.Namespace) -> int:
    from bus import constants as c
    from bus.liveness import HeartbeatConfig
    from nodes.cluster import ClusterClient
    from nodes.engines.model_loader import ModelLoadError
    from nodes.gateway.app import run_gateway
    from nodes.gateway.backend import load_model_info
    from nodes.gateway.gateway_settings import GatewayConfig

    settings = load_settings(args.config)
    config = GatewayConfig.from_settings(settings, host=args.host, port=args.port, model_name=args.model_name)
    engine = section(settings, "engine")
    try:
        model = load_model_info(args.model or engine.get("model", DEFAULT_MODEL),
                                args.model_dir or engine.get("model_dir"))
    except ModelLoadError as exc:
        print(f"pdbus gateway: {exc}", file=sys.stderr)
        return 2
    broker = args.broker or section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT)
    heartbeat = HeartbeatConfig.from_settings(section(settings, "heartbeat"))   # backoff cap included
    try:
        security = security_config(settings, args.key or "gateway", broker)
    except SecurityError as exc:
        raise SettingsError(f"[security]: {exc}") from exc
    client = ClusterClient(broker, node_id=args.node_id, heartbeat=heartbeat, security=security,
                           tokenizer=model.tokenizer,
                           max_retries=int(section(settings, "failover").get("max_retries", 3)))
    try:
        client.start(args.broker_timeout)
    except TimeoutError as exc:
        print(f"pdbus gateway: {exc}", file=sys.stderr)
        return 1
    try:
        run_gateway(config, client, model)
    except OSError as exc:   # the port is taken, or the host is not ours
        print(f"pdbus gateway: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0
