"""`pdbus node --role ROLE`: an engine node by role, or an idle bus node with `--idle`.

- `--role both`: the colocated node (nodes/colocated_node.py): one engine, chunked prefill interleaved
  with decode; `--role prefill|decode`: the same as `pdbus prefill|decode`. Engine flags as theirs.
- `--idle` (and `--role gateway`): a bus node without an engine that registers, heartbeats and
  reconnects, answers every REQUEST with one PARTIAL echoing the body and a FINAL (so the bus can
  be exercised end to end without an engine) and logs DIRECT and CANCEL messages.
Reads `[broker]`, `[heartbeat]`, `[security]` (and the engine sections) from the config; flags override
them. SIGINT/SIGTERM stop it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import threading

from bus import constants as c
from bus.endpoint import Endpoint
from bus.log import get_logger
from bus.messages import Cancel, Direct, Request
from nodes.bus_config import heartbeat_config
from nodes.config_file import load_settings, section
from nodes.node_settings import add_node_arguments, node_security

_IDLE_CAPACITY = {
    "decode": {"kv_blocks_total": 0, "kv_blocks_free": 0, "max_running": 0},
    "prefill": {"max_batch_tokens": 0, "queued_tokens": 0},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", required=True, choices=list(c.ROLES))
    parser.add_argument("--idle", action="store_true", help="no engine: an echo node that only exercises the bus")
    add_node_arguments(parser)


def capacity_for(role: str) -> dict[str, float]:
    if role == "both":
        return {**_IDLE_CAPACITY["decode"], **_IDLE_CAPACITY["prefill"]}
    return dict(_IDLE_CAPACITY.get(role, {}))


def serve(endpoint: Endpoint, stop: threading.Event) -> None:
    log = get_logger("node", node_id=endpoint.node_id)
    while not stop.is_set():
        try:
            message = endpoint.receive(timeout=0.2)
        except TimeoutError:
            continue
        if isinstance(message, Request):
            endpoint.reply(message.request_id, {"echo": message.body})
            endpoint.reply_final(message.request_id, {"node_id": endpoint.node_id})
        elif isinstance(message, Direct | Cancel):
            log.info("received", kind=type(message).__name__, message=repr(message)[:200])


def main(args: argparse.Namespace) -> int:
    if not args.idle and args.role != "gateway":
        from nodes.node_main import serve_role

        return serve_role(args, args.role)
    settings = load_settings(args.config)
    broker = args.broker or section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT)
    endpoint = Endpoint(broker, args.role, args.node_id, capacity=capacity_for(args.role),
                        heartbeat=heartbeat_config(settings, args),
                        security=node_security(settings, args, args.role, broker, ""))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with endpoint:
        serve(endpoint, stop)
    return 0
