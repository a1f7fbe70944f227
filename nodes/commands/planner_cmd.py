"""`pdbus planner`: size the prefill and decode pools from the broker's stats (issue #42).

Contract: `add_arguments(parser)`, `main(args) -> int`. Reads `[planner]` (bounds, thresholds,
timings: `scheduler.planner_config`; `metrics_host`, `metrics_port`, `stats_timeout_s`),
`[broker] endpoint` (or `--broker`), `[heartbeat]` and `[security]` (CURVE with the `control` key
pair); `--interval`, `--metrics-port` override the config. Registers with the broker as node
`planner` (`--node-id`) in role `control`. It owns no node processes (`BusOnlyActuator`): it
switches and drains nodes over the bus and logs each scale-up it cannot do as `planner_wanted`
(`pdbus cluster --planner` runs it with an actuator that starts nodes). `--dry-run` logs each
decision and carries none out. SIGINT/SIGTERM stop it; exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from bus import constants as c
from nodes.config_file import load_settings, section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", help=f"broker endpoint(s) (default: [broker] endpoint, {c.DEFAULT_ENDPOINT})")
    parser.add_argument("--interval", type=float, help="seconds between two rounds (default: [planner] interval_s)")
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus text on this port, 0 = any (default: [planner] metrics_port; none: off)")
    parser.add_argument("--dry-run", action="store_true", help="log decisions, carry none out")
    parser.add_argument("--node-id", default="planner", help="its bus node id (default: planner)")
    parser.add_argument("--heartbeat-ms", type=int, help="heartbeat interval in milliseconds")
    parser.add_argument("--liveness", type=int, help="missed heartbeats before the broker is dead")


async def _serve(args: argparse.Namespace, settings: dict) -> None:
    from nodes.planner.actuator import BusOnlyActuator
    from nodes.planner.planner_run import control_endpoint, planner_options, serve_planner
    from nodes.planner.planner_shell import PlannerShell
    from scheduler.planner import Planner

    options = planner_options(settings, args.interval, args.metrics_port)
    broker = args.broker or section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT)
    endpoint = control_endpoint(settings, broker, args.node_id, args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    endpoint.start()
    try:
        shell = PlannerShell(Planner(options.config), endpoint, BusOnlyActuator(endpoint), dry_run=args.dry_run,
                             stats_timeout_s=options.stats_timeout_s)
        await serve_planner(shell, options, stop)
    finally:
        await asyncio.to_thread(endpoint.stop)


def main(args: argparse.Namespace) -> int:
    asyncio.run(_serve(args, load_settings(args.config)))
    return 0
