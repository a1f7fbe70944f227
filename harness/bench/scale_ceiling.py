"""The broker's own ceiling on the token plane, measured directly: one broker process fed by two
bare DEALER peers (a registered `decode` node and a `gateway` client, plain pyzmq) that are far
cheaper per token than the broker, so the broker, not its peers, sets the rate.

Contract: `measure_ceiling(path, num_streams, seconds, churn_tokens) -> dict` (tokens/s, broker
CPU fraction and CPU per token, the ceiling = tokens/s / CPU fraction, streams churned, and
`other_cpu_frac`: what the rest of the machine used meanwhile, the peers' driver apart). The
client opens `num_streams` routes; the node then streams, as fast as a window of messages in
flight allows, either one STREAMS message per step carrying the next PARTIAL of every stream
(`batched`: what `Endpoint.reply_batch` sends) or one PARTIAL per token (`per-token`). Token
frames are encoded once with bus.codec (the broker reads neither seqs nor bodies, so re-sending
them is what it sees of a real node). Streams also end and start as in the full runs: for every
`churn_tokens` tokens sent (the mean stream length; 0: none) the client sends one more REQUEST,
which the node answers with its plan PARTIAL and a FINAL of a real decode node's size — the
three messages a stream costs the broker besides its tokens.
"""

from __future__ import annotations

import os
import time
import uuid

import zmq

from bus import codec
from bus.constants import Command
from bus.messages import Final, Partial, Ready, Request, Streams
from harness.bench.bus_bench import cpu_seconds, start_server
from harness.bench.scale_procs import machine_busy_s
from nodes import wire

WINDOW = 2000   # messages in flight at most: deep enough to keep the broker busy, far below its queues' 100,000
TOKEN_BODY = {"type": "token", "index": 100, "token_id": 42, "text": " tok", "sent_at": 12345.678901}
PLAN_BODY = wire.to_wire(wire.PlanBody.local("ceiling-node"))
DONE_BODY = wire.to_wire(wire.DecodeDoneBody(   # ~1 s of tokens at 20 ms steps, as a decode FINAL repeats
    "ceiling-node", "length", tuple(wire.TokenBody(i, 42, " tok") for i in range(50)), wire.PlanKind.LOCAL,
    wire.Usage(3, 256)))
_HEARTBEAT = codec.HEADERS[Command.HEARTBEAT]
_STREAMS, _PARTIAL, _FINAL = (codec.HEADERS[c] for c in (Command.STREAMS, Command.PARTIAL, Command.FINAL))
_CHURN = "churn-"


def _peer(context: zmq.Context, endpoint: str, ready: Ready) -> zmq.Socket:
    socket = context.socket(zmq.DEALER)
    for option, value in ((zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.LINGER, 0)):
        socket.setsockopt(option, value)
    socket.connect(endpoint)
    socket.send_multipart(codec.encode(ready))
    if not socket.poll(5000):
        raise RuntimeError("the broker did not acknowledge READY")
    socket.recv_multipart()
    return socket


def _open_routes(client: zmq.Socket, node: zmq.Socket, num_streams: int) -> list[str]:
    ids = [uuid.uuid4().hex for _ in range(num_streams)]
    for request_id in ids:
        client.send_multipart(codec.encode(Request("decode", request_id, None)))
    num_seen = 0
    while num_seen < num_streams:
        if not node.poll(5000):
            raise RuntimeError("the broker did not route the requests")
        num_seen += node.recv_multipart(copy=False)[0].bytes != _HEARTBEAT
    return ids


def _messages(path: str, ids: list[str]) -> tuple[list[list], int]:
    """The frames to send in turn, and the tokens each message carries."""
    if path == "batched":
        return [codec.encode(Streams(tuple(Partial(rid, 100, TOKEN_BODY) for rid in ids)))], len(ids)
    return [codec.encode(Partial(rid, 100, TOKEN_BODY)) for rid in ids], 1


