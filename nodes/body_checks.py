"""Checks on every peer-supplied body a node acts on, at arrival, before any of it reaches the
engine or a log line (docs/CLUSTER.md lists the bodies; nodes/cluster_wire.py builds them).

Contract: one pure function per body kind, each taking the body as msgpack decoded it (any type
in any field) and the engine's `Limits`:
- `decode_request(body, limits) -> DecodeBody`   (decode REQUEST)
- `prefill_request(body, limits) -> PrefillBody` (prefill REQUEST)
- `kv_ready(body, limits) -> KvReady`            (DIRECT prefill -> decode)
- `sampling(values, limits) -> SamplingParams`   (the `sampling` map inside both requests)
Each returns frozen values of the right types within range (token ids inside the vocabulary, ids
non-empty strings of at most `MAX_ID_BYTES`, lists and numbers bounded) or raises
`Refused(code, reason)`: `code` is `rejected` for a well-formed decode request that can never fit
this engine (a prompt beyond the context, a token id outside the vocabulary; docs/CLUSTER.md
step 2) and `bad_request` for anything else. Nothing else is ever raised
(tests/nodes/test_body_checks.py feeds arbitrary values). A reason names fields, types and bounds,
never a value from the body, so it is short and safe to log and to send back.
`summary(value)` describes an untrusted value for a log line in bounded space: its type and size,
never its contents (repr() of a body nested a thousand levels deep raises RecursionError).
`engine_limits(engine)` reads the limits from an engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bus.constants import MAX_ID_BYTES
from nodes import cluster_wire as wire
from nodes.engines.base import SamplingParams

MISSING: Any = object()
MAX_ENDPOINT_BYTES = 512          # tcp://host:port;curve=<64 hex> fits many times over
MAX_STOPS, MAX_STOP_CHARS = 64, 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_TEMPERATURE = 100.0
MAX_COUNT = 2**31 - 1             # top_k, max_tokens
SEED_RANGE = (-(2**63), 2**64 - 1)   # what torch.Generator.manual_seed takes


class Refused(wire.BadRequest):
    """A body the node will not act on: answered with ERROR `code` (or, for a DIRECT, dropped)."""

    def __init__(self, reason: str, code: str = wire.BAD_REQUEST) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    max_model_len: int


@dataclass(frozen=True, slots=True)
class DecodeBody:
    prompt: tuple[int, ...]
    sampling: SamplingParams
    session_id: str | None
    prefill: str                  # "auto" | "local"


@dataclass(frozen=True, slots=True)
class PrefillBody:
    prompt: tuple[int, ...]
    sampling: SamplingParams
    decode_node_id: str
    data_endpoint: str
    transfer_id: str
    decode_request_id: str
    urgent: bool


@dataclass(frozen=True, slots=True)
class KvReady:
    request_id: str
    transfer_id: str
    first_token_id: int


def engine_limits(engine: Any) -> Limits:
    return Limits(int(engine.runner.config.vocab_size), int(engine.max_model_len))


def summary(value: Any) -> str:
    kind = type(value).__name__
    return f"{kind}[{len(value)}]" if isinstance(value, str | bytes | list | tuple | dict) else kind


# -- the bodies ------------------------------------------------------------------------------
def decode_request(body: Any, limits: Limits) -> DecodeBody:
    body = _map(body, "the body")
    prompt = _prompt(body, limits, out_of_range=wire.REJECTED)
    mode = body.get("prefill", "auto")
    if not (isinstance(mode, str) and mode in ("auto", "local")):
        raise Refused("prefill must be 'auto' or 'local'")
    if body.get("resume") is not None and not isinstance(body["resume"], dict):
        raise Refused("resume must be a map or null")
    session_id = body.get("session_id")
    if session_id is not None and session_id != "":
        session_id = _id(body, "session_id", optional=True)
    return DecodeBody(prompt, sampling(body.get("sampling", {}), limits), session_id or None, mode)


def prefill_request(body: Any, limits: Limits) -> PrefillBody:
    body = _map(body, "the body")
    prompt = _prompt(body, limits, out_of_range=wire.BAD_REQUEST)
    ids = [_id(body, key) for key in ("decode_node_id", "transfer_id", "request_id")]
    endpoint = _id(body, "data_endpoint", MAX_ENDPOINT_BYTES)
    urgent = body.get("urgent", False)
    if not isinstance(urgent, bool):
        raise Refused("urgent must be true or false")
    return PrefillBody(prompt, sampling(body.get("sampling", {}), limits), ids[0], endpoint, ids[1], ids[2], urgent)


def kv_ready(body: Any, limits: Limits) -> KvReady:
    body = _map(body, "a kv_ready body")
    token = body.get("first_token_id")
    if not _is_int(token) or not 0 <= token < limits.vocab_size:
        raise Refused(f"first_token_id must be a token id in [0, {limits.vocab_size})")
    return KvReady(_id(body, "request_id"), _id(body, "transfer_id"), token)


def sampling(values: Any, limits: Limits) -> SamplingParams:
    if not isinstance(values, dict):
        raise Refused("sampling must be a map")
    try:
        return SamplingParams(
            temperature=_number(values, "temperature", 1.0, 0.0, MAX_TEMPERATURE),
            top_k=_integer(values, "top_k", 0, 0, MAX_COUNT),
            top_p=_number(values, "top_p", 1.0, 0.0, 1.0, open_low=True),
            seed=None if values.get("seed") is None else _integer(values, "seed", None, *SEED_RANGE),
            max_tokens=_integer(values, "max_tokens", 256, 1, MAX_COUNT),
            stop=_stops(values.get("stop", [])),
            stop_token_ids=_token_list(values.get("stop_token_ids", []), limits),
            ignore_eos=_flag(values, "ignore_eos"))
    except Refused as refusal:
        raise Refused(f"bad sampling: {refusal.reason}") from None


# -- fields ----------------------------------------------------------------------------------
def _map(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise Refused(f"{what} must be a map")
    return value


def _is_int(value: Any) -> bool:
    return type(value) is int   # not bool, which msgpack keeps apart and Python counts as int


def _prompt(body: dict, limits: Limits, *, out_of_range: str) -> tuple[int, ...]:
    ids = body.get("prompt_token_ids")
    if not isinstance(ids, list | tuple) or not ids:
        raise Refused("prompt_token_ids must be a non-empty list of token ids")
    if len(ids) >= limits.max_model_len:   # before looking at each id: bounds the work too
        raise Refused(f"prompt of {len(ids)} tokens leaves no room in the context of {limits.max_model_len}",
                      out_of_range)
    if not all(_is_int(t) for t in ids):
        raise Refused("prompt_token_ids must be a non-empty list of token ids")
    if min(ids) < 0 or max(ids) >= limits.vocab_size:
        raise Refused(f"token id outside the vocabulary (0..{limits.vocab_size - 1})", out_of_range)
    return tuple(ids)


def _id(body: dict, key: str, max_bytes: int = MAX_ID_BYTES, *, optional: bool = False) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 0 < len(value.encode("utf-8", "surrogatepass")) <= max_bytes:
        what = "must be null or" if optional else "is required:"
        raise Refused(f"{key} {what} a non-empty string of at most {max_bytes} bytes")
    return value


def _number(values: dict, key: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = values.get(key, default)
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and (not isinstance(value, float) or math.isfinite(value))
          and (low < value if open_low else low <= value) and value <= high)
    if not ok:
        raise Refused(f"{key} must be a number in {'(' if open_low else '['}{low}, {high}]")
    return float(value)


def _integer(values: dict, key: str, default: int | None, low: int, high: int) -> int:
    value = values.get(key, default)
    if not _is_int(value) or not low <= value <= high:
        raise Refused(f"{key} must be an integer in [{low}, {high}]")
    return value


def _flag(values: dict, key: str) -> bool:
    value = values.get(key, False)
    if not isinstance(value, bool):
        raise Refused(f"{key} must be true or false")
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if (not isinstance(value, list | tuple) or len(value) > MAX_STOPS
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in value)):
        raise Refused(f"stop must be a list of at most {MAX_STOPS} non-empty strings of at most "
                      f"{MAX_STOP_CHARS} characters")
    return tuple(value)


def _token_list(value: Any, limits: Limits) -> tuple[int, ...]:
    if (not isinstance(value, list | tuple) or len(value) > MAX_STOP_TOKEN_IDS
            or not all(_is_int(t) and 0 <= t < limits.vocab_size for t in value)):
        raise Refused(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids "
                      f"in [0, {limits.vocab_size})")
    return tuple(value)
