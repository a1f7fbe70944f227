"""The one codec of the cluster's bodies (nodes/wire/bodies.py): the only code that builds or reads
the maps the bus carries for them, on both sides (nodes and client), so both agree on every field
name and parse with the same code and bounds.

Contract:
- `to_wire(body) -> dict`: the map for a body dataclass (or a `SamplingParams`, a `TransferReport`),
  field for field what docs/CLUSTER.md describes; enum members go out as their values.
- `from_wire(kind, value, bounds=UNBOUNDED) -> kind`: `value` as msgpack decoded it (any type in any
  field) read as a body of class `kind`, typed and within `bounds` (field_readers.py), or `Refused`, and
  nothing else (tests/nodes/wire/test_codec_properties.py feeds arbitrary values). For a body `b`
  within the bounds, `from_wire(type(b), to_wire(b), bounds) == b`. The readers are
  request_readers.py (what a node reads: a prompt that can never fit is `rejected` in a decode
  request, anything else `bad_request`) and reply_readers.py (what the client reads).
- `read_partial(value, bounds) -> TokenBody | None`: a PARTIAL after the plan; None for a map of
  another `type` (ignored: a newer node may send more kinds).
- `claims(kind, value) -> bool`: whether a map says (its `type`) it is a body of `kind`, before it
  is read (how a node tells a `kv_ready` DIRECT from other DIRECTs).
- `error_details(details, node_id) -> (node_id, retry_after_s | None)` reads an ERROR's details and
  never refuses (the ERROR already ends the stream): the claimed node id when it is a valid id, else
  `node_id`; `retry_after_s` when a finite number >= 0, capped at MAX_RETRY_AFTER_S.
- `claimed_node(value)`: the node id an unread body claims, for a log line ("" when none is valid).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from nodes.wire import reply_readers as replies
from nodes.wire import request_readers as requests
from nodes.wire.bodies import (
    ControlBody,
    DecodeDoneBody,
    DecodeRequestBody,
    KvReadyBody,
    PlanBody,
    PlanKind,
    PrefillDoneBody,
    PrefillRequestBody,
    SamplingParams,
    TokenBody,
    TokenLogprobs,
    TransferReport,
)
from nodes.wire.field_readers import MIN_LOGPROB, Bounds
from nodes.wire.reply_readers import MAX_RETRY_AFTER_S, claimed_node, error_details

__all__ = ["MAX_RETRY_AFTER_S", "claimed_node", "claims", "error_details", "from_wire", "read_partial", "to_wire"]

Body = TypeVar("Body")
UNBOUNDED = Bounds()   # the defaults: token ids in [0, 2**31), no other bound


def to_wire(body: Any) -> dict[str, Any]:
    return _WRITERS[type(body)](body)


def from_wire(kind: type[Body], value: Any, bounds: Bounds = UNBOUNDED) -> Body:
    return _READERS[kind](value, bounds)


def read_partial(value: Any, bounds: Bounds) -> TokenBody | None:
    return replies.partial(value, bounds)


def claims(kind: type, value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == _TYPES[kind]


# -- writers ---------------------------------------------------------------------------------
_SAMPLING_DEFAULTS = SamplingParams()
_OPTIONAL_SAMPLING = ("logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
                      "logit_bias", "grammar")


def _sampling(s: SamplingParams) -> dict[str, Any]:
    values = dataclasses.asdict(s)
    values["stop"], values["stop_token_ids"] = list(s.stop), list(s.stop_token_ids)
    values["logit_bias"] = [list(pair) for pair in s.logit_bias]
    values["grammar"] = None if s.grammar is None else s.grammar.to_wire()
    for name in _OPTIONAL_SAMPLING:   # left out at their defaults: most requests use none of them
        if getattr(s, name) == getattr(_SAMPLING_DEFAULTS, name):
            del values[name]
    return values


def _logprobs(lp: TokenLogprobs | None) -> list | None:
    """[logprob, [[token_id, logprob], ...]]: finite (an -inf, a masked token's, is sent as -1e9)."""
    if lp is None:
        return None
    return [_finite(lp.logprob), [[token, _finite(value)] for token, value in lp.top]]


def _finite(logprob: float) -> float:
    return min(max(logprob, MIN_LOGPROB), 0.0)


def _decode_request(b: DecodeRequestBody) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt_token_ids": list(b.prompt), "sampling": _sampling(b.sampling), "session_id": b.session_id,
            "prefill": str(b.prefill), "resume": {"num_delivered": b.num_delivered} if b.num_delivered else None}
    if b.prefill_backlog_tokens:
        body["prefill_backlog_tokens"] = b.prefill_backlog_tokens
    if b.fork_group:
        body["fork_group"] = b.fork_group
    return body | {"cache_salt": b.cache_salt} if b.cache_salt else body


