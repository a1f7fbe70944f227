"""Readers of the bodies a node acts on (the request side of nodes/wire/body_codec.py, which documents
the contract): the decode and prefill REQUESTs, the `kv_ready` DIRECT, and the sampling map inside
both requests. Each takes the value as msgpack decoded it and the reader's `Bounds` (the node's
engine), and returns the body dataclass or raises `Refused`: `rejected` for a decode request whose
prompt can never fit this engine, `bad_request` for anything else.
"""

from __future__ import annotations

from typing import Any

from nodes.engines.engine_types import (
    MAX_BIAS,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
)
from nodes.engines.grammar_spec import MAX_GRAMMAR_CHARS, GrammarSpec
from nodes.wire import field_readers as f
from nodes.wire.bodies import (
    CONTROL_ACTIONS,
    SWITCH_ROLES,
    ControlBody,
    DecodeRequestBody,
    KvReadyBody,
    PrefillMode,
    PrefillRequestBody,
    SamplingParams,
)
from nodes.wire.codes import Code
from nodes.wire.field_readers import Bounds, Refused

MAX_STOPS, MAX_STOP_CHARS, MAX_STOP_TOKEN_IDS = 64, 1024, 1024
MAX_TEMPERATURE = 100.0
MAX_SAMPLING_COUNT = 2**31 - 1        # top_k, max_tokens
SEED_RANGE = (-(2**63), 2**64 - 1)    # what torch.Generator.manual_seed takes
_SAMPLING_DEFAULTS = SamplingParams()


def decode_request(value: Any, bounds: Bounds) -> DecodeRequestBody:
    body = f.a_map(value, "the body")
    prompt = _prompt(body, bounds, out_of_range=Code.REJECTED)
    mode = PrefillMode(f.one_of(body.get("prefill", PrefillMode.AUTO), "prefill", tuple(PrefillMode)))
    session_id = None if body.get("session_id") in (None, "") else f.an_id(body, "session_id")
    return DecodeRequestBody(prompt, sampling(body.get("sampling", {}), bounds), session_id, mode,
                             _num_delivered(body.get("resume")), f.an_id_or_empty(body, "cache_salt"),
                             f.count(body.get("prefill_backlog_tokens", 0), "prefill_backlog_tokens"),
                             f.an_id_or_empty(body, "fork_group"))


def _num_delivered(resume: Any) -> int:
    if resume is None:
        return 0
    if not isinstance(resume, dict):
        raise Refused("resume must be a map or null")
    return f.count(resume.get("num_delivered", 0), "resume.num_delivered")


def prefill_request(value: Any, bounds: Bounds) -> PrefillRequestBody:
    body = f.a_map(value, "the body")
    prompt = _prompt(body, bounds, out_of_range=Code.BAD_REQUEST)
    node_id, transfer_id, request_id = (f.an_id(body, key) for key in ("decode_node_id", "transfer_id", "request_id"))
    endpoint = f.an_id(body, "data_endpoint", f.MAX_ENDPOINT_BYTES)
    urgent = f.flag(body.get("urgent", False), "urgent")
    kv_offset = f.count(body.get("kv_offset", 0), "kv_offset", 0, len(prompt) - 1)
    num_output = f.count(body.get("num_output_tokens", 0), "num_output_tokens", 0, len(prompt) - 1)
    return PrefillRequestBody(prompt, sampling(body.get("sampling", {}), bounds), node_id, endpoint, transfer_id,
                              request_id, urgent, f.an_id_or_empty(body, "cache_salt"), kv_offset, num_output)


def kv_ready(value: Any, bounds: Bounds) -> KvReadyBody:
    body = f.typed_map(value, "kv_ready", "a kv_ready body")
    token_id = f.count(body.get("first_token_id"), "first_token_id", 0, bounds.vocab_size - 1)
    return KvReadyBody(f.an_id(body, "request_id"), f.an_id(body, "transfer_id"), token_id)


def control(value: Any, bounds: Bounds) -> ControlBody:
    body = f.a_map(value, "a control body")
    action = f.one_of(body.get("action"), "action", CONTROL_ACTIONS)
    return ControlBody(action, f.one_of(body.get("role"), "role", SWITCH_ROLES) if action == "role" else "")


