"""`pdbus cluster`: a broker and its nodes as child processes, in the foreground.

Reads `[cluster]` (`prefill`, `decode`: node counts; `brokers` (1; several share the load and
survive one another's loss, docs/CLUSTER.md); `colocated`: `both` nodes for
`--colocated`, 0 = one per core; `stop_grace_s`; `start_timeout_s`) and `[broker] endpoint`
from the config; flags override them. The OpenAI gateway (`pdbus gateway`, on `[gateway]
host:port`) runs too, unless `--no-gateway` or `--idle` (idle nodes serve no model), with
`--gateway-workers N` processes (default `[gateway] workers`, 1; see `pdbus gateway --workers`). Every child
gets the same `--config`, so heartbeat, scheduler, engine, KV and gateway settings agree. Ctrl-C / SIGTERM stops the nodes, then the broker
(SIGKILL after the grace period). Exit code 0 after a requested stop, 1 if the broker dies.
`--planner` also runs the planner (`[planner]`, docs/CLUSTER.md "The planner") in the launcher:
it starts `prefill-N` / `decode-N` nodes and drains them (a drained node's exit 0 is no failure),
and reads TTFT/TPOT p90 from the cluster's own gateway's `/metrics` unless `[planner]
gateway_metrics_url` says otherwise ("" = none; no gateway, port 0 or several workers: none).
See `nodes.launcher` for what is logged.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from dataclasses import replace

from bus import constants as c
from bus.log import wants_json
from nodes.config_file import SettingsError, load_settings, section, whole_number
from nodes.gateway.gateway_settings import MAX_WORKERS
from nodes.launch_plan import ClusterShape, cluster_plan
from nodes.launcher import Companion, Supervisor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", type=int, help="prefill nodes (default: [cluster] prefill)")
    parser.add_argument("--decode", type=int, help="decode nodes (default: [cluster] decode)")
    parser.add_argument("--colocated", action="store_true",
                        help="run `both` nodes (prefill+decode on one engine) instead")
    parser.add_argument("--nodes", type=int, help="with --colocated: how many (default: one per core)")
    parser.add_argument("--model", help="model spec passed to every node")
    parser.add_argument("--idle", action="store_true", help="nodes without an engine (`pdbus node --idle`)")
    parser.add_argument("--endpoint", help=f"broker endpoint (default: [broker] endpoint, {c.DEFAULT_ENDPOINT})")
    parser.add_argument("--stop-grace-s", type=float, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--no-gateway", action="store_true", help="do not run the OpenAI gateway")
    parser.add_argument("--brokers", type=int, help="brokers of the cluster, on consecutive ports (default: [cluster] brokers, 1)")
    parser.add_argument("--gateway-workers", type=int,
                        help="gateway processes on its one port (default: [gateway] workers, 1)")
    parser.add_argument("--planner", action="store_true",
                        help="run the planner: it starts and drains nodes within [planner] bounds")


def _count(flag: int | None, configured: object, name: str) -> int:
    return whole_number(flag if flag is not None else configured, f"[cluster] {name}")


def _gateway_workers(flag: int | None, gateway: dict) -> int:
    value = flag if flag is not None else gateway.get("workers", 1)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WORKERS:
        raise SettingsError(f"[gateway] workers (--gateway-workers) must be a whole number in 1..{MAX_WORKERS}, "
                            f"got {value!r}")
    return value


def cluster_shape(settings: dict, args: argparse.Namespace) -> ClusterShape:
    cluster = section(settings, "cluster")
    num_colocated = 0
    if args.colocated:
        num_colocated = _count(args.nodes, cluster.get("colocated", 0), "colocated") or os.cpu_count() or 1
    shape = ClusterShape(num_prefill=_count(args.prefill, cluster.get("prefill", 1), "prefill"),
                         num_decode=_count(args.decode, cluster.get("decode", 1), "decode"),
                         num_colocated=num_colocated, idle=args.idle, model=args.model,
                         gateway=not (args.idle or args.no_gateway),
                         gateway_workers=_gateway_workers(args.gateway_workers, section(settings, "gateway")),
                         num_brokers=_count(getattr(args, "brokers", None), cluster.get("brokers", 1), "brokers"))
    if shape.num_brokers < 1:
        raise SettingsError("a cluster needs at least one broker")
    if not num_colocated and shape.num_decode == 0:
        raise SettingsError("a cluster needs at least one decode node (or --colocated)")
    return shape


def _planner(settings: dict, shape: ClusterShape, common: tuple[str, ...]) -> Companion:
    from nodes.planner.launcher_actuator import LauncherPlanner
    from nodes.planner.planner_run import planner_options
    from nodes.planner.slo_signals import gateway_metrics_url

    if shape.num_colocated:
        raise SettingsError("--planner sizes prefill and decode pools: not with --colocated")
    options = planner_options(settings)
    if options.gateway_metrics_url is None and shape.gateway:   # the SLO signals of the cluster it runs
        options = replace(options, gateway_metrics_url=gateway_metrics_url(settings, shape.gateway_workers))
    return LauncherPlanner(settings, options, shape, common)


def main(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    cluster = section(settings, "cluster")
    endpoint = args.endpoint or section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT)
    common = tuple(a for flag, value in (("--config", args.config), ("--log-level", args.log_level))
                   if value for a in (flag, value))
    shape = cluster_shape(settings, args)
    planner = _planner(settings, shape, common) if getattr(args, "planner", False) else None
    supervisor = Supervisor(cluster_plan(shape, endpoint, common),
                            grace_s=float(args.stop_grace_s or cluster.get("stop_grace_s", 5.0)),
                            start_timeout_s=float(cluster.get("start_timeout_s", 30.0)),
                            json_output=wants_json(args.log_format), companion=planner)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return supervisor.run(stop)
