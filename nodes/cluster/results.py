"""What a caller of the cluster client gets back: each token (`StreamToken`), the finished request
(`GenerationResult`), what serving it took (`RequestTrace`), or why it failed for good
(`ClusterError`). Plain values: no bus, no clock.

`RequestTrace` says which nodes served the request (decode/prefill node ids per attempt), the
plans, every failure ("code@node") and whether a failover or the local-prefill fallback happened,
the KV transfers' reports, and the per-stage timings (plan, queue, prefill, KV transfer, decode
queue, decode, TTFT, total). An attempt records into it as it goes (nodes/cluster/attempt.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodes.engines.engine_types import TokenLogprobs


@dataclass(frozen=True, slots=True)
class StreamToken:
    index: int
    token_id: int
    text: str
    logprobs: TokenLogprobs | None = None   # when the request asked (`sampling.logprobs`)


@dataclass
class RequestTrace:
    request_id: str
    session_id: str
    decode_node_ids: list[str] = field(default_factory=list)
    prefill_node_ids: list[str] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)     # "code@node" per failed attempt
    num_failovers: int = 0                                 # decode resumes after a lost/stalled node
    num_prefill_retries: int = 0
    num_bad_replies: int = 0                               # replies that did not parse (nodes/wire/)
    fallback_local: bool = False
    kv_wire_bytes: int = 0
    num_cached_tokens: int = 0                             # prompt tokens whose KV was not computed (a cache gave it)
    num_kv_held_tokens: int = 0                            # prompt tokens whose KV the decode node held: not sent
    kv_transfers: list[dict] = field(default_factory=list)  # each transfer's report (prefill FINAL), as sent
    timings: dict[str, float | None] = field(default_factory=dict)
    decode_final: dict | None = None                        # the decode FINAL, as read and sent again

    @property
    def failed_over(self) -> bool:
        return self.num_failovers > 0

    @property
    def kv_mode(self) -> str:
        """How the last KV transfer travelled (`int8`, `raw+lz4`, ...: the compression only when a
        codec was used); "" when no KV moved."""
        if not self.kv_transfers:
            return ""
        mode, compression = self.kv_transfers[-1].get("mode", "?"), self.kv_transfers[-1].get("compression", "")
        return mode if compression in ("none", "") else f"{mode}+{compression}"


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    session_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None
    usage: dict[str, int]
    trace: RequestTrace
    tokens: tuple[StreamToken, ...] = ()                        # each with its logprobs, when asked
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()      # with `sampling.prompt_logprobs`


class ClusterError(Exception):
    """The request failed for good: `code`, `message`, and the trace of what was tried."""

    def __init__(self, code: str, message: str, trace: RequestTrace, **details: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.trace, self.details = code, message, trace, details
