"""Readers of the reply bodies the cluster client acts on (the reply side of nodes/wire/body_codec.py,
which documents the contract): the plan, each token PARTIAL, and both FINALs with their tokens,
transfer report, usage, timings and stats. Each takes the value as msgpack decoded it and the
client's `Bounds` (its request's `max_tokens`) and returns the body dataclass or raises `Refused`.
Token ids are ints in [0, 2**31), indices below `max_tokens`, texts of at most MAX_TEXT_CHARS, node
and transfer ids non-empty strings of at most MAX_ID_BYTES (a FINAL's node id may be ""), timings
finite seconds in [0, MAX_SECONDS] of the node's own stages only (a node cannot overwrite the
client's `ttft_s`), counters ints in [0, 2**63), maps of at most MAX_FIELDS entries.
`error_details` and `claimed_node` read an ERROR's details and an unread body for a log line; they
never refuse.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from nodes.wire import field_readers as f
from nodes.wire.bodies import (
    FINISH_REASONS,
    DecodeDoneBody,
    DecodeTimings,
    PlanBody,
    PlanKind,
    PrefillDoneBody,
    PrefillTimings,
    TokenBody,
    TokenLogprobs,
    TransferReport,
    Usage,
)
from nodes.wire.field_readers import Bounds, Refused

Timings = TypeVar("Timings", PrefillTimings, DecodeTimings)
MAX_RETRY_AFTER_S = 60.0
TRANSFER_COUNTS = ("raw_bytes", "wire_bytes", "retries", "checksum_failures", "resends")


def plan(value: Any, bounds: Bounds) -> PlanBody:
    body = f.typed_map(value, "plan", "a plan")
    kind = _plan_kind(body.get("plan"))
    node_id = f.an_id(body, "node_id")
    num_cached = f.count(body.get("num_cached_tokens", 0), "num_cached_tokens")
    if kind == PlanKind.REMOTE:
        endpoint = f.an_id(body, "data_endpoint", f.MAX_ENDPOINT_BYTES)
        return PlanBody.remote(node_id, endpoint, f.an_id(body, "transfer_id"), num_cached)
    return PlanBody(kind, node_id, num_cached_tokens=num_cached)


def _plan_kind(value: Any) -> PlanKind:
    return PlanKind(f.one_of(value, "plan", tuple(PlanKind)))


def token(value: Any, bounds: Bounds) -> TokenBody:
    body = f.typed_map(value, "token", "a token")
    return _token(body.get("index"), body.get("token_id"), body.get("text"), bounds, body.get("logprobs"))


def _token(index: Any, token_id: Any, text: Any, bounds: Bounds, logprobs: Any = None) -> TokenBody:
    if not f.is_int(index) or not 0 <= index < bounds.max_tokens:
        raise Refused(f"a token's index must be an integer in [0, {bounds.max_tokens})")
    f.count(token_id, "token_id", 0, bounds.vocab_size - 1)
    if not isinstance(text, str) or len(text) > f.MAX_TEXT_CHARS:
        raise Refused(f"a token's text must be a string of at most {f.MAX_TEXT_CHARS} characters")
    return TokenBody(index, token_id, text, f.logprobs(logprobs, "a token's logprobs", bounds.vocab_size))


def _triple(value: Any, what: str, bounds: Bounds) -> TokenBody:
    if not isinstance(value, list | tuple) or len(value) not in (3, 4):
        raise Refused(f"{what} must be a list [index, token_id, text] or [index, token_id, text, logprobs]")
    return _token(value[0], value[1], value[2], bounds, value[3] if len(value) == 4 else None)


def _prompt_logprobs(value: Any, bounds: Bounds) -> tuple[TokenLogprobs | None, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > f.MAX_PROMPT_LOGPROBS:
        raise Refused(f"prompt_logprobs must be a list of at most {f.MAX_PROMPT_LOGPROBS} entries")
    return tuple(f.logprobs(item, "prompt_logprobs", bounds.vocab_size) for item in value)


def _tokens(value: Any, bounds: Bounds) -> tuple[TokenBody, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > bounds.max_tokens:
        raise Refused(f"tokens must be a list of at most {bounds.max_tokens} [index, token_id, text] lists")
    return tuple(_triple(item, "each of tokens", bounds) for item in value)


def prefill_done(value: Any, bounds: Bounds) -> PrefillDoneBody:
    body = f.typed_map(value, "done", "a prefill FINAL")
    first, report = body.get("token"), body.get("transfer")
    return PrefillDoneBody(
        node_id=f.an_id_or_empty(body, "node_id"), token=None if first is None else _triple(first, "token", bounds),
        transfer=None if report is None else transfer(report, bounds), timings=_timings(body.get("timings"), PrefillTimings),
        stats=f.stats(body.get("stats")), prompt_logprobs=_prompt_logprobs(body.get("prompt_logprobs"), bounds))


def decode_done(value: Any, bounds: Bounds) -> DecodeDoneBody:
    body = f.typed_map(value, "done", "a decode FINAL")
    reason, kind = body.get("finish_reason"), body.get("plan")
    return DecodeDoneBody(
        node_id=f.an_id_or_empty(body, "node_id"),
        finish_reason=None if reason is None else f.one_of(reason, "finish_reason", FINISH_REASONS),
        tokens=_tokens(body.get("tokens"), bounds), plan=None if kind is None else _plan_kind(kind),
        usage=_usage(body.get("usage")), timings=_timings(body.get("timings"), DecodeTimings),
        stats=f.stats(body.get("stats")), prompt_logprobs=_prompt_logprobs(body.get("prompt_logprobs"), bounds))


def _usage(value: Any) -> Usage:
    usage = f.small_map(value, "usage")
    return Usage(**{field.name: f.count(usage.get(field.name, 0), f"usage.{field.name}")
                    for field in dataclasses.fields(Usage)})


def _timings(value: Any, kind: type[Timings]) -> Timings:
    timings = f.small_map(value, "timings")   # only the node's own stages: never the client's `ttft_s`
    return kind(**{field.name: f.seconds(timings.get(field.name), f"timings.{field.name}")
                   for field in dataclasses.fields(kind)})


def transfer(value: Any, bounds: Bounds) -> TransferReport:
    report = f.a_map(value, "transfer")
    if len(report) > f.MAX_FIELDS:
        raise Refused(f"transfer must be a map of at most {f.MAX_FIELDS} entries")
    return TransferReport(
        f.an_id_or_empty(report, "transfer_id"), f.short_text(report.get("mode", ""), "transfer.mode"),
        f.short_text(report.get("compression", ""), "transfer.compression"),
        **{name: f.count(report.get(name, 0), f"transfer.{name}") for name in TRANSFER_COUNTS},
        seconds=f.number(report.get("seconds", 0.0), "transfer.seconds", 0.0, f.MAX_SECONDS))


def partial(value: Any, bounds: Bounds) -> TokenBody | None:
    """A PARTIAL after the plan: its token, or None for a map of another `type`."""
    if not isinstance(value, dict):
        raise Refused("a PARTIAL body must be a map")
    return token(value, bounds) if value.get("type") == "token" else None


def error_details(details: Any, node_id: str) -> tuple[str, float | None]:
    if not isinstance(details, dict):
        return node_id, None
    retry_after = details.get("retry_after_s")
    if not (f.is_number(retry_after) and retry_after >= 0):
        return claimed_node(details) or node_id, None
    return claimed_node(details) or node_id, min(float(retry_after), MAX_RETRY_AFTER_S)


def claimed_node(value: Any) -> str:
    node_id = value.get("node_id") if isinstance(value, dict) else None
    return node_id if f.is_id(node_id) else ""