class _Drive:
    """One measuring run: token messages within a window, the churn, heartbeats, counting."""

    def __init__(self, node: zmq.Socket, client: zmq.Socket, messages: list[list], per_message: int,
                 churn_tokens: int) -> None:
        self.node, self.client, self.messages, self.per_message = node, client, messages, per_message
        self.churn_every = max(1, churn_tokens // per_message) if churn_tokens else 0   # token messages
        self.sent = self.received = self.num_churned = 0
        self.beat_at = 0.0

    def run(self, seconds: float) -> int:
        """Stream for `seconds`, then wait for what is in flight (left there, it would be the next
        run's backlog); the token messages received."""
        self.sent = self.received = 0
        end = time.monotonic() + seconds
        while self.received < self.sent or time.monotonic() < end:
            if time.monotonic() > end + 10.0:
                raise RuntimeError(f"{self.sent - self.received} of {self.sent} messages lost in the broker")
            while self.sent - self.received < WINDOW and time.monotonic() < end:
                self.node.send_multipart(self.messages[self.sent % len(self.messages)], copy=False)
                self.sent += 1
                if self.churn_every and self.sent % self.churn_every == 0:
                    request_id = f"{_CHURN}{uuid.uuid4().hex}"
                    self.client.send_multipart(codec.encode(Request("decode", request_id, None)))
            self.client.poll(100)
            self._receive()
            self._serve_requests()
            if (now := time.monotonic()) - self.beat_at > 0.1:   # peers that only send or receive still show life
                self.node.send_multipart([_HEARTBEAT])
                self.client.send_multipart([_HEARTBEAT])
                self.beat_at = now
        return self.received

    def _receive(self) -> None:
        for _ in range(WINDOW):
            try:
                frames = self.client.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            header = frames[0].bytes
            if header == _STREAMS or (header == _PARTIAL and not frames[1].bytes.startswith(_CHURN.encode())):
                self.received += 1

    def _serve_requests(self) -> None:
        """The node's side of the churn: a plan, then the FINAL, for every new request."""
        while True:
            try:
                frames = self.node.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames[0] == codec.HEADERS[Command.REQUEST]:
                request_id = frames[2].decode()
                self.node.send_multipart(codec.encode(Partial(request_id, 0, PLAN_BODY)))
                self.node.send_multipart(codec.encode(Final(request_id, 1, DONE_BODY)))
                self.num_churned += 1


def measure_ceiling(path: str, num_streams: int = 64, seconds: float = 3.0, churn_tokens: int = 256) -> dict:
    process, endpoint = start_server("broker")
    context = zmq.Context()
    try:
        node = _peer(context, endpoint, Ready("decode", "ceiling-node"))
        client = _peer(context, endpoint, Ready("gateway", "ceiling-client"))
        messages, per_message = _messages(path, _open_routes(client, node, num_streams))
        drive = _Drive(node, client, messages, per_message, churn_tokens)
        drive.run(0.5)   # warm-up
        churned_before, started = drive.num_churned, time.monotonic()
        cpu_before, own_before, busy_before = cpu_seconds(process.pid), cpu_seconds(os.getpid()), machine_busy_s()
        num_messages = drive.run(seconds)
        elapsed, cpu = time.monotonic() - started, cpu_seconds(process.pid) - cpu_before
        others = machine_busy_s() - busy_before - cpu - (cpu_seconds(os.getpid()) - own_before)
        node.close()
        client.close()
    finally:
        process.terminate()
        process.wait(5)
        context.term()
    tokens_per_s = num_messages * per_message / elapsed
    return {"section": "ceiling", "path": path, "transport": "raw", "streams": num_streams,
            "tokens_per_message": per_message, "tokens_per_s": tokens_per_s, "broker_cpu_frac": cpu / elapsed,
            "broker_us_per_token": cpu / (num_messages * per_message) * 1e6,
            "broker_ceiling_tokens_per_s": tokens_per_s / (cpu / elapsed) if cpu else None,
            "churn_tokens": churn_tokens, "streams_churned_per_s": (drive.num_churned - churned_before) / elapsed,
            "other_cpu_frac": max(0.0, others) / elapsed}
