"""Checks on every reply body the cluster client acts on, at arrival, before any of it reaches the
token stream, the trace or the metrics: the client's twin of nodes/body_checks.py (docs/CLUSTER.md
lists the bodies; nodes/cluster_wire.py names them).

Contract: one pure function per reply kind, each taking the body as msgpack decoded it (any type
in any field: a float, a list, an ExtType or a Timestamp where a map belongs) and `limit`, the most
tokens the request may produce (its `max_tokens`):
- `plan(body) -> Plan`                          decode PARTIAL 0
- `token(body, limit) -> Token | None`          a PARTIAL after the plan; None for a map of another
                                                `type` (ignored, as a newer node may send more kinds)
- `prefill_done(body, limit) -> PrefillDone`    prefill FINAL: its token, transfer report, timings
- `decode_done(body, limit) -> DecodeDone`      decode FINAL: finish reason, tokens, usage, timings,
                                                stats; `as_trace()` is what `RequestTrace` keeps
Each returns frozen values of the right types within range: token ids ints in [0, 2**31), indices
in [0, limit), texts of at most MAX_TEXT_CHARS, node and transfer ids non-empty strings of at most
MAX_ID_BYTES (a FINAL's node id may be ""), timings finite seconds in [0, MAX_SECONDS] of the
node's own stages only (a node cannot overwrite the client's `ttft_s`), counters ints in
[0, 2**63), maps of at most MAX_FIELDS entries; or raises `body_checks.Refused(reason)`. Nothing
else is ever raised (tests/nodes/test_reply_checks.py feeds arbitrary msgpack values). A reason
names fields and bounds, never a value from the body.
- `error_details(details, node_id) -> (node_id, retry_after_s | None)` reads an ERROR's details
  and never refuses (the ERROR already ends the stream): the claimed node id when it is a valid
  id, else `node_id`; `retry_after_s` when a finite number >= 0, capped at MAX_RETRY_AFTER_S.
- `claimed_node(body)`: the node id a body claims, for a log line ("" when none is valid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bus.constants import MAX_ID_BYTES
from nodes import cluster_wire as wire
from nodes.body_checks import MAX_ENDPOINT_BYTES, Refused, summary

__all__ = ["DecodeDone", "Plan", "PrefillDone", "Refused", "Token", "claimed_node", "decode_done",
           "error_details", "plan", "prefill_done", "summary", "token"]

MAX_TOKEN_ID = 2**31 - 1
MAX_TEXT_CHARS = 8192            # one token's text: a stop string's hold-back (<= 1024) and more
MAX_SHORT_CHARS = 32             # finish reasons, KV modes, compressions
MAX_FIELDS = 64                  # entries of a timings / stats / usage / transfer map
MAX_COUNT = 2**63 - 1
MAX_SECONDS = 1e6
MAX_RETRY_AFTER_S = 60.0
PLANS = (wire.PLAN_REMOTE, wire.PLAN_CACHED, wire.PLAN_LOCAL)
FINISH_REASONS = ("stop", "length", "abort")
PREFILL_STAGES = ("queue_s", "prefill_s", "kv_transfer_s")
DECODE_STAGES = ("kv_wait_s", "decode_queue_s", "decode_s")
TRANSFER_COUNTS = ("raw_bytes", "wire_bytes", "retries", "checksum_failures", "resends")
USAGE_COUNTS = ("prompt_tokens", "completion_tokens")


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str                     # remote | cached | local
    node_id: str
    data_endpoint: str = ""       # remote only
    transfer_id: str = ""         # remote only


@dataclass(frozen=True, slots=True)
class Token:
    index: int                    # relative to the request that produced it
    token_id: int
    text: str


@dataclass(frozen=True, slots=True)
class PrefillDone:
    node_id: str
    token: Token | None
    transfer: dict[str, Any]      # the known fields of the transfer report, typed; {} when no KV moved
    timings: dict[str, float]


@dataclass(frozen=True, slots=True)
class DecodeDone:
    node_id: str
    finish_reason: str | None
    tokens: tuple[Token, ...]
    usage: dict[str, int]
    timings: dict[str, float]
    stats: dict[str, int | float]

    def as_trace(self) -> dict[str, Any]:
        return {"type": "done", "node_id": self.node_id, "finish_reason": self.finish_reason,
                "tokens": [[t.index, t.token_id, t.text] for t in self.tokens], "usage": dict(self.usage),
                "timings": dict(self.timings), "stats": dict(self.stats)}


# -- the bodies ------------------------------------------------------------------------------
def plan(body: Any) -> Plan:
    body = _typed_map(body, "plan", "a plan")
    kind = body.get("plan")
    if not (isinstance(kind, str) and kind in PLANS):
        raise Refused(f"plan must be one of {', '.join(PLANS)}")
    node_id = _id(body, "node_id")
    if kind != wire.PLAN_REMOTE:
        return Plan(kind, node_id)
    return Plan(kind, node_id, _id(body, "data_endpoint", MAX_ENDPOINT_BYTES), _id(body, "transfer_id"))


def token(body: Any, limit: int) -> Token | None:
    if not isinstance(body, dict):
        raise Refused("a PARTIAL body must be a map")
    if body.get("type") != "token":
        return None
    return _token(body.get("index"), body.get("token_id"), body.get("text"), limit)


def prefill_done(body: Any, limit: int) -> PrefillDone:
    body = _typed_map(body, "done", "a prefill FINAL")
    first = body.get("token")
    return PrefillDone(_id(body, "node_id", optional=True), None if first is None else _triple(first, "token", limit),
                       _transfer(body.get("transfer")), _timings(body.get("timings"), PREFILL_STAGES))


def decode_done(body: Any, limit: int) -> DecodeDone:
    body = _typed_map(body, "done", "a decode FINAL")
    reason = body.get("finish_reason")
    if reason is not None and not (isinstance(reason, str) and reason in FINISH_REASONS):
        raise Refused(f"finish_reason must be null or one of {', '.join(FINISH_REASONS)}")
    return DecodeDone(_id(body, "node_id", optional=True), reason, _tokens(body.get("tokens"), limit),
                      _counts(body.get("usage"), "usage", USAGE_COUNTS), _timings(body.get("timings"), DECODE_STAGES),
                      _stats(body.get("stats")))


def error_details(details: Any, node_id: str) -> tuple[str, float | None]:
    if not isinstance(details, dict):
        return node_id, None
    retry_after = details.get("retry_after_s")
    if not (_is_number(retry_after) and retry_after >= 0):
        retry_after = None
    return claimed_node(details) or node_id, None if retry_after is None else min(float(retry_after),
                                                                                   MAX_RETRY_AFTER_S)


def claimed_node(body: Any) -> str:
    value = body.get("node_id") if isinstance(body, dict) else None
    return value if _is_id(value, MAX_ID_BYTES) else ""


# -- fields ----------------------------------------------------------------------------------
def _typed_map(body: Any, kind: str, what: str) -> dict:
    if not isinstance(body, dict) or body.get("type") != kind:
        raise Refused(f"{what} must be a map of type {kind!r}")
    return body


def _is_int(value: Any) -> bool:
    return type(value) is int   # not bool, which msgpack keeps apart and Python counts as int


def _is_number(value: Any) -> bool:
    return _is_int(value) or (type(value) is float and math.isfinite(value))


def _is_id(value: Any, max_bytes: int) -> bool:
    if not isinstance(value, str) or not 0 < len(value) <= max_bytes:
        return False
    try:
        return len(value.encode()) <= max_bytes
    except UnicodeEncodeError:   # a lone surrogate: no peer could be sent it
        return False


def _id(body: dict, key: str, max_bytes: int = MAX_ID_BYTES, *, optional: bool = False) -> str:
    value = body.get(key, "" if optional else None)
    if optional and value == "":
        return ""
    if not _is_id(value, max_bytes):
        raise Refused(f"{key} must be a non-empty string of at most {max_bytes} bytes")
    return value


def _token(index: Any, token_id: Any, text: Any, limit: int) -> Token:
    if not _is_int(index) or not 0 <= index < limit:
        raise Refused(f"a token's index must be an integer in [0, {limit})")
    if not _is_int(token_id) or not 0 <= token_id <= MAX_TOKEN_ID:
        raise Refused(f"token_id must be an integer in [0, {MAX_TOKEN_ID}]")
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        raise Refused(f"a token's text must be a string of at most {MAX_TEXT_CHARS} characters")
    return Token(index, token_id, text)


def _triple(value: Any, what: str, limit: int) -> Token:
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise Refused(f"{what} must be a list [index, token_id, text]")
    return _token(*value, limit)


def _tokens(value: Any, limit: int) -> tuple[Token, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > limit:
        raise Refused(f"tokens must be a list of at most {limit} [index, token_id, text] lists")
    return tuple(_triple(item, "each of tokens", limit) for item in value)


def _map(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_FIELDS:
        raise Refused(f"{what} must be a map of at most {MAX_FIELDS} entries")
    return value


def _timings(value: Any, stages: tuple[str, ...]) -> dict[str, float]:
    timings = _map(value, "timings")
    kept = {}
    for name in stages:
        seconds = timings.get(name)
        if seconds is None:
            continue
        if not (_is_number(seconds) and 0 <= seconds <= MAX_SECONDS):
            raise Refused(f"timings.{name} must be null or a number of seconds in [0, {MAX_SECONDS:g}]")
        kept[name] = float(seconds)
    return kept


def _count(value: Any, what: str) -> int:
    if not _is_int(value) or not 0 <= value <= MAX_COUNT:
        raise Refused(f"{what} must be an integer in [0, 2**63)")
    return value


def _counts(value: Any, what: str, names: tuple[str, ...]) -> dict[str, int]:
    found = _map(value, what)
    return {name: _count(found[name], f"{what}.{name}") for name in names if name in found}


def _stats(value: Any) -> dict[str, int | float]:
    stats = {}
    for name, count in _map(value, "stats").items():
        if not isinstance(name, str) or len(name) > MAX_SHORT_CHARS * 2:
            raise Refused(f"stats keys must be strings of at most {MAX_SHORT_CHARS * 2} characters")
        if not (_is_number(count) and 0 <= count <= MAX_COUNT):
            raise Refused("stats values must be numbers in [0, 2**63)")
        stats[name] = count
    return stats


def _transfer(value: Any) -> dict[str, Any]:
    report = _map(value, "transfer")
    kept: dict[str, Any] = {name: _count(report[name], f"transfer.{name}") for name in TRANSFER_COUNTS
                            if name in report}
    for name in ("mode", "compression"):
        if name in report:
            if not isinstance(report[name], str) or len(report[name]) > MAX_SHORT_CHARS:
                raise Refused(f"transfer.{name} must be a string of at most {MAX_SHORT_CHARS} characters")
            kept[name] = report[name]
    if "transfer_id" in report:
        kept["transfer_id"] = _id(report, "transfer_id")
    if "seconds" in report:
        seconds = report["seconds"]
        if not (_is_number(seconds) and 0 <= seconds <= MAX_SECONDS):
            raise Refused(f"transfer.seconds must be a number in [0, {MAX_SECONDS:g}]")
        kept["seconds"] = float(seconds)
    return kept
