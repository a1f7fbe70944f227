"""The fuzz loop: bursts of generated hostile traffic at every target until the time is up.

Contract: `await Fuzzer(view, seed=, batch=).run(seconds, warmup_s, on_warm, on_sample)` -> the
seconds fuzzed; then `fuzzer.counts` (bus_peer.Counts) and `fuzzer.sampler.rounds`. `view` says
where the cluster listens and holds its processes (`procs`, read for live request and transfer ids
only). Each target runs its own loop of bursts of `batch` drawn examples (fewer for HTTP and
WebSocket), side by side; hypothesis draws one batch at a time for all of them:
- `broker`: control-plane messages from a fresh, unregistered DEALER;
- `session.gateway|prefill|decode`: the same from inside a registered session of that role; the
  prefill and decode sessions also serve what the broker routes to them as hostile nodes
  (hostile_node.serve); sessions are replaced every `SESSION_S` with new node ids;
- `kv`: KV data-plane messages at each decode node's KV endpoint;
- `http`, `ws`: the gateway's HTTP and WebSocket APIs.
Beside the bursts a provoker streams a small well-formed request through the gateway every
`PROVOKE_S`, so the hostile nodes get REQUESTs to answer. `on_warm()` is called once, after
`warmup_s`, and `on_sample()` every `SAMPLE_S`. Everything the loop opened is closed when it
returns (sessions say DISCONNECT).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import zmq.asyncio

from harness.fuzz import forged_frames
from harness.fuzz import http_strategies as hs
from harness.fuzz import strategies as s
from harness.fuzz.bus_peer import Counts, Session, garbage_burst
from harness.fuzz.hostile_node import serve
from harness.fuzz.http_peer import complete, http_send, ws_send
from harness.fuzz.kv_peer import KvPeer
from harness.fuzz.sampler import Sampler

TARGETS = ("broker", "session.gateway", "session.prefill", "session.decode", "kv", "http", "ws")
SESSION_S = 20.0
SAMPLE_S = 10.0
PROVOKE_S = 0.5
ID_EVENTS = {"kv_received": ("request_id", "transfer_id"), "kv_arrived": ("request_id", "transfer_id"),
             "prefill_done": ("decode_request_id", None)}


@dataclass
class ClusterView:
    broker_endpoint: str
    gateway_url: str
    kv_endpoints: dict[str, str]              # decode node id -> its KV data endpoint
    node_ids: list[str]
    procs: dict[str, Any] = field(default_factory=dict)


class Fuzzer:
    def __init__(self, view: ClusterView, *, seed: int = 0, batch: int = 32, targets: tuple[str, ...] = TARGETS) -> None:
        self.view, self.batch, self.targets = view, batch, targets
        self.counts = Counts()
        self.sampler = Sampler(seed)
        self.known = forged_frames.Known(node_ids=list(view.node_ids), data_endpoints=list(view.kv_endpoints.values()),
                                geometry=forged_frames.tiny_geometry())
        self.control, self.kv = s.control(self.known), s.kv(self.known)
        self.sessions: dict[str, Session] = {}
        self.kv_peers: dict[str, KvPeer] = {}
        self.tasks: list[asyncio.Task] = []
        self.servers: list[asyncio.Task] = []   # the hostile nodes of the current sessions
        self.generation = 0
        self._seen_events: dict[str, int] = {}

    async def run(self, seconds: float, warmup_s: float = 0.0, on_warm: Callable[[], None] | None = None,
                  on_sample: Callable[[], None] | None = None) -> float:
        self.context = zmq.asyncio.Context()
        started = time.monotonic()
        try:
            self.kv_peers = {ep: KvPeer(self.context, ep, self.counts).start() for ep in self.view.kv_endpoints.values()}
            self.tasks.append(asyncio.create_task(self._provoke()))
            self.sessions = await self._open_sessions()
            self.tasks.append(asyncio.create_task(self._upkeep(warmup_s, on_warm, on_sample)))
            await asyncio.gather(*(self._worker(target, started + seconds) for target in self.targets))
            return time.monotonic() - started
        finally:
            await self._close()

    async def _worker(self, target: str, deadline: float) -> None:
        """One target's bursts until the deadline; the targets run side by side, so the slow ones
        (HTTP answers, forged transfers) never hold back the others."""
        while time.monotonic() < deadline:
            try:
                await self.burst(target)
            except zmq.ZMQError:   # a session closed under it by a rotation: the next burst takes the new one
                self.counts[f"rotated.{target}"] += 1

    async def _upkeep(self, warmup_s: float, on_warm: Callable[[], None] | None,
                      on_sample: Callable[[], None] | None) -> None:
        """The baseline after the warm-up, a sample every SAMPLE_S, live ids from the logs, new
        sessions every SESSION_S."""
        started = rotated = sampled = time.monotonic()
        warm = False
        while True:
            await asyncio.sleep(0.5)
            self.harvest()
            if on_sample is not None and time.monotonic() - sampled >= SAMPLE_S:
                sampled = time.monotonic()
                on_sample()
            if not warm and time.monotonic() - started >= warmup_s:
                warm = True
                if on_warm is not None:
                    on_warm()
            if time.monotonic() - rotated >= SESSION_S:
                rotated = time.monotonic()
                old, old_servers = self.sessions, self.servers
                self.servers = []
                self.sessions = await self._open_sessions()
                await self._close_sessions(old, old_servers)

    async def burst(self, target: str) -> None:
        if target == "broker":
            await garbage_burst(self.context, self.view.broker_endpoint, await self.sampler.adraw(self.control, self.batch),
                                self.counts)
        elif target.startswith("session."):
            session = self.sessions.get(target.removeprefix("session."))
            for kind, frames in await self.sampler.adraw(self.control, self.batch):
                if session is not None:
                    await session.send(kind, frames)
        elif target == "kv":
            for kind, frames in await self.sampler.adraw(self.kv, self.batch):
                for peer in self.kv_peers.values():
                    await peer.send(kind, frames)
        elif target == "http":
            address = urlsplit(self.view.gateway_url)
            host, port = address.hostname, address.port
            assert host is not None and port is not None   # the gateway's URL is http://HOST:PORT
            requests = await self.sampler.adraw(hs.http_request(), max(1, self.batch // 4))
            await asyncio.gather(*(http_send(host, port, kind, raw, self.counts)
                                   for kind, raw in requests))
        elif target == "ws":
            url = self.view.gateway_url.replace("http://", "ws://") + "/v1/stream"
            sessions = await self.sampler.adraw(hs.ws_messages, max(1, self.batch // 8))
            await asyncio.gather(*(ws_send(url, messages, self.counts) for messages in sessions))

    def harvest(self) -> None:
        """Live request and transfer ids from the processes' logs, for forgeries around real routes."""
        for name, proc in self.view.procs.items():
            events = proc.events
            start, self._seen_events[name] = self._seen_events.get(name, 0), len(events)
            for event in events[start:len(events)]:
                request_key, transfer_key = ID_EVENTS.get(event.get("event"), (None, None))
                if request_key and isinstance(event.get(request_key), str):
                    self.known.request_ids.append(event[request_key])
                if transfer_key and isinstance(event.get(transfer_key), str):
                    self.known.transfer_ids.append(event[transfer_key])
        del self.known.request_ids[:-256], self.known.transfer_ids[:-256]

    async def _open_sessions(self) -> dict[str, Session]:
        n, endpoint, counts = self.generation, self.view.broker_endpoint, self.counts
        self.generation += 1
        sessions = {
            "gateway": Session(self.context, endpoint, "gateway", f"fuzz-gateway-{n}", counts),
            "prefill": Session(self.context, endpoint, "prefill", f"a-fuzz-prefill-{n}", counts,
                               capacity={"max_batch_tokens": 2048, "queued_tokens": 0}),
            "decode": Session(self.context, endpoint, "decode", f"fuzz-decode-{n}", counts,
                              capacity={"kv_blocks_total": 512, "kv_blocks_free": 512, "max_running": 16}),
        }
        for role, session in sessions.items():
            if not await session.start():
                counts[f"session.{role}.not_registered"] += 1
            if role != "gateway":
                self.servers.append(asyncio.create_task(serve(session, self.sampler, self.known, self.kv_peers, counts)))
        return sessions

    async def _close_sessions(self, sessions: dict[str, Session], servers: list[asyncio.Task]) -> None:
        await _cancel(servers)
        for session in sessions.values():
            await session.close()
            self.counts["sessions.closed"] += 1

    async def _provoke(self) -> None:
        while True:
            result = await complete(self.view.gateway_url, max_tokens=2, timeout=4.0, prompt="provoke")
            self.counts[f"provoked.{'ok' if result['ok'] else 'failed'}"] += 1
            await asyncio.sleep(PROVOKE_S)

    async def _close(self) -> None:
        await _cancel(self.tasks)
        await self._close_sessions(self.sessions, self.servers)
        for peer in self.kv_peers.values():
            await peer.close()
        self.context.destroy(linger=0)


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task
