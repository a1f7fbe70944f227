"""`make bench-bus`: the broker against a bare ROUTER-to-ROUTER relay, side by side.

Both servers run in their own process on the same runtime (asyncio + uvloop, the same
`RouterReactor` draining and sending zero-copy), so the ratio is the cost of the broker's
protocol logic. Two DEALER peers in this process (a "client" and a "worker", plain sync pyzmq)
exchange exactly the same frames through each server; the relay forwards every message of one
peer to the other (fixed routing ids, one dict lookup), the broker routes it by its protocol:
- rate: the worker streams PARTIAL replies to the client (window of 5000 in flight): msg/s;
- round trip: client REQUEST -> worker -> FINAL -> client, one at a time: p50 / p99;
- bulk: PARTIALs carrying a 16 MiB raw payload frame (sent with copy=False): GB/s;
- and, broker only, the round trip through the real API (BusClient -> Endpoint on a node thread).
The peers and those timed loops are harness/bench/bus_traffic.py's; this module runs the servers,
the rounds and the report.
Rounds alternate relay and broker; each figure is the median over rounds. The server's own CPU
time per streamed message (from /proc) is printed too: on a shared 2-core machine it is the
steadiest measure of what the protocol logic costs.
`--curve` adds a third server, the broker with CurveZMQ (and its ZAP handler) on, measured in the
same rounds with CURVE peers: the CURVE/plain ratio per measure is its cost on the control plane.
Usage: flock /tmp/pdbus-bench.lock .venv/bin/python -m harness.bench.bus_bench [--rounds 3] [--quick] [--curve]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import TYPE_CHECKING

import zmq

from harness.bench.bus_traffic import Peers, endpoint_round_trips, open_stream, round_trips, stream_rate

if TYPE_CHECKING:
    from bus.security import SecurityConfig

PAYLOAD_BYTES = 16 * 1024 * 1024
CURVE = "broker-curve"
_KEYS_ENV = "PDBUS_BENCH_CURVE_KEYS"


def curve_configs(keys: dict[str, list[str]]) -> tuple[SecurityConfig, SecurityConfig]:
    """(server's, peers') SecurityConfig from in-memory key pairs: the peers' key is admitted as
    decode, gateway and prefill (every bench peer uses it; bench-kv's sender is a prefill node),
    the server's as decode (bench-kv's receiver)."""
    from bus.security import Principal, SecurityConfig

    server, peer = ([k.encode() for k in keys[name]] for name in ("server", "peer"))
    admitted = {peer[0]: Principal("bench-peer", frozenset({"decode", "gateway", "prefill"}))}
    return (SecurityConfig(server[0], server[1], b"", admitted),
            SecurityConfig(peer[0], peer[1], server[0], {server[0]: Principal("bench-server", frozenset({"decode"}))}))


def new_curve_keys() -> dict[str, list[str]]:
    return {name: [k.decode() for k in zmq.curve_keypair()] for name in ("server", "peer")}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(context: zmq.Context, endpoint: str, server_pid: int, via_relay: bool,
            quick: bool, security: SecurityConfig | None = None) -> dict[str, float]:
    peers = Peers(context, endpoint, via_relay, security)
    try:
        round_trips(peers, 200)   # warm-up
        rtt = sorted(round_trips(peers, 1000 if quick else 4000))
        open_stream(peers, b"stream")
        stream_rate(peers, b"stream", 2000, 2000)
        num_messages = 20_000 if quick else 60_000
        cpu_before = cpu_seconds(server_pid)
        rate = stream_rate(peers, b"stream", num_messages, 5000)
        cpu_per_message = (cpu_seconds(server_pid) - cpu_before) / num_messages * 1e6
        payload = memoryview(bytearray(PAYLOAD_BYTES))
        stream_rate(peers, b"stream", 4, 4, payload)
        num_bulk = 16 if quick else 48
        bulk = stream_rate(peers, b"stream", num_bulk, 4, payload) * PAYLOAD_BYTES / 1e9
    finally:
        peers.close()
    return {"msgs_per_s": rate, "server_cpu_us_per_msg": cpu_per_message, "rtt_p50_us": rtt[len(rtt) // 2],
            "rtt_p99_us": rtt[int(len(rtt) * 0.99)], "gb_per_s": bulk}


def start_server(kind: str, keys: dict[str, list[str]] | None = None) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, _KEYS_ENV: json.dumps(keys)} if keys else None
    process = subprocess.Popen([sys.executable, "-m", "harness.bench.bus_bench", "--serve", kind],
                               stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None   # stdout=PIPE
    endpoint = process.stdout.readline().strip()
    if not endpoint.startswith("tcp://"):
        process.kill()
        raise RuntimeError(f"{kind} server did not start")
    return process, endpoint


def run_round(context: zmq.Context, kind: str, quick: bool,
              keys: dict[str, list[str]] | None = None) -> dict[str, float]:
    security = None
    if kind == CURVE:
        assert keys is not None, "the CURVE server needs keys"
        security = curve_configs(keys)[1]
    process, endpoint = start_server(kind, keys if kind == CURVE else None)
    try:
        result = measure(context, endpoint, process.pid, kind == "relay", quick, security)
        if kind in ("broker", CURVE):
            samples = sorted(endpoint_round_trips(endpoint, 300 if quick else 1500, security))
            result["api_p50_us"] = samples[len(samples) // 2]
            result["api_p99_us"] = samples[int(len(samples) * 0.99)]
        return result
    finally:
        process.terminate()
        process.wait(5)


def report(results: dict[str, list[dict[str, float]]]) -> None:
    med = {kind: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
           for kind, rounds in results.items()}
    relay, broker = med["relay"], med["broker"]
    rows = [("messages/s (stream of PARTIALs)", "msgs_per_s", "{:,.0f}", True),
            ("server CPU per message (us)", "server_cpu_us_per_msg", "{:.1f}", False),
            ("round trip p50 (us)", "rtt_p50_us", "{:.0f}", False),
            ("round trip p99 (us)", "rtt_p99_us", "{:.0f}", False),
            ("16 MiB payloads (GB/s)", "gb_per_s", "{:.2f}", True)]
    print(f"\n{'measure':36} {'bare relay':>12} {'broker':>12} {'broker/relay':>13}")
    for label, key, fmt, _ in rows:
        print(f"{label:36} {fmt.format(relay[key]):>12} {fmt.format(broker[key]):>12} "
              f"{broker[key] / relay[key]:>12.2f}x")
    print(f"{'round trip via BusClient/Endpoint API':36} {'':>12} {broker['api_p50_us']:>9.0f} us p50, "
          f"{broker['api_p99_us']:.0f} us p99 (node threads and I/O threads included)")
    if CURVE in med:
        curve = med[CURVE]
        print(f"\n{'CURVE cost (control plane)':36} {'broker':>12} {'+CURVE':>12} {'CURVE/plain':>13}")
        for label, key, fmt, _ in [*rows, ("round trip via API p50 (us)", "api_p50_us", "{:.0f}", False)]:
            print(f"{label:36} {fmt.format(broker[key]):>12} {fmt.format(curve[key]):>12} "
                  f"{curve[key] / broker[key]:>12.2f}x")
    rate_ok = broker["msgs_per_s"] >= 0.7 * relay["msgs_per_s"]
    rtt_ok = broker["rtt_p50_us"] <= 1.3 * relay["rtt_p50_us"]
    print(f"\ntargets: rate >= 0.70x relay: {'met' if rate_ok else 'MISSED'}; "
          f"p50 round trip <= 1.30x relay: {'met' if rtt_ok else 'MISSED'}")


class RelayCore:
    """No protocol at all: each peer's messages go, as they are, to the other peer."""

    OTHER = {b"c": b"w", b"w": b"c"}

    def __init__(self) -> None:
        self.outbox: list[list] = []

    def on_frames(self, identity: bytes, frames: list, now: float) -> None:
        self.outbox.append([self.OTHER[identity], *frames])

    def tick(self, now: float) -> None:
        pass

    def take_outbox(self) -> list[list]:
        outbox, self.outbox = self.outbox, []
        return outbox

    def unroutable(self, identity: bytes) -> None:
        pass


