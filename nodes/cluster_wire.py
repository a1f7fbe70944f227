"""The bodies of the cluster's control-plane messages (docs/CLUSTER.md), shared by the node
processes and `ClusterClient`. Plain dicts on the wire (the bus codec owns msgpack); these helpers
build and read them so both sides agree on every field name. No torch here: the client imports it.

Services: `decode` (decode and both nodes), `prefill` (prefill and both nodes).
- decode REQUEST  `{prompt_token_ids, sampling, session_id, prefill: "auto"|"local", resume}`
- decode PARTIAL  `plan` first, then `token` (index relative to this request, 1.. after a remote
                  prefill, 0.. otherwise); FINAL `done` with `tokens` (every output [id, text] of
                  this request, so a client that saw a gap can fill it), `usage`, `timings`, `stats`.
- prefill REQUEST `{prompt_token_ids, sampling, decode_node_id, data_endpoint, transfer_id,
                  request_id}`; PARTIAL `token` index 0; FINAL `done` with the transfer report.
- DIRECT prefill -> decode `{type: "kv_ready", request_id, transfer_id, first_token_id}`.
Error codes the nodes send: `full` (no KV room now), `rejected` (never fits), `kv_failed`,
`kv_timeout`, `bad_request`. The client's own failure codes (`ClusterClient`'s trace and errors):
`stalled`, `gap`, `protocol`, `bad_reply` (a node's reply failed nodes/reply_checks.py),
`no_prefill_node`, `overloaded`, `retries_exhausted`, `internal`; a failed prefill is recorded as
`prefill_<code>`. `code_label(code)` maps any code onto that fixed set plus the bus's ErrorCode
values, anything else (a code a node invented) onto `other`: what a metric label may carry.

What the bus carries (docs/PROTOCOL.md): msgpack bodies of UTF-8 strings, ints in
-2**63..2**64-1, finite floats, bytes, bools, None, lists and str-keyed maps nested at most
MAX_DEPTH deep; routing keys of at most MAX_ID_BYTES UTF-8 bytes. `check_request(prompt,
sampling, session_id)` checks a client request against that before anything is sent and raises
`Uncarriable` (a ValueError) whose `path` names the field (`session_id`, `sampling.stop[1]`,
`prompt_token_ids[3]`); `check_carriable(value, path)` is the generic walk behind it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bus.constants import MAX_BODY_DEPTH, MAX_ID_BYTES, ErrorCode
from nodes.engines.base import SamplingParams

DECODE, PREFILL = "decode", "prefill"
PLAN_REMOTE, PLAN_CACHED, PLAN_LOCAL = "remote", "cached", "local"
KV_READY = "kv_ready"
FULL, REJECTED, KV_FAILED, KV_TIMEOUT, BAD_REQUEST = "full", "rejected", "kv_failed", "kv_timeout", "bad_request"
STALLED, GAP, PROTOCOL, BAD_REPLY, NO_PREFILL_NODE = "stalled", "gap", "protocol", "bad_reply", "no_prefill_node"
OVERLOADED, RETRIES_EXHAUSTED, INTERNAL = "overloaded", "retries_exhausted", "internal"
PREFILL_FAILURE = "prefill_"   # the prefix of a failed prefill's code in the trace
KNOWN_CODES = frozenset({FULL, REJECTED, KV_FAILED, KV_TIMEOUT, BAD_REQUEST, STALLED, GAP, PROTOCOL, BAD_REPLY,
                         NO_PREFILL_NODE, OVERLOADED, RETRIES_EXHAUSTED, INTERNAL}
                        | {v for k, v in vars(ErrorCode).items() if k.isupper() and isinstance(v, str)})
MAX_DEPTH = MAX_BODY_DEPTH                   # nested lists/maps in one body (the bus's own bound)
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 64 - 1   # what msgpack carries
_SCALARS = (bool, type(None), bytes, bytearray)


class BadRequest(ValueError):
    """A request body the node cannot serve (answered with ERROR `bad_request`)."""


def code_label(code: str) -> str:
    """`code` when the cluster knows it (also as `prefill_<code>`), else `other`."""
    return code if code in KNOWN_CODES or code.removeprefix(PREFILL_FAILURE) in KNOWN_CODES else "other"


def sampling_to_wire(sampling: SamplingParams) -> dict[str, Any]:
    values = dataclasses.asdict(sampling)
    values["stop"], values["stop_token_ids"] = list(sampling.stop), list(sampling.stop_token_ids)
    return values


def sampling_from_wire(values: Any) -> SamplingParams:
    if not isinstance(values, dict):
        raise BadRequest("sampling must be a map")
    known = {k: v for k, v in values.items() if k in SamplingParams.__dataclass_fields__}
    known["stop"] = tuple(known.get("stop", ()))
    known["stop_token_ids"] = tuple(known.get("stop_token_ids", ()))
    try:
        return SamplingParams(**known)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad sampling: {exc}") from exc


def token_ids_from_wire(body: dict, key: str = "prompt_token_ids") -> tuple[int, ...]:
    ids = body.get(key)
    if not isinstance(ids, list | tuple) or not ids or not all(isinstance(t, int) for t in ids):
        raise BadRequest(f"{key} must be a non-empty list of token ids")
    return tuple(ids)


def body_map(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a map")
    return body


def token_body(index: int, token_id: int, text: str) -> dict[str, Any]:
    return {"type": "token", "index": index, "token_id": token_id, "text": text}


def kv_ready_body(request_id: str, transfer_id: str, first_token_id: int) -> dict[str, Any]:
    return {"type": KV_READY, "request_id": request_id, "transfer_id": transfer_id,
            "first_token_id": first_token_id}


def decode_request_body(prompt: tuple[int, ...], sampling: SamplingParams, session_id: str, prefill: str,
                        resume: dict | None) -> dict[str, Any]:
    return {"prompt_token_ids": list(prompt), "sampling": sampling_to_wire(sampling), "session_id": session_id,
            "prefill": prefill, "resume": resume}


class Uncarriable(ValueError):
    """A value the bus cannot carry; `path` names where it is (`sampling.stop[1]`)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def check_request(prompt: tuple[int, ...], sampling: SamplingParams, session_id: str) -> None:
    """What a decode (and then a prefill) request of this prompt, sampling and session would
    carry, checked before anything is sent; the prompt's ids in C (min/max), not one by one."""
    check_routing_key(session_id, "session_id")
    if prompt and not (min(prompt) >= INT_MIN and max(prompt) <= INT_MAX):
        index = next(i for i, t in enumerate(prompt) if not INT_MIN <= t <= INT_MAX)
        raise Uncarriable(f"prompt_token_ids[{index}]", "an integer outside -2**63..2**64-1")
    check_carriable(decode_request_body((), sampling, session_id, "auto", None), "")


