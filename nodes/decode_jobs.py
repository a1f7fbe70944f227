"""What a decode node keeps per request while its KV is on the way and while it decodes.

Contract: `DecodeJob` is one admitted decode request (its plan, reserved blocks, the transfers
planned or received for it, the verified ones that `arrived`, the `kv_ready` first tokens, the
node id its kv_ready came from, what it streamed); `KvArrived` is the event the KV thread posts
into the node's inbox for every finished receive, ok or not. `DecodeJob.kv_ready_refusal(transfer_id,
peer)` says why a kv_ready is not accepted (docs/SECURITY.md, "Transfer binding"):
`unknown_request` (not waiting for remote KV), `unknown_transfer` (a transfer neither planned nor
received for it), `wrong_peer` (another node's kv_ready was accepted first and its transfer has
not failed). `final_body` builds the FINAL `done`. nodes/decode.py owns the logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bus.kv import TransferResult
from nodes import cluster_wire as wire
from nodes.engines.base import SamplingParams, TokenEvent
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
    ready_peer: str | None = None      # the node whose kv_ready was accepted (DIRECT peer)
    ready_transfer: str = ""           # ...naming this transfer
    running: bool = False
    tokens: list[list] = field(default_factory=list)
    num_cached_tokens: int = 0
    kv_raw_bytes: int = 0
    kv_wire_bytes: int = 0
    expires_at: float = 0.0
    clock: StageClock = field(default_factory=StageClock)

    def kv_ready_refusal(self, transfer_id: str, peer: str) -> str:
        if self.running or self.plan != wire.PLAN_REMOTE:
            return "unknown_request"
        if transfer_id not in self.transfer_ids:
            return "unknown_transfer"
        if self.ready_peer is not None and self.ready_peer != peer:
            return "wrong_peer"
        return ""

    def accept_kv_ready(self, transfer_id: str, peer: str, first_token_id: int) -> None:
        self.ready_peer, self.ready_transfer = peer, transfer_id
        self.kv_ready[transfer_id] = first_token_id

    def transfer_failed(self, transfer_id: str) -> None:
        """The receive of `transfer_id` failed: its kv_ready (if any) no longer binds the request,
        so the client's retry on another prefill node can be accepted."""
        self.kv_ready.pop(transfer_id, None)
        if transfer_id == self.ready_transfer:
            self.ready_peer, self.ready_transfer = None, ""


def final_body(job: DecodeJob, event: TokenEvent, node_id: str, stats: Any, num_kv_bytes_received: int) -> dict:
    """The FINAL `done`: every token streamed, usage, stage timings, the request's and the node's
    counters (`stats`: the engine's)."""
    num_output = event.index + (1 if event.token_id is not None else 0)
    return {"type": "done", "node_id": node_id, "finish_reason": event.finish_reason,
            "tokens": job.tokens, "plan": job.plan,
            "usage": {"prompt_tokens": len(job.prompt), "completion_tokens": num_output},
            "timings": {"kv_wait_s": job.clock.seconds("planned", "kv_arrived"),
                        "decode_queue_s": job.clock.seconds("admitted", "first_token"),
                        "decode_s": job.clock.seconds("first_token", "finished")},
            "stats": {"num_cached_tokens": job.num_cached_tokens, "kv_raw_bytes": job.kv_raw_bytes,
                      "kv_wire_bytes": job.kv_wire_bytes, "node_kv_bytes_received": num_kv_bytes_received,
                      "node_prefilled_tokens": stats.num_prefilled_tokens,
                      "node_imported_tokens": stats.num_imported_tokens,
                      "node_reused_tokens": stats.num_reused_tokens}}
