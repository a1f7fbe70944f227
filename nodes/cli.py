"""The `pdbus` console script: dispatches to `nodes.commands.<name>_cmd` lazily.

Contract: `main(argv) -> int`. Each entry of `SUBCOMMANDS` names the module implementing it
(see `nodes.commands`) and a one-line help; modules are imported only when their command runs.
Common flags (`--config`, `--log-format`, `--log-level`) are parsed here for every command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bus.log import configure_logging
from nodes.config_file import SettingsError

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("nodes.commands.broker_cmd", "run the ZeroMQ broker (ROUTER) that nodes register with"),
    "cluster": ("nodes.commands.cluster_cmd", "run a local cluster from the config (broker + nodes), foreground"),
    "prefill": ("nodes.commands.prefill_cmd", "run a prefill node"),
    "decode": ("nodes.commands.decode_cmd", "run a decode node"),
    "node": ("nodes.commands.node_cmd", "run a node by role (`--role both`: colocated prefill+decode)"),
    "gateway": ("nodes.commands.gateway_cmd", "run the OpenAI-compatible HTTP/SSE + WebSocket gateway"),
    "ray": ("nodes.commands.ray_cmd", "run the cluster as Ray actors: `ray up|status|down` (pip install pdbus[ray])"),
    "planner": ("nodes.commands.planner_cmd", "size the prefill and decode pools from the broker's stats (issue #42)"),
    "client": ("nodes.commands.client_cmd", "stream a completion or chat over the gateway's WebSocket"),
    "complete": ("nodes.commands.complete_cmd", "stream a completion through the cluster (bus-level client)"),
    "model": ("nodes.commands.model_cmd", "prepare or inspect the model (`pdbus model prepare`)"),
    "generate": ("nodes.commands.generate_cmd", "generate locally with the built-in engine (no cluster)"),
    "chaos": ("nodes.commands.chaos_cmd", "run the chaos and failover scenarios against a local cluster"),
    "bench": ("nodes.commands.bench_cmd", "serving benchmark: disaggregated vs colocated vs vLLM, SLO attainment"),
    "keys": ("nodes.commands.keys_cmd", "generate CURVE key pairs for the bus; list the keys the config admits"),
}


def _common_flags() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="cluster config TOML (default: config/local.toml)")
    common.add_argument("--log-format", choices=["json", "console"], help="log output format")
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    return common


def build_parser(selected: str | None) -> argparse.ArgumentParser:
    """The top-level parser; only `selected`'s module is imported to add its flags."""
    parser = argparse.ArgumentParser(prog="pdbus", description="prefill/decode disaggregated LLM serving")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _common_flags()
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, parents=[common])
        if name == selected:
            importlib.import_module(module_name).add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(selected if selected in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    configure_logging(args.log_format, args.log_level)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.main(args) or 0)
    except SettingsError as exc:
        print(f"pdbus: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
