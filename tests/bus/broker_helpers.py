"""Helpers for driving a BrokerCore by hand: peers are identities, output is decoded."""

from __future__ import annotations

from bus import codec
from bus.broker_core import BrokerCore
from bus.messages import Heartbeat, Ready


class BrokerDriver:
    def __init__(self, core: BrokerCore, clock) -> None:
        self.core = core
        self.clock = clock

    def send(self, identity: bytes, message) -> None:
        self.core.on_frames(identity, codec.encode(message), self.clock.now)

    def send_raw(self, identity: bytes, frames: list) -> None:
        self.core.on_frames(identity, frames, self.clock.now)

    def register(self, identity: bytes, role: str, node_id: str, **fields) -> None:
        self.send(identity, Ready(role, node_id, **fields))

    def outgoing(self) -> list[tuple[bytes, object]]:
        """(destination identity, decoded message) for everything the broker queued."""
        return [(frames[0], codec.decode([bytes(f) for f in frames[1:]]))
                for frames in self.core.take_outbox()]

    def to(self, identity: bytes) -> list:
        return [message for dest, message in self.outgoing() if dest == identity]

    def tick(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)
        self.core.tick(self.clock.now)

    def keep_alive(self, seconds: float, *identities: bytes, step: float = 0.2) -> None:
        """Let `seconds` pass in ticks while `identities` keep heartbeating."""
        end = self.clock.now + seconds
        while self.clock.now < end - 1e-9:
            self.tick(min(step, end - self.clock.now))
            for identity in identities:
                self.send(identity, Heartbeat())
