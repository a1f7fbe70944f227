"""OpenAI response objects and stream chunks for completions and chat completions (pure), plus the
`pdbus` transparency object and headers.

Contract: `Shaper(request, model_name, response_id, created)` builds, for its kind (completion or
chat): `chunk(text, index, logprobs)`, `first_chunk(index)` (chat's role delta; None for
completions), `final_chunk(finish_reason, pdbus, text, index)`, `usage_chunk(usage)`,
`response(text, finish_reason, usage, pdbus)` (one choice) and `response_choices(choices, usage,
pdbus)` (each a `Choice`: index, text, finish_reason, logprobs field, chat tool calls);
`tool_chunk(choice)`: a held-back chat choice's content and `tool_calls` as one delta.
`pdbus_info(trace, kv_mode, session_id=None)` says which nodes served the request, the KV mode,
failovers and timings (`session_id`: the client's own id, shown instead of the cluster's);
`pdbus_headers(info)` is the same as `X-Pdbus-*` headers, each value cut to printable ASCII
(at most MAX_HEADER_CHARS), so nothing reaches a header unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_HEADER_CHARS = 256


def usage_body(usage: dict[str, int]) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens`: prompt tokens whose KV was not
    computed for this request (a prefill node's prefix cache, or KV the decode node kept)."""
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": int(usage.get("cached_tokens", 0))}}


def pdbus_info(trace: Any, kv_mode: str, session_id: str | None = None) -> dict[str, Any]:
    remote = "remote" in trace.plans
    return {
        "request_id": trace.request_id, "session_id": session_id or trace.session_id,
        "prefill_node": trace.prefill_node_ids[-1] if trace.prefill_node_ids else None,
        "decode_node": trace.decode_node_ids[-1] if trace.decode_node_ids else None,
        "prefill_nodes": list(trace.prefill_node_ids), "decode_nodes": list(trace.decode_node_ids),
        # The transfer's own report when the KV moved; the configured mode until it is known.
        "plans": list(trace.plans), "kv_mode": (trace.kv_mode or kv_mode) if remote else "none",
        "kv_wire_bytes": trace.kv_wire_bytes, "kv_held_tokens": trace.num_kv_held_tokens, "failover": trace.failed_over, "num_failovers": trace.num_failovers,
        "num_prefill_retries": trace.num_prefill_retries, "fallback_local": trace.fallback_local,
        "failures": list(trace.failures), "timings": {k: v for k, v in trace.timings.items() if v is not None},
    }


def header_value(value: Any) -> str:
    """Printable ASCII only (no CR/LF, no control or non-ASCII characters), at most MAX_HEADER_CHARS."""
    return "".join(c for c in str(value)[:MAX_HEADER_CHARS] if " " <= c <= "~")


def pdbus_headers(info: dict[str, Any]) -> dict[str, str]:
    return {name: header_value(value) for name, value in _headers(info).items()}


def _headers(info: dict[str, Any]) -> dict[str, str]:
    headers = {"X-Request-Id": info["request_id"], "X-Session-Id": info["session_id"]}
    if info.get("prefill_node") or info.get("plans"):
        headers["X-Pdbus-Prefill-Node"] = info.get("prefill_node") or (info["decode_node"] or "") + " (local)"
    if info.get("decode_node"):
        headers["X-Pdbus-Decode-Node"] = info["decode_node"]
    if "kv_mode" in info:
        headers["X-Pdbus-KV-Mode"] = info["kv_mode"]
    if "failover" in info:
        headers["X-Pdbus-Failover"] = "true" if info["failover"] else "false"
    return headers


@dataclass(frozen=True)
class Choice:
    """One finished choice of a response: its text, why it ended, its `logprobs` field (or None)."""

    index: int
    text: str | None                 # None: only tool calls
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None   # chat: parsed from the text (nodes/gateway/tool_calls.py)


class Shaper:
    def __init__(self, chat: bool, model_name: str, response_id: str, created: int) -> None:
        self.chat, self.model, self.id, self.created = chat, model_name, response_id, created
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def _chunk(self, choice: dict, **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], **extra}

    def first_chunk(self, index: int = 0) -> dict[str, Any] | None:
        if not self.chat:
            return None
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def chunk(self, text: str, index: int = 0, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            return self._chunk({"index": index, "delta": {"content": text}, "logprobs": logprobs,
                                "finish_reason": None})
        return self._chunk({"index": index, "text": text, "logprobs": logprobs, "finish_reason": None})

    def final_chunk(self, finish_reason: str | None, pdbus: dict[str, Any], text: str = "",
                    index: int = 0) -> dict[str, Any]:
        if self.chat:
            choice = {"index": index, "delta": {"content": text} if text else {}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._chunk(choice, pdbus=pdbus)

    def tool_chunk(self, choice: Choice) -> dict[str, Any]:
        """A chat choice whose text was held back (tools offered): its content and calls at once."""
        delta: dict[str, Any] = {"content": choice.text} if choice.text else {}
        if choice.tool_calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(choice.tool_calls)]
        return self._chunk({"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None})

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [], "usage": usage_body(usage)}

    def response(self, text: str, finish_reason: str | None, usage: dict[str, int],
                 pdbus: dict[str, Any]) -> dict[str, Any]:
        return self.response_choices([Choice(0, text, finish_reason)], usage, pdbus)

    def response_choices(self, choices: list[Choice], usage: dict[str, int], pdbus: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [self._choice(c) for c in choices],
                "usage": usage_body(usage), "pdbus": pdbus}

    def _choice(self, choice: Choice) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": choice.text}
            if choice.tool_calls:
                message["tool_calls"] = choice.tool_calls
            return {"index": choice.index, "message": message, "logprobs": choice.logprobs,
                    "finish_reason": choice.finish_reason}
        return {"index": choice.index, "text": choice.text, "logprobs": choice.logprobs,
                "finish_reason": choice.finish_reason}
