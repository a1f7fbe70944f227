"""`pdbus gateway`: the OpenAI-compatible HTTP/SSE + WebSocket gateway (docs/API.md).

Contract: `add_arguments(parser)` and `main(args) -> int`. Reads `[gateway]` (host, port,
model_name, api_keys, rate limits, limits, stall timeout), `[broker] endpoint`, `[engine] model`
(for the tokenizer; the weights stay on the nodes) and `[kv]` (the KV mode it reports); flags
override; `[security]` (CURVE with the `gateway` key pair, see nodes.commands.keys_cmd) and
`[gateway] tls_cert`/`tls_key` (HTTPS/WSS). Registers with the broker as a bus client (waits up to `--broker-timeout`), logs
`gateway_started` with its URL, serves until SIGINT/SIGTERM. Exit 1 when no broker answers or
the port is taken, 2 for bad settings or model.
`--workers N` (`[gateway] workers`, default 1): N worker processes on the one port, each this
command again with `--worker` (nodes/gateway/workers.py), under this process, which logs
`gateway_started` once all N serve; the same exit codes. With 1 there is no extra process.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from bus.security import SecurityError
from nodes.bus_config import security_config
from nodes.config_file import SettingsError, load_settings, section
from nodes.node_settings import DEFAULT_MODEL

if TYPE_CHECKING:
    from nodes.gateway.gateway_settings import GatewayConfig
    from nodes.gateway.shared_limits import LimitsTable
    from nodes.gateway.workers import WorkerSeat


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
    parser.add_argument("--workers", type=int, help="gateway processes on host:port, each with its own bus client "
                        "(default: [gateway] workers, 1)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)   # index,limits_fd,ready_fd: set by the parent


def main(args: argparse.Namespace) -> int:
    from nodes.gateway.gateway_settings import GatewayConfig
    from nodes.gateway.workers import WorkerSeat

    settings = load_settings(args.config)
    config = GatewayConfig.from_settings(settings, host=args.host, port=args.port, model_name=args.model_name,
                                         workers=args.workers)
    seat = WorkerSeat.parse(args.worker) if args.worker else None
    if seat is None and config.workers > 1:
        return run_workers(args, config)
    return serve(args, settings, config, seat)


def serve(args: argparse.Namespace, settings: dict, config: GatewayConfig, seat: WorkerSeat | None) -> int:
    """One gateway process: alone, or worker `seat` of several."""
    from bus import constants as c
    from bus.liveness import HeartbeatConfig
    from nodes.cluster import ClusterClient
    from nodes.engines.model_loader import ModelLoadError
    from nodes.gateway.app import run_gateway
    from nodes.gateway.backend import load_model_info

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
        run_gateway(config, client, model, seat)
    except OSError as exc:   # the port is taken, or the host is not ours
        print(f"pdbus gateway: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def run_workers(args: argparse.Namespace, config: GatewayConfig) -> int:
    """The parent of `--workers N`: hold the port, share the limits, supervise (no model, no bus)."""
    import signal
    import threading

    from bus.log import get_logger
    from nodes.gateway.workers import WorkerPool, reserve_port, worker_argv

    try:
        held = reserve_port(config.host, config.port)
    except OSError as exc:
        print(f"pdbus gateway: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    port = held.getsockname()[1]
    table = _limits_table(config)
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    scheme = "https" if config.tls_cert else "http"

    def started(pids: list[int]) -> None:
        get_logger("gateway").info("gateway_started", host=config.host, port=port,
                                   url=f"{scheme}://{config.host}:{port}", tls=bool(config.tls_cert),
                                   model=config.model_name, auth=bool(config.api_keys), workers=config.workers,
                                   pids=pids, shared_limits=table is not None)

    pool = WorkerPool(lambda seat: worker_argv(args, config, port, seat), config.workers, table)
    try:
        return pool.run(stop, started)
    finally:
        held.close()
        if table is not None:
            table.close()


def _limits_table(config: GatewayConfig) -> LimitsTable | None:
    """The workers' shared limits table, when a limit is on (else each worker's empty one costs nothing)."""
    if not (config.rate_limit_rps or config.max_streams_per_key):
        return None
    from nodes.gateway.shared_limits import LimitsTable
    return LimitsTable.create(config.workers)
