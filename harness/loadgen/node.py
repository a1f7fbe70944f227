"""The load generator's I/O shell: each `LoadGenNode` is a real `bus.endpoint.Endpoint` (role
`decode`, its own node id) around a `LoadGenCore`; one `Driver` thread runs every node of a process.

Contract:
- `LoadGenNode(broker, core, context, per_token=False, heartbeat=None)`: `start()`, `stop()`,
  `registered`; `poll(now)` takes what the endpoint received (REQUEST -> plan PARTIAL or ERROR,
  CANCEL and request-scoped ERROR -> `core.cancel`); `step(now) -> int` sends a due step's tokens
  — one `Endpoint.reply_batch` (one STREAMS message per client), or with `per_token` one `reply`
  each (the old path, kept for the side-by-side comparison) — then its FINALs; the tokens sent.
- `Driver(nodes)`: `run(stop_event)` polls and steps every node on one thread until the event is
  set; `timeline` is `(monotonic time, tokens sent so far)` every ~10 ms, from which a bench reads
  the rate offered in any window.
Why one thread: nodes are cheap state machines; a thread each would only add GIL hand-offs (each
endpoint already has its I/O thread, which alone costs ~4 ms of CPU a second idle here: 256
nodes take about one core before they send a token). Why poll the inboxes rather than wait on
them: K mailboxes cannot be waited on at once, and a plan a few milliseconds late costs nothing
measured (latency is timed from a token's send).
"""

from __future__ import annotations

import threading
import time

import zmq

from bus.endpoint import Endpoint
from bus.liveness import HeartbeatConfig
from bus.messages import Cancel, Error, Request
from harness.loadgen.core import Admitted, LoadGenCore

POLL_S = 0.005          # the longest the driver sleeps: how late a new request's plan may be
TIMELINE_EVERY_S = 0.01


class LoadGenNode:
    def __init__(self, broker: str, core: LoadGenCore, context: zmq.Context, *, per_token: bool = False,
                 heartbeat: HeartbeatConfig | None = None) -> None:
        self.core = core
        # Static capacity, so a scheduler policy that reads these keys sees a node with room.
        capacity = {"max_running": core.max_batch, "kv_blocks_total": 64 * core.max_batch,
                    "kv_blocks_free": 64 * core.max_batch}
        self.endpoint = Endpoint(broker, "decode", core.node_id, capacity=capacity, heartbeat=heartbeat,
                                 context=context)
        self.per_token = per_token
        self.num_ignored = 0   # DIRECTs and un-scoped ERRORs: nothing here acts on them

    def start(self) -> LoadGenNode:
        self.endpoint.start()
        return self

    @property
    def registered(self) -> bool:
        return self.endpoint.registered

    def stop(self) -> None:
        self.endpoint.stop()

    def poll(self, now: float) -> None:
        inbox = self.endpoint.inbox
        while len(inbox):
            message = inbox.get(0)
            if isinstance(message, Request):
                self._on_request(message, now)
            elif isinstance(message, Cancel | Error) and message.request_id:
                self.core.cancel(message.request_id)   # an ERROR here: the broker refused one of our replies
            else:
                self.num_ignored += 1

    def _on_request(self, request: Request, now: float) -> None:
        answer = self.core.admit(request.request_id, request.body, now)
        if isinstance(answer, Admitted):
            self.endpoint.reply(request.request_id, answer.plan)
        else:
            self.endpoint.reply_error(request.request_id, answer.code, answer.message, node_id=self.core.node_id)

    def step(self, now: float) -> int:
        step = self.core.step(now)
        if step is None:
            return 0
        if step.tokens:
            if self.per_token:
                for request_id, body in step.tokens:
                    self.endpoint.reply(request_id, body)
            else:
                self.endpoint.reply_batch(step.tokens)
        for request_id, body in step.finals:   # after the tokens: the endpoint keeps call order
            self.endpoint.reply_final(request_id, body)
        return len(step.tokens)


class Driver:
    def __init__(self, nodes: list[LoadGenNode]) -> None:
        self.nodes = nodes
        self.num_sent = 0
        self.timeline: list[tuple[float, int]] = []

    def run(self, stop: threading.Event) -> None:
        last_mark = 0.0
        while not stop.is_set():
            now = time.monotonic()
            for node in self.nodes:
                node.poll(now)
            for node in self.nodes:
                if node.core.next_step_at <= now:
                    self.num_sent += node.step(time.monotonic())   # stamped when handed to the bus
            now = time.monotonic()
            if now - last_mark >= TIMELINE_EVERY_S:
                self.timeline.append((now, self.num_sent))
                last_mark = now
            wait = min(node.core.next_step_at for node in self.nodes) - now
            if wait > 0:
                time.sleep(min(wait, POLL_S))
        self.timeline.append((time.monotonic(), self.num_sent))
