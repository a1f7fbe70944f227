"""`pdbus node --role ROLE`: an idle bus node that registers, heartbeats and reconnects.

It answers every REQUEST with one PARTIAL echoing the body and a FINAL (so the bus can be
exercised end to end without an engine) and logs DIRECT and CANCEL messages. Reads `[broker]`
and `[heartbeat]` from the config; flags override them. SIGINT/SIGTERM stop it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import threading

from bus import constants as c
from bus.endpoint import Endpoint
from bus.log import get_logger
from bus.messages import Cancel, Direct, Request
from nodes.commands.broker import heartbeat_config
from nodes.settings import load_settings, section

_IDLE_CAPACITY = {
    "decode": {"kv_blocks_total": 0, "kv_blocks_free": 0, "max_running": 0},
    "prefill": {"max_batch_tokens": 0, "queued_tokens": 0},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", required=True, choices=list(c.ROLES))
    parser.add_argument("--node-id", help="stable node id (default: ROLE-<random>)")
    parser.add_argument("--broker", help="broker endpoint (default: [broker] endpoint)")
    parser.add_argument("--heartbeat-ms", type=int, help="heartbeat interval in milliseconds")
    parser.add_argument("--liveness", type=int, help="missed heartbeats before the broker is dead")


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
    settings = load_settings(args.config)
    broker = args.broker or section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT)
    endpoint = Endpoint(broker, args.role, args.node_id, capacity=capacity_for(args.role),
                        heartbeat=heartbeat_config(settings, args))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with endpoint:
        serve(endpoint, stop)
    return 0
