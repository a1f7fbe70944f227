"""Fakes for the planner's shell: a `control` endpoint answering the broker's stats from a list,
and an actuator that records what it was asked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus.constants import BROKER_STATS_SERVICE


@dataclass
class Reply:
    body: Any


class FakeStream:
    def __init__(self, outcome: Any) -> None:
        self.outcome, self.cancelled = outcome, False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Reply:
        if self.cancelled:
            raise StopAsyncIteration
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        self.cancelled = True
        return Reply(self.outcome)

    def cancel(self) -> None:
        self.cancelled = True


class FakeEndpoint:
    """`registered`; `request(stats)` answers the next body of `bodies` (an exception is raised);
    `send_control` records (node_id, body), or raises `control_error` when set."""

    def __init__(self, bodies: list[Any], registered: bool = True) -> None:
        self.bodies, self.registered = list(bodies), registered
        self.controls: list[tuple[str, dict]] = []
        self.streams: list[FakeStream] = []
        self.control_error: Exception | None = None

    def request(self, service: str, body: Any = None, payload: tuple = (), *, key: str = "",
                request_id: str | None = None, timeout: float | None = None) -> FakeStream:
        assert service == BROKER_STATS_SERVICE and timeout
        stream = FakeStream(self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0])
        self.streams.append(stream)
        return stream

    def send_control(self, node_id: str, body: Mapping[str, Any]) -> None:
        if self.control_error is not None:
            raise self.control_error
        self.controls.append((node_id, dict(body)))


class FakeActuator:
    def __init__(self, can_start: bool = True, start_as: str | None = "decode-9",
                 error: Exception | None = None) -> None:
        self.starts: list[str] = []
        self.stops: list[str] = []
        self._can_start, self.start_as, self.error = can_start, start_as, error

    def can_start(self) -> bool:
        return self._can_start

    def start_node(self, role: str) -> str | None:
        if self.error is not None:
            raise self.error
        self.starts.append(role)
        return self.start_as

    def stop_node(self, node_id: str) -> None:
        self.stops.append(node_id)
