"""Fault injection for the KV data plane: flip bytes in or drop outbound messages.

Contract: off unless a `FaultInjector` is passed explicitly to `KVSender(faults=...)` or
`KVReceiver(faults=...)` (the chaos harness does; nothing reads it from the environment).
`apply(frames)` returns the frames to send (a flipped frame is a copy: the sender's buffers stay
intact for the resend) or None to drop the message. Seeded, so a failing chaos run replays.
`only_kinds` limits faults to some message kinds (e.g. CHUNK) and `max_faults` bounds how many.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from bus.kv.frames import MAGIC


@dataclass
class FaultInjector:
    flip_probability: float = 0.0     # per message: flip one byte of one payload frame (or the header)
    drop_probability: float = 0.0     # per message: drop it
    seed: int = 0
    only_kinds: tuple[int, ...] = ()  # message kind bytes (frames.CHUNK...); empty = all
    max_faults: int | None = None
    flips: int = 0
    drops: int = 0
    _random: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    @property
    def num_faults(self) -> int:
        return self.flips + self.drops

    def _eligible(self, frames: list[Any]) -> bool:
        if self.max_faults is not None and self.num_faults >= self.max_faults:
            return False
        if not self.only_kinds:
            return True
        header = bytes(memoryview(frames[0])[: len(MAGIC) + 2])
        return len(header) == len(MAGIC) + 2 and header[-1] in self.only_kinds

    def apply(self, frames: list[Any]) -> list[Any] | None:
        if not self._eligible(frames):
            return frames
        if self._random.random() < self.drop_probability:
            self.drops += 1
            return None
        if self._random.random() < self.flip_probability:
            self.flips += 1
            return self._flip(frames)
        return frames

    def _flip(self, frames: list[Any]) -> list[Any]:
        candidates = [i for i, f in enumerate(frames) if len(memoryview(f).cast("B")) > 0]
        which = candidates[-1] if len(candidates) > 1 and self._random.random() < 0.8 else candidates[0]
        data = bytearray(memoryview(frames[which]).cast("B"))
        position = self._random.randrange(len(data))
        data[position] ^= 1 << self._random.randrange(8)
        return [*frames[:which], bytes(data), *frames[which + 1:]]
