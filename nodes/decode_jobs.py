"""What a decode node keeps per request while its KV is on the way and while it decodes.

Contract: `DecodeJob` is one admitted decode request (its plan, reserved blocks, the transfers
planned for it, the verified ones that `arrived` and the `kv_ready` first tokens, what it
streamed); `KvArrived` is the event the KV thread posts into the node's inbox for every finished
receive, ok or not. Plain data: nodes/decode.py owns the logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bus.kv import TransferResult
from nodes.engines.base import SamplingParams
from nodes.runtime import StageClock


@dataclass(frozen=True, slots=True)
class KvArrived:
    """Posted by the KV thread into the node's inbox for every finished receive (ok or not)."""

    result: TransferResult


@dataclass
class DecodeJob:
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    session_id: str | None
    plan: str
    num_blocks: int = 0
    transfer_ids: set[str] = field(default_factory=set)
    arrived: dict[str, TransferResult] = field(default_factory=dict)
    kv_ready: dict[str, int] = field(default_factory=dict)
    running: bool = False
    tokens: list[list] = field(default_factory=list)
    num_cached_tokens: int = 0
    kv_raw_bytes: int = 0
    kv_wire_bytes: int = 0
    expires_at: float = 0.0
    clock: StageClock = field(default_factory=StageClock)
