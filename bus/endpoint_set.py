"""One node's registrations with every broker of a cluster, sans I/O: an `EndpointCore` per
broker, app calls routed to the right one, and failover between them (docs/PROTOCOL.md §1.12).

Contract for the shell (bus.endpoint), as for `EndpointCore` but per broker `index`:
`on_socket_opened(index, now)`, `on_frames(index, frames, now)`, `tick(now) -> [index, ...]`
(brokers whose socket must be reopened), then send every `(index, frames)` of `take_outbox()`
and dispatch `take_events()`. `LinkUp` is reported when the first broker acknowledges us and
`LinkDown` when the last one is lost; node code sees one bus.
App calls: `request_encoded` goes through the registered brokers in turn (the broker a request
went through carries its replies and its CANCEL); `reply`, `reply_batch`, `reply_error` go
through the broker the request came from; `direct_encoded` and `control_encoded` through a
registered broker; `update_capacity`, `change_role` and `close` to all.
Failover: when a broker's link is lost (its `LinkDown`), whatever its core held — the requests
it serves (with their replay window), the streams it awaits, its backlog — moves to a
registered broker's core, which announces the requests with ADOPT and sends the replayed
replies after it. That broker routes them as it would after a restart (`bus.broker_restart`):
the serving node's and the client's announcements meet, replies wait for a client not yet
moved, and the client's sequence numbers drop duplicates. With no broker registered the core
keeps everything and announces it in READY when its broker comes back, as with one broker.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from bus import codec
from bus.endpoint_core import EndpointCore, LinkDown, LinkUp
from bus.liveness import HeartbeatConfig
from bus.messages import Adopt, Error, Final


class EndpointSet:
    def __init__(self, role: str, node_id: str, num_brokers: int = 1, capacity: Mapping[str, float] | None = None,
                 data_endpoint: str = "", heartbeat: HeartbeatConfig | None = None,
                 rng: random.Random | None = None, max_backlog: int = 100_000) -> None:
        if num_brokers < 1:
            raise ValueError("an endpoint needs at least one broker")
        self.cores = [EndpointCore(role, node_id, capacity, data_endpoint, heartbeat, rng, max_backlog)
                      for _ in range(num_brokers)]
        self.role, self.node_id, self.heartbeat = role, node_id, self.cores[0].heartbeat
        self.via: dict[str, int] = {}   # request id we sent -> the broker it went through
        self.metrics: Counter[str] = Counter()
        self.events: list[Any] = []
        self._turn = 0
        self._up = False
        self._down_reason = ""   # the last lost link's (reported when no broker is left)

    # -- what the shell and node code read ----------------------------------------------------
    @property
    def registered(self) -> bool:
        return any(core.registered for core in self.cores)

    @property
    def data_endpoint(self) -> str:
        return self.cores[0].data_endpoint

    @data_endpoint.setter
    def data_endpoint(self, value: str) -> None:
        for core in self.cores:
            core.data_endpoint = value

    @property
    def capacity(self) -> dict[str, float]:
        return self.cores[0].capacity

    @capacity.setter
    def capacity(self, value: Mapping[str, float]) -> None:
        for core in self.cores:
            core.capacity = dict(value)

    def all_metrics(self) -> dict[str, int]:
        total = Counter(self.metrics)
        for core in self.cores:
            total.update(core.metrics)
        return dict(total)

    # -- shell -------------------------------------------------------------------------------
    def on_socket_opened(self, index: int, now: float) -> None:
        self.cores[index].on_socket_opened(now)

    def on_frames(self, index: int, frames: list, now: float) -> None:
        self.cores[index].on_frames(frames, now)
        self._collect(index, now)

    def tick(self, now: float) -> list[int]:
        reopen = [index for index, core in enumerate(self.cores) if core.tick(now)]
        for index in range(len(self.cores)):
            self._collect(index, now)
        return reopen

    def tick_interval(self) -> float:
        """The shortest of the links' (`EndpointCore.tick_interval`)."""
        return min(core.tick_interval() for core in self.cores)

    def close(self, now: float) -> None:
        for core in self.cores:
            core.close(now)

    def take_outbox(self) -> list[tuple[int, list]]:
        return [(index, frames) for index, core in enumerate(self.cores) for frames in core.take_outbox()]

    def take_events(self) -> list[Any]:
        events, self.events = self.events, []
        return events

    # -- app calls ---------------------------------------------------------------------------
    def request_encoded(self, request_id: str, frames: list, now: float) -> None:
        index = self._next_registered()
        self.via[request_id] = index
        self.cores[index].request_encoded(request_id, frames, now)
        self._collect(index, now)   # a request pushed out of a full backlog ends at once

    def cancel(self, request_id: str, now: float) -> None:
        index = self.via.pop(request_id, None)
        if index is not None:
            self.cores[index].cancel(request_id, now)

    def reply(self, request_id: str, body: Any, payload: tuple, final: bool, now: float) -> bool:
        return self._server(request_id).reply(request_id, body, payload, final, now)

    def reply_batch(self, items: Sequence[tuple[str, Any]], now: float) -> None:
        if len(self.cores) == 1:
            self.cores[0].reply_batch(items, now)
            return
        by_core: dict[int, list[tuple[str, Any]]] = {}
        for item in items:
            by_core.setdefault(self._server_index(item[0]), []).append(item)
        for index, batch in by_core.items():
            self.cores[index].reply_batch(batch, now)

    def reply_error(self, request_id: str, code: str, message: str, details: Mapping, now: float) -> bool:
        return self._server(request_id).reply_error(request_id, code, message, details, now)

    def direct_encoded(self, frames: list, now: float) -> None:
        self.cores[self._first_registered()].direct_encoded(frames, now)

    def control_encoded(self, frames: list, now: float) -> None:
        self.cores[self._first_registered()].control_encoded(frames, now)

    def change_role(self, role: str, now: float) -> None:
        for core in self.cores:
            core.change_role(role, now)
        self.role = role

    def update_capacity(self, capacity: Mapping[str, float], now: float) -> None:
        for core in self.cores:
            core.update_capacity(capacity, now)

    # -- routing between brokers -------------------------------------------------------------
    def _server_index(self, request_id: str) -> int:
        for index, core in enumerate(self.cores):
            if request_id in core.serving:
                return index
        return 0   # not ours (any more): that core counts the dropped reply

    def _server(self, request_id: str) -> EndpointCore:
        return self.cores[self._server_index(request_id)]

    def _first_registered(self) -> int:
        return next((i for i, core in enumerate(self.cores) if core.registered), 0)

    def _next_registered(self) -> int:
        """Registered brokers in turn (each takes a share of the requests); core 0's backlog
        while none is."""
        for step in range(len(self.cores)):
            index = (self._turn + step) % len(self.cores)
            if self.cores[index].registered:
                self._turn = index + 1
                return index
        return 0

    # -- events and failover -----------------------------------------------------------------
    def _collect(self, index: int, now: float) -> None:
        for event in self.cores[index].take_events():
            if isinstance(event, LinkDown):
                self._down_reason = event.reason
            if isinstance(event, LinkUp | LinkDown):
                continue
            if isinstance(event, Final | Error) and event.request_id in self.via and \
                    event.request_id not in self.cores[index].streams:
                self.via.pop(event.request_id, None)   # that stream ended
            self.events.append(event)
        if len(self.cores) > 1:
            self._hand_over_stranded(now)
        self._report_link()

    def _report_link(self) -> None:
        up = self.registered
        if up != self._up:
            self._up = up
            self.events.append(LinkUp() if up else LinkDown(self._down_reason))

    def _hand_over_stranded(self, now: float) -> None:
        """Move what unregistered cores hold to a registered one."""
        target = next((core for core in self.cores if core.registered), None)
        if target is None:
            return
        for index, core in enumerate(self.cores):
            if not core.registered and _holds_anything(core):
                self._hand_over(index, core, target, now)

    def _hand_over(self, index: int, source: EndpointCore, target: EndpointCore, now: float) -> None:
        moved_streams = [r for r in source.streams if not source.backlog.holds_request(r)]
        target.serving.update(source.serving)
        target.clients.update(source.clients)
        target.streams.update(source.streams)
        replay, backlog = source.replay, source.backlog.take_entries()
        inflight = dict.fromkeys([*source.serving, *(r for r, _ in replay if r)])
        for table in (source.serving, source.clients, source.streams):
            table.clear()
        source.replay = []
        target_index = self.cores.index(target)
        for request_id in list(self.via):
            if self.via[request_id] == index:
                self.via[request_id] = target_index
        if inflight or moved_streams:
            target.send_now(codec.encode(Adopt(tuple(inflight), tuple(moved_streams))), now)
        for replayed_id, frames in replay:
            target.send_replayable(replayed_id, frames, now)
        for backlog_id, frames in backlog:
            target.send_app(frames, now, backlog_id)
        self.metrics["failover.handovers"] += 1
        self.metrics["failover.requests"] += len(inflight) + len(moved_streams)


def _holds_anything(core: EndpointCore) -> bool:
    return bool(core.serving or core.streams or core.replay or len(core.backlog))