def serve(kind: str) -> None:
    """A server process: print the bound endpoint, serve until SIGTERM."""
    import asyncio
    import signal

    import uvloop

    from bus.broker import Broker
    from bus.log import configure_logging
    from bus.reactor import RouterReactor

    configure_logging(level="error")

    async def main() -> None:
        server: Broker | RouterReactor
        if kind in ("broker", CURVE):
            keys = json.loads(os.environ[_KEYS_ENV]) if kind == CURVE else None
            server = Broker("tcp://127.0.0.1:0", security=curve_configs(keys)[0] if keys else None)
            task = asyncio.create_task(server.serve())
            print(await server.wait_bound(), flush=True)
        else:
            socket: zmq.Socket = zmq.Context.instance().socket(zmq.ROUTER)
            for option, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.SNDHWM, 100_000),
                                  (zmq.RCVHWM, 100_000), (zmq.LINGER, 0)):
                socket.setsockopt(option, value)
            socket.bind("tcp://127.0.0.1:0")
            server = RouterReactor(socket, RelayCore(), tick_s=0.05)
            task = asyncio.create_task(server.run())
            print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
        await task

    uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--curve", action="store_true", help="also the broker with CurveZMQ on (its cost)")
    parser.add_argument("--serve", choices=["broker", "relay", CURVE], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    from bus.log import configure_logging
    configure_logging(level="error")
    context = zmq.Context()
    kinds = ("relay", "broker", CURVE) if args.curve else ("relay", "broker")
    keys = new_curve_keys() if args.curve else None
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for number in range(args.rounds):
        for kind in kinds:
            results[kind].append(run_round(context, kind, args.quick, keys))
            r = results[kind][-1]
            print(f"round {number + 1} {kind:6}: {r['msgs_per_s']:,.0f} msg/s, p50 {r['rtt_p50_us']:.0f} us, "
                  f"p99 {r['rtt_p99_us']:.0f} us, {r['gb_per_s']:.2f} GB/s", flush=True)
    report(results)
    context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