def check_routing_key(key: str, path: str = "key") -> None:
    _check_text(key, path)
    if len(key.encode()) > MAX_ID_BYTES:
        raise Uncarriable(path, f"longer than the bus's {MAX_ID_BYTES} bytes for a routing key")


def check_carriable(value: Any, path: str = "body", depth: int = 0) -> None:
    """Raise `Uncarriable` unless msgpack (use_bin_type) can encode `value` and a peer accepts it."""
    if isinstance(value, str):
        _check_text(value, path or "body")
    elif isinstance(value, _SCALARS):
        return
    elif isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise Uncarriable(path or "body", "an integer outside -2**63..2**64-1")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise Uncarriable(path or "body", "not a finite number")
    elif isinstance(value, list | tuple | dict):
        _check_container(value, path, depth + 1)
    else:
        raise Uncarriable(path or "body", f"a {type(value).__name__}, which the bus does not carry")


def _check_container(value: list | tuple | dict, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise Uncarriable(path or "body", f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(value, dict):
        for index, item in enumerate(value):
            check_carriable(item, f"{path or 'body'}[{index}]", depth)
        return
    for key, item in value.items():
        if not isinstance(key, str):
            raise Uncarriable(path or "body", "a map key that is not a string")
        _check_text(key, path or "body")
        check_carriable(item, f"{path}.{key}" if path else key, depth)


def _check_text(value: Any, path: str) -> None:
    if not isinstance(value, str):
        raise Uncarriable(path, "not a string")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise Uncarriable(path, f"not UTF-8 text (a lone surrogate at {exc.start})") from None
