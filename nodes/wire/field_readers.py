"""Readers of single fields of an untrusted body, for nodes/wire/body_codec.py: each takes the value as
msgpack decoded it (any type: a float, a list, an ExtType or a Timestamp where a string belongs)
and returns it typed and in range, or raises `Refused`.

Contract: `Bounds(vocab_size, max_model_len, max_tokens)` is what a reader checks a body against:
a node gives its engine's (token ids in the vocabulary, prompts inside the context), the client
the most tokens its request may produce (reply indices below it, a FINAL lists at most that many);
token ids are in [0, 2**31) by default. `Refused(reason, code=Code.BAD_REQUEST)` is the only
exception raised here; its reason
names the field and its bounds, never a value from the body (so it is short, and safe to log and
to send back). `summary(value)` describes an untrusted value for a log line in bounded space: its
type and size, never its contents (repr() of a body nested a thousand levels deep raises
RecursionError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from bus.constants import MAX_ID_BYTES
from nodes.engines.engine_types import MAX_LOGPROBS, TokenLogprobs
from nodes.wire.codes import Code

MAX_TOKEN_ID = 2**31 - 1          # the default vocabulary bound of a reply's token ids
MAX_COUNT = 2**63 - 1             # counters, byte counts, timings' index
MAX_SECONDS = 1e6
MAX_TEXT_CHARS = 8192             # one token's text: a stop string's hold-back (<= 1024) and more
MAX_SHORT_CHARS = 32              # KV modes, compressions
MAX_STAT_NAME_CHARS = 64
MAX_FIELDS = 64                   # entries of a stats / usage / timings / transfer map
MAX_ENDPOINT_BYTES = 512          # tcp://host:port;curve=<64 hex> fits many times over
MIN_LOGPROB = -1e9                # a log-probability is in [MIN_LOGPROB, 0] (-inf travels as this)
MAX_PROMPT_LOGPROBS = 1 << 20     # entries of a FINAL's `prompt_logprobs`


@dataclass(frozen=True, slots=True)
class Bounds:
    vocab_size: int = MAX_TOKEN_ID + 1   # token ids are in [0, vocab_size)
    max_model_len: int = MAX_COUNT       # a prompt is shorter than this
    max_tokens: int = MAX_COUNT          # a reply's indices are below this; a FINAL lists at most this many


class Refused(ValueError):
    """A body that will not be acted on: a node answers ERROR `code` (or drops a DIRECT); the client
    fails over from the node that sent it."""

    def __init__(self, reason: str, code: str = Code.BAD_REQUEST) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


def summary(value: Any) -> str:
    kind = type(value).__name__
    return f"{kind}[{len(value)}]" if isinstance(value, str | bytes | list | tuple | dict) else kind


def is_int(value: Any) -> TypeGuard[int]:
    return type(value) is int   # not bool, which msgpack keeps apart and Python counts as int


def is_number(value: Any) -> TypeGuard[int | float]:
    return is_int(value) or (type(value) is float and math.isfinite(value))


def is_id(value: Any, max_bytes: int = MAX_ID_BYTES) -> TypeGuard[str]:
    if not isinstance(value, str) or not 0 < len(value) <= max_bytes:
        return False
    try:
        return len(value.encode()) <= max_bytes
    except UnicodeEncodeError:   # a lone surrogate: no peer could be sent it
        return False


def a_map(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise Refused(f"{what} must be a map")
    return value


def typed_map(value: Any, kind: str, what: str) -> dict:
    if not isinstance(value, dict) or value.get("type") != kind:
        raise Refused(f"{what} must be a map of type {kind!r}")
    return value


def small_map(value: Any, what: str) -> dict:
    """A map of at most MAX_FIELDS entries; {} for a missing one."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_FIELDS:
        raise Refused(f"{what} must be a map of at most {MAX_FIELDS} entries")
    return value


def an_id(body: dict, key: str, max_bytes: int = MAX_ID_BYTES) -> str:
    value = body.get(key)
    if not is_id(value, max_bytes):
        raise Refused(f"{key} is required: a non-empty string of at most {max_bytes} bytes")
    return value


def an_id_or_empty(body: dict, key: str) -> str:
    """An id, or "" when the field is missing or empty."""
    return "" if body.get(key, "") == "" else an_id(body, key)


def count(value: Any, what: str, low: int = 0, high: int = MAX_COUNT) -> int:
    if not is_int(value) or not low <= value <= high:
        raise Refused(f"{what} must be an integer in [{low}, {high}]")
    return value


def number(value: Any, what: str, low: float, high: float, *, open_low: bool = False) -> float:
    ok = is_number(value) and (low < value if open_low else low <= value) and value <= high
    if not ok:
        raise Refused(f"{what} must be a number in {'(' if open_low else '['}{low:g}, {high:g}]")
    return float(value)


def seconds(value: Any, what: str) -> float | None:
    return None if value is None else number(value, f"{what} (null or seconds)", 0.0, MAX_SECONDS)


def flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise Refused(f"{what} must be true or false")
    return value


def short_text(value: Any, what: str, max_chars: int = MAX_SHORT_CHARS) -> str:
    if not isinstance(value, str) or len(value) > max_chars:
        raise Refused(f"{what} must be a string of at most {max_chars} characters")
    return value


def one_of(value: Any, what: str, choices: tuple[str, ...]) -> str:
    if not (isinstance(value, str) and value in choices):
        raise Refused(f"{what} must be one of {', '.join(choices)}")
    return value


def stats(value: Any) -> dict[str, int | float]:
    found: dict[str, int | float] = {}
    for name, amount in small_map(value, "stats").items():
        if not isinstance(name, str) or len(name) > MAX_STAT_NAME_CHARS:
            raise Refused(f"stats keys must be strings of at most {MAX_STAT_NAME_CHARS} characters")
        if not (is_number(amount) and 0 <= amount <= MAX_COUNT):
            raise Refused("stats values must be numbers in [0, 2**63)")
        found[name] = amount
    return found


def logprobs(value: Any, what: str, vocab_size: int) -> TokenLogprobs | None:
    """null, or [logprob, [[token_id, logprob], ...]] with at most MAX_LOGPROBS pairs."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2 or not isinstance(value[1], list | tuple) \
            or len(value[1]) > MAX_LOGPROBS:
        raise Refused(f"{what} must be null or [logprob, [[token_id, logprob], ...]] with at most "
                      f"{MAX_LOGPROBS} pairs")
    top = []
    for pair in value[1]:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise Refused(f"{what}: each alternative must be [token_id, logprob]")
        top.append((count(pair[0], f"{what} token_id", 0, vocab_size - 1), number(pair[1], what, MIN_LOGPROB, 0.0)))
    return TokenLogprobs(number(value[0], what, MIN_LOGPROB, 0.0), tuple(top))