def _prefill_request(b: PrefillRequestBody) -> dict[str, Any]:
    body = {"prompt_token_ids": list(b.prompt), "sampling": _sampling(b.sampling),
            "decode_node_id": b.decode_node_id, "data_endpoint": b.data_endpoint, "transfer_id": b.transfer_id,
            "request_id": b.request_id, "urgent": b.urgent}
    optional = {"cache_salt": b.cache_salt, "kv_offset": b.kv_offset, "num_output_tokens": b.num_output_tokens}
    return body | {key: value for key, value in optional.items() if value}


def _plan(b: PlanBody) -> dict[str, Any]:
    plan: dict[str, Any] = {"type": "plan", "plan": str(b.kind), "node_id": b.node_id}
    if b.kind == PlanKind.REMOTE:
        plan |= {"data_endpoint": b.data_endpoint, "transfer_id": b.transfer_id}
    if b.kind == PlanKind.CACHED or b.num_cached_tokens:
        plan["num_cached_tokens"] = b.num_cached_tokens
    return plan


def _token(b: TokenBody) -> dict[str, Any]:
    token = {"type": "token", "index": b.index, "token_id": b.token_id, "text": b.text}
    return token if b.logprobs is None else token | {"logprobs": _logprobs(b.logprobs)}


def _triple(t: TokenBody) -> list:
    """[index, token_id, text], with the token's logprobs as a fourth item when it has them."""
    return [t.index, t.token_id, t.text] + ([] if t.logprobs is None else [_logprobs(t.logprobs)])


def _prefill_done(b: PrefillDoneBody) -> dict[str, Any]:
    done = {"type": "done", "node_id": b.node_id, "token": None if b.token is None else _triple(b.token),
            "transfer": None if b.transfer is None else dataclasses.asdict(b.transfer),
            "timings": dataclasses.asdict(b.timings), "stats": dict(b.stats)}
    return done | _prompt_logprobs(b.prompt_logprobs)


def _prompt_logprobs(values: tuple[TokenLogprobs | None, ...]) -> dict[str, Any]:
    return {"prompt_logprobs": [_logprobs(lp) for lp in values]} if values else {}


def _decode_done(b: DecodeDoneBody) -> dict[str, Any]:
    return {"type": "done", "node_id": b.node_id, "finish_reason": b.finish_reason,
            "tokens": [_triple(t) for t in b.tokens], **({} if b.plan is None else {"plan": str(b.plan)}),
            "usage": dataclasses.asdict(b.usage), "timings": dataclasses.asdict(b.timings), "stats": dict(b.stats),
            **_prompt_logprobs(b.prompt_logprobs)}


def _kv_ready(b: KvReadyBody) -> dict[str, Any]:
    return {"type": "kv_ready", "request_id": b.request_id, "transfer_id": b.transfer_id,
            "first_token_id": b.first_token_id}


def _control(b: ControlBody) -> dict[str, Any]:
    return {"action": b.action, **({"role": b.role} if b.role else {})}


_WRITERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    DecodeRequestBody: _decode_request, PrefillRequestBody: _prefill_request, KvReadyBody: _kv_ready,
    SamplingParams: _sampling, PlanBody: _plan, TokenBody: _token, PrefillDoneBody: _prefill_done,
    DecodeDoneBody: _decode_done, TransferReport: dataclasses.asdict, ControlBody: _control}
_READERS: dict[type, Callable[[Any, Bounds], Any]] = {
    DecodeRequestBody: requests.decode_request, PrefillRequestBody: requests.prefill_request,
    KvReadyBody: requests.kv_ready, SamplingParams: requests.sampling, PlanBody: replies.plan,
    TokenBody: replies.token, PrefillDoneBody: replies.prefill_done, DecodeDoneBody: replies.decode_done,
    TransferReport: replies.transfer, ControlBody: requests.control}
_TYPES = {PlanBody: "plan", TokenBody: "token", KvReadyBody: "kv_ready", PrefillDoneBody: "done",
          DecodeDoneBody: "done"}
