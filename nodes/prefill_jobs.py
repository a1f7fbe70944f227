"""What a prefill node keeps per request, per running pass, and what its KV thread posts back.

Contract: `PrefillJob` is one prefill request from arrival to its FINAL (where its reply stream
and its KV go, its stage clock, the first token once sampled, whether its send started and, for a
send started inside the pass, the engine's DeviceExport); `RunningPass` is one pass of prompts
(`Engine.start_prefill`) and whether it is urgent; `KvSendDone` is what the KV thread posts into
the node's inbox when a send ended (its report, or an error). Plain data: nodes/prefill_node.py
owns the logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bus.kv import TransferReport
from nodes import wire
from nodes.engines.base import PrefillPass, TokenLogprobs
from nodes.runtime import StageClock

# A send that started inside the pass (the KV encoded on the device) and finished before the first
# token was sampled looks for it this often: the token follows the last layer within milliseconds.
FIRST_TOKEN_POLL_S = 0.001

@dataclass(frozen=True, slots=True)
class KvSendDone:
    """Posted by the KV thread into the node's inbox when a send ended."""

    request_id: str
    report: TransferReport | None
    error: str = ""


@dataclass
class PrefillJob:
    request_id: str          # the prefill REQUEST's id (our reply stream)
    decode_request_id: str   # the decode request the KV is for
    decode_node_id: str
    data_endpoint: str
    transfer_id: str
    num_prompt_tokens: int
    urgent: bool = False     # a recovery (re-sent prefill, resumed stream): runs before queued work
    clock: StageClock = field(default_factory=StageClock)
    first_token: wire.TokenBody | None = None
    num_cached_tokens: int = 0   # leading prompt tokens whose KV came from the prefix cache
    kv_offset: int = 0           # leading prompt tokens whose KV the decode node holds: not sent
    sending: bool = False
    export: Any = None           # its DeviceExport when the send started inside the pass
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()   # when the request asked (its FINAL carries them)


@dataclass(frozen=True, slots=True)
class RunningPass:
    prefill: PrefillPass
    urgent: bool
    request_ids: tuple[str, ...]