def _prompt(body: dict, bounds: Bounds, *, out_of_range: Code) -> tuple[int, ...]:
    ids = body.get("prompt_token_ids")
    if not isinstance(ids, list | tuple) or not ids:
        raise Refused("prompt_token_ids must be a non-empty list of token ids")
    if len(ids) >= bounds.max_model_len:   # before looking at each id: bounds the work too
        raise Refused(f"prompt of {len(ids)} tokens leaves no room in the context of {bounds.max_model_len}",
                      out_of_range)
    if not all(f.is_int(t) for t in ids):
        raise Refused("prompt_token_ids must be a non-empty list of token ids")
    if min(ids) < 0 or max(ids) >= bounds.vocab_size:
        raise Refused(f"token id outside the vocabulary (0..{bounds.vocab_size - 1})", out_of_range)
    return tuple(ids)


def sampling(value: Any, bounds: Bounds) -> SamplingParams:
    values, d = f.a_map(value, "sampling"), _SAMPLING_DEFAULTS
    try:
        return SamplingParams(
            temperature=f.number(values.get("temperature", d.temperature), "temperature", 0.0, MAX_TEMPERATURE),
            top_k=f.count(values.get("top_k", d.top_k), "top_k", 0, MAX_SAMPLING_COUNT),
            top_p=f.number(values.get("top_p", d.top_p), "top_p", 0.0, 1.0, open_low=True),
            seed=None if values.get("seed") is None else f.count(values["seed"], "seed", *SEED_RANGE),
            max_tokens=f.count(values.get("max_tokens", d.max_tokens), "max_tokens", 1, MAX_SAMPLING_COUNT),
            stop=_stops(values.get("stop", [])),
            stop_token_ids=_stop_token_ids(values.get("stop_token_ids", []), bounds),
            ignore_eos=f.flag(values.get("ignore_eos", d.ignore_eos), "ignore_eos"),
            logprobs=_optional_logprobs(values.get("logprobs"), "logprobs"),
            prompt_logprobs=_optional_logprobs(values.get("prompt_logprobs"), "prompt_logprobs"),
            presence_penalty=f.number(values.get("presence_penalty", 0.0), "presence_penalty", -MAX_PENALTY, MAX_PENALTY),
            frequency_penalty=f.number(values.get("frequency_penalty", 0.0), "frequency_penalty", -MAX_PENALTY,
                                       MAX_PENALTY),
            repetition_penalty=f.number(values.get("repetition_penalty", 1.0), "repetition_penalty", 0.0,
                                        MAX_REPETITION_PENALTY, open_low=True),
            logit_bias=_logit_bias(values.get("logit_bias", []), bounds),
            grammar=_grammar(values.get("grammar")))
    except Refused as refusal:
        raise Refused(f"bad sampling: {refusal.reason}") from None


def _optional_logprobs(value: Any, what: str) -> int | None:
    return None if value is None else f.count(value, what, 0, MAX_LOGPROBS)


def _grammar(value: Any) -> GrammarSpec | None:
    """null, or {"kind", "source"} whose grammar compiles (checked without a tokenizer: what only
    this engine's vocabulary could refuse is the engine's `rejected` at admission)."""
    if value is None:
        return None
    from nodes.engines.grammar_check import check_grammar  # llguidance: loaded by the first grammar
    try:
        spec = GrammarSpec.from_wire(value)
        check_grammar(spec)
    except ValueError:   # the library's words may quote the schema: never echoed from here
        raise Refused(f"grammar must be {{kind, source}} of a known kind that compiles, source at most "
                      f"{MAX_GRAMMAR_CHARS} characters") from None
    return spec


def _logit_bias(value: Any, bounds: Bounds) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_LOGIT_BIAS:
        raise Refused(f"logit_bias must be a list of at most {MAX_LOGIT_BIAS} [token_id, bias] pairs")
    pairs = []
    for pair in value:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise Refused("logit_bias entries must be [token_id, bias] pairs")
        pairs.append((f.count(pair[0], "logit_bias token_id", 0, bounds.vocab_size - 1),
                      f.number(pair[1], "logit_bias bias", -MAX_BIAS, MAX_BIAS)))
    return tuple(pairs)


def _stops(value: Any) -> tuple[str, ...]:
    if (not isinstance(value, list | tuple) or len(value) > MAX_STOPS
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in value)):
        raise Refused(f"stop must be a list of at most {MAX_STOPS} non-empty strings of at most "
                      f"{MAX_STOP_CHARS} characters")
    return tuple(value)


def _stop_token_ids(value: Any, bounds: Bounds) -> tuple[int, ...]:
    if (not isinstance(value, list | tuple) or len(value) > MAX_STOP_TOKEN_IDS
            or not all(f.is_int(t) and 0 <= t < bounds.vocab_size for t in value)):
        raise Refused(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids "
                      f"in [0, {bounds.vocab_size})")
    return tuple(value)
