"""`pdbus ray up | status | down`: the cluster's brokers, nodes and gateway as Ray actors
(docs/CLUSTER.md "On a Ray cluster"; the optional extra `pip install pdbus[ray]`).

Contract: `add_arguments(parser)` and `main(args) -> int`.
- `up [--address ADDR] [--prefill N --decode M --brokers K --gateway-workers W --colocated
  --nodes N --model M --no-gateway] [--planner]`: the shape as `pdbus cluster` reads it
  (`[cluster]`, flags override), `[ray]` for resources (nodes/ray_pools/pool_plan.py); without
  `--address` it starts a one-machine Ray head on 127.0.0.1 first. Returns once every component
  is ready (exit 0), or names the ones that are not (exit 1). `--planner` then runs the planner
  (`[planner]`) in the foreground, adding and draining nodes through Ray, until Ctrl-C/SIGTERM.
- `status [--address ADDR] [--json]`: pools, components, roles, the raylet each runs on,
  restarts, load (nodes/ray_pools/status_table.py).
- `down [--address ADDR] [--grace-s S]`: drains and stops everything (nodes, gateway, brokers in
  that order), then the Ray head if `up` started it.
Without `--address`, `status` and `down` use the cluster `ray start` left on this machine.
Exit 2 with one line when Ray is not installed or the settings are wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import TextIO

from bus import constants as c
from nodes.config_file import DEFAULT_CONFIG, SettingsError, load_settings, section
from nodes.ray_pools.pool_plan import RayOptions, ray_environment

MISSING_RAY = "pdbus ray: Ray is not installed: pip install 'pdbus[ray]' (or `make install-ray`)"
COMMON = {"--config": None, "--log-format": ["json", "console"], "--log-level": ["debug", "info", "warning", "error"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = _action(actions, "up", "place the brokers, nodes and gateway on a Ray cluster")
    for flag, text in (("--prefill", "prefill nodes"), ("--decode", "decode nodes"), ("--brokers", "brokers"),
                       ("--gateway-workers", "gateway processes"), ("--nodes", "with --colocated: `both` nodes")):
        up.add_argument(flag, type=int, help=f"{text} (default: as `pdbus cluster`)")
    up.add_argument("--colocated", action="store_true", help="`both` nodes instead of prefill and decode pools")
    up.add_argument("--model", help="model spec passed to every node")
    up.add_argument("--no-gateway", action="store_true", help="do not run the OpenAI gateway")
    up.add_argument("--planner", action="store_true", help="then run the planner here, scaling the pools through Ray")
    status = _action(actions, "status", "pools, nodes, roles, Ray nodes, restarts and load")
    status.add_argument("--json", action="store_true", help="the report as JSON")
    down = _action(actions, "down", "drain and stop every component (and a head `up` started)")
    down.add_argument("--grace-s", type=float, help="seconds each group may take to drain (default: [ray] drain_timeout_s)")


def _action(actions: argparse._SubParsersAction, name: str, text: str) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=text)
    parser.add_argument("--address", help="a running Ray cluster's GCS address (host:port)")
    for flag, choices in COMMON.items():   # also accepted after the action; SUPPRESS keeps one given before
        parser.add_argument(flag, choices=choices, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _load_ray(address: str | None) -> ModuleType | None:
    """`nodes.ray_pools.placement` (which imports Ray), with Ray's environment set first."""
    os.environ.update(ray_environment(address))
    try:
        from nodes.ray_pools import placement
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        print(MISSING_RAY, file=sys.stderr)
        return None
    return placement


def main(args: argparse.Namespace) -> int:
    placement = _load_ray(args.address)
    if placement is None:
        return 2
    settings = load_settings(args.config)
    options = RayOptions.from_settings(settings)
    out = sys.stdout
    # Ray's driver prints cluster events (a raylet lost, ...) on stdout from its own threads:
    # they go to stderr, so stdout holds only this command's answer (`status --json` parses).
    with contextlib.redirect_stdout(sys.stderr):
        if args.action == "up":
            return _up(args, settings, options, placement, out)
        placement.connect(args.address or "auto", options.namespace)
        if args.action == "status":
            return _status(args, options, out)
        return _down(args, options, placement, out)


def _shape_args(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(prefill=args.prefill, decode=args.decode, colocated=args.colocated, nodes=args.nodes,
                              idle=False, model=args.model, no_gateway=args.no_gateway,
                              gateway_workers=args.gateway_workers, brokers=args.brokers)


def _up(args: argparse.Namespace, settings: dict, options: RayOptions, placement: ModuleType,
        out: TextIO) -> int:
    from nodes.commands.cluster_cmd import cluster_shape
    from nodes.ray_pools import pool_plan, pools

    shape = cluster_shape(settings, _shape_args(args))
    addresses = pool_plan.broker_addresses(section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT),
                                           shape.num_brokers)
    env = pool_plan.forwarded_env(options)
    specs = pool_plan.pool_plan(shape, addresses, options, args.log_level, env)
    address = args.address
    if address is None:
        address = placement.start_local_head(options, options.head_cpus or pool_plan.cpus_needed(specs))
        print(f"started a Ray head at {address}", file=out)
    placement.connect(address, options.namespace)
    record = pools.pool_record(shape, addresses, options, args.log_level, env, local_head=args.address is None)
    code = pools.up(pools.Pool(options.namespace, _config_text(args.config), specs, options.start_timeout_s,
                               record), out)
    if code == 0 and args.planner:
        return _plan(settings, options, ",".join(address for _, address in addresses), out)
    return code


def _config_text(path: str | None) -> str:
    file = Path(path) if path else DEFAULT_CONFIG
    return file.read_text() if file.exists() else ""


def _plan(settings: dict, options: RayOptions, brokers: str, out: TextIO) -> int:
    from nodes.ray_pools.ray_actuator import RayActuator, run_planner

    actuator = RayActuator.from_cluster(options.namespace)
    if actuator is None:
        raise SettingsError("no pool record on the cluster: run `pdbus ray up` first")
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    print("planner running: Ctrl-C stops it (the pools keep serving)", file=out, flush=True)
    run_planner(settings, actuator, brokers, stop)
    return 0


def _status(args: argparse.Namespace, options: RayOptions, out: TextIO) -> int:
    from nodes.ray_pools import pools
    from nodes.ray_pools.status_table import render

    report = pools.status(options.namespace)
    print(json.dumps(report, indent=2) if args.json else render(report), file=out)
    return 0


def _down(args: argparse.Namespace, options: RayOptions, placement: ModuleType, out: TextIO) -> int:
    from nodes.ray_pools import pools

    grace_s = args.grace_s if args.grace_s is not None else options.drain_timeout_s
    if pools.down(options.namespace, grace_s, out):
        placement.disconnect()
        placement.stop_local_head()
        print("stopped the Ray head `pdbus ray up` started", file=out)
    return 0
