"""The broker process: a ROUTER socket, `BrokerCore` and a `RouterReactor` on uvloop.

Contract:
- `Broker(endpoint, heartbeat=, policy=, max_message_bytes=)`; `await broker.serve()` binds and
  serves until `broker.stop()` (then DISCONNECTs every node). `bound_endpoint` is the endpoint
  actually bound (a `tcp://host:0` endpoint gets a free port). `broker.core` exposes the
  registry (`nodes_by_id`), the routes and `metrics` (a Counter) for tests and the scheduler.
- `add_listener(callback)`: `callback(event)` for every NodeJoined / NodeLeft /
  CapacityChanged / PeerRejected, on the broker's loop, after the core has handled it.
- `security=SecurityConfig` (optional): CURVE on the ROUTER, a ZAP `Gatekeeper` admitting the
  configured keys only, and READY accepted only for a role the sender's key is admitted for and
  for a node id no other key registered first.
- `run_broker(..., policy=)`: the `pdbus broker` process: uvloop, SIGINT/SIGTERM stop it cleanly.
- A socket monitor on the ROUTER reports every closed connection to the core
  (`on_connection_closed`), so a killed node is found by probing, before its liveness expires.
Every event is logged (structlog, JSON in production): node_joined, node_left (reason,
silent_for_s, lost requests), capacity_changed, message_rejected.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import uvloop
import zmq
from zmq.utils.monitor import recv_monitor_message

from bus import constants as c
from bus.broker_core import BrokerCore
from bus.broker_tables import (
    BrokerEvent,
    CapacityChanged,
    NodeJoined,
    NodeLeft,
    PeerRejected,
    RequestsAdopted,
)
from bus.liveness import HeartbeatConfig
from bus.log import get_logger
from bus.reactor import RouterReactor
from bus.routing import RoutingPolicy
from bus.security import Gatekeeper, SecurityConfig, apply_server, principal_of

_HWM = 100_000


class Broker:
    def __init__(self, endpoint: str = c.DEFAULT_ENDPOINT, *, heartbeat: HeartbeatConfig | None = None,
                 policy: RoutingPolicy | None = None,
                 max_message_bytes: int = c.DEFAULT_MAX_MESSAGE_BYTES,
                 context: zmq.Context | None = None, security: SecurityConfig | None = None) -> None:
        self.endpoint = endpoint
        self.security = security
        self.core = BrokerCore(heartbeat, policy, max_message_bytes,
                               authorize=self._authorize if security else None,
                               identify=self._identify if security else None)
        self.bound_endpoint: str | None = None
        self.log = get_logger("broker")
        # ZAP is per context: a CURVE broker owns its context, so its Gatekeeper is the only one.
        self._context = zmq.Context() if security else (context or zmq.Context.instance())
        self.gatekeeper: Gatekeeper | None = None
        self._listeners: list[Callable[[BrokerEvent], None]] = []
        self._reactor: RouterReactor | None = None
        self._monitor_timer: asyncio.TimerHandle | None = None
        self._bound = asyncio.Event()

    def add_listener(self, callback: Callable[[BrokerEvent], None]) -> None:
        self._listeners.append(callback)

    async def wait_bound(self) -> str:
        await self._bound.wait()
        assert self.bound_endpoint is not None   # set by _bind, before _bound is
        return self.bound_endpoint

    async def serve(self) -> None:
        socket = self._bind()
        self._reactor = RouterReactor(socket, self.core, self.core.heartbeat.tick_s,
                                      after_batch=self._publish_events)
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        loop = asyncio.get_running_loop()
        loop.add_reader(monitor.fileno(), self._on_monitor, monitor)
        self._poll_monitor(monitor, loop)
        self.log.info("broker_started", endpoint=self.bound_endpoint,
                      heartbeat_ms=self.core.heartbeat.interval_s * 1000,
                      liveness=self.core.heartbeat.liveness)
        self._bound.set()
        try:
            await self._reactor.run()
        finally:
            loop.remove_reader(monitor.fileno())
            if self._monitor_timer is not None:
                self._monitor_timer.cancel()
            socket.disable_monitor()
            monitor.close(linger=0)
            self.core.shutdown(time.monotonic())
            self._reactor.flush()
            socket.close(linger=200)
            if self.gatekeeper is not None:
                self.gatekeeper.stop()
                self.core.metrics.update(self.gatekeeper.metrics)
            self.log.info("broker_stopped", metrics=dict(self.core.metrics),
                          policy_metrics=dict(getattr(self.core.policy, "metrics", {})))

    def stop(self) -> None:
        if self._reactor is not None:
            self._reactor.stop()

    def _poll_monitor(self, monitor: zmq.Socket, loop: asyncio.AbstractEventLoop) -> None:
        """Drain the monitor every tick too: its FD is edge-triggered, and a missed edge would leave
        events queued until libzmq's I/O thread blocks on the full monitor pipe (all I/O stops)."""
        self._on_monitor(monitor)
        self._monitor_timer = loop.call_later(self.core.heartbeat.tick_s, self._poll_monitor, monitor, loop)

    def _on_monitor(self, monitor: zmq.Socket) -> None:
        """Drain the monitor (its FD is edge-triggered); probe once for all the closes seen."""
        closed = 0
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            closed += event["event"] == zmq.EVENT_DISCONNECTED
        if closed and self._reactor is not None:
            self.core.on_connection_closed(time.monotonic())
            self._reactor.flush()

    def _bind(self) -> zmq.Socket:
        socket = self._context.socket(zmq.ROUTER)
        for option, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.SNDHWM, _HWM), (zmq.RCVHWM, _HWM),
                              (zmq.LINGER, 0), (zmq.MAXMSGSIZE, self.core.max_message_bytes)):
            socket.setsockopt(option, value)
        if self.security is not None:
            self.gatekeeper = Gatekeeper.started(self._context, self.security)
            apply_server(socket, self.security)
        socket.bind(self.endpoint)
        self.bound_endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        return socket

    def _authorize(self, header_frame: Any, role: str) -> str | None:
        """Why the sender of this READY may not register as `role` (None: it may)."""
        assert self.security is not None   # only a CURVE broker authorizes
        principal = principal_of(header_frame, self.security)
        if principal is None:
            return "no admitted CURVE key"
        if role not in principal.roles:
            return f"key {principal.name!r} is not admitted as {role!r}"
        return None

    @staticmethod
    def _identify(header_frame: Any) -> str | None:
        """The sender's CURVE public key (ZAP made it the connection's User-Id): node ids bind to it."""
        try:
            return header_frame.get("User-Id") or None
        except (AttributeError, zmq.ZMQError):
            return None

    def _publish_events(self) -> None:
        if not self.core.events:
            return
        for event in self.core.take_events():
            self._log_event(event)
            for listener in self._listeners:
                listener(event)

    def _log_event(self, event: BrokerEvent) -> None:
        if isinstance(event, NodeJoined):
            self.log.info("node_joined", node_id=event.node_id, role=event.role,
                          capacity=event.capacity, data_endpoint=event.data_endpoint,
                          num_inflight=event.num_inflight)
        elif isinstance(event, NodeLeft):
            self.log.warning("node_left", node_id=event.node_id, role=event.role, reason=event.reason,
                             silent_for_s=round(event.silent_for_s, 3),
                             lost_request_ids=list(event.lost_request_ids))
        elif isinstance(event, CapacityChanged):
            self.log.debug("capacity_changed", node_id=event.node_id, capacity=event.capacity)
        elif isinstance(event, RequestsAdopted):
            self.log.info("requests_adopted", node_id=event.node_id, num_inflight=event.num_inflight,
                          num_pending=event.num_pending, num_requests=event.num_inflight + event.num_pending)
        elif isinstance(event, PeerRejected):
            self.log.warning("message_rejected", reason=event.reason, detail=event.detail,
                             node_id=event.node_id, identity=event.identity.hex())


def run_broker(endpoint: str, heartbeat: HeartbeatConfig,
               max_message_bytes: int = c.DEFAULT_MAX_MESSAGE_BYTES,
               policy: RoutingPolicy | None = None, security: SecurityConfig | None = None) -> int:
    """Serve in the foreground until SIGINT/SIGTERM; the process exit code."""
    async def main() -> None:
        broker = Broker(endpoint, heartbeat=heartbeat, max_message_bytes=max_message_bytes,
                        policy=policy, security=security)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, broker.stop)
        await broker.serve()

    uvloop.run(main())
    return 0
