"""A bus client peer: registers as a `gateway` node and streams replies to its requests.

Contract (what the gateway and the cluster's bus-level client wrap):
- `BusClient(broker_endpoint, node_id=None, heartbeat=None, security=None)`; `start(timeout)` /
  `await start_async(timeout)` return once the broker acknowledged us (TimeoutError otherwise);
  `close()`; sync and async context manager.
- `stream(service, body, payload=(), key="", request_id=None, timeout=None) -> ReplyStream`:
  `async for reply in client.stream("decode", {...}, key=session_id)` yields `Partial`s then the
  `Final`; an ERROR ends it with `BusError` (code `node_lost` carries details node_id and
  num_replies, so failover can resume from the last sequence number delivered).
- `await call(...)` / `call_blocking(...)`: the whole stream as a list, FINAL last.
Being a registered peer, the client is watched by the broker: if it dies, the nodes serving its
requests receive CANCEL `client_lost`; and it re-registers with its pending request ids after a
broker restart, so their streams continue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from bus.endpoint import Endpoint
from bus.liveness import HeartbeatConfig
from bus.mailbox import ReplyStream
from bus.messages import Final, Partial
from bus.security import SecurityConfig


class BusClient:
    def __init__(self, broker_endpoint: str, node_id: str | None = None, *,
                 heartbeat: HeartbeatConfig | None = None,
                 capacity: Mapping[str, float] | None = None,
                 security: SecurityConfig | None = None) -> None:
        self.endpoint = Endpoint(broker_endpoint, "gateway", node_id, heartbeat=heartbeat,
                                 capacity=capacity, security=security)
        self.node_id = self.endpoint.node_id

    def start(self, timeout: float = 5.0) -> BusClient:
        self.endpoint.start()
        if not self.endpoint.wait_registered(timeout):
            self.endpoint.stop()
            raise TimeoutError(f"broker at {self.endpoint.broker_endpoint} did not answer in {timeout}s")
        return self

    async def start_async(self, timeout: float = 5.0) -> BusClient:
        return await asyncio.to_thread(self.start, timeout)

    def close(self) -> None:
        self.endpoint.stop()

    def stream(self, service: str, body: Any = None, payload: tuple = (), *, key: str = "",
               request_id: str | None = None, timeout: float | None = None) -> ReplyStream:
        return self.endpoint.request(service, body, payload, key=key, request_id=request_id,
                                     timeout=timeout)

    async def call(self, service: str, body: Any = None, payload: tuple = (), **options: Any
                   ) -> list[Partial | Final]:
        return await self.stream(service, body, payload, **options).collect_async()

    def call_blocking(self, service: str, body: Any = None, payload: tuple = (), **options: Any
                      ) -> list[Partial | Final]:
        return self.stream(service, body, payload, **options).collect()

    def __enter__(self) -> BusClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> BusClient:
        return await self.start_async()

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)
