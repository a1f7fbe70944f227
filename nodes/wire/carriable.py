"""What the bus can carry, checked by the client before a request is sent.

Contract: msgpack bodies of UTF-8 strings, ints in -2**63..2**64-1, finite floats, bytes, bools,
None, lists and str-keyed maps nested at most MAX_DEPTH deep; routing keys of at most MAX_ID_BYTES
UTF-8 bytes (docs/PROTOCOL.md). `check_request(prompt, sampling, session_id)` checks what a decode
(and then a prefill) request of this prompt, sampling and session would carry and raises
`Uncarriable` (a ValueError) whose `path` names the field (`session_id`, `sampling.stop[1]`,
`prompt_token_ids[3]`); `check_routing_key(key, path)` checks a key; `check_carriable(value, path)`
is the generic walk behind them.
"""

from __future__ import annotations

import math
from typing import Any

from bus.constants import MAX_BODY_DEPTH, MAX_ID_BYTES
from nodes.wire.bodies import DecodeRequestBody, SamplingParams
from nodes.wire.body_codec import to_wire

MAX_DEPTH = MAX_BODY_DEPTH                   # nested lists/maps in one body (the bus's own bound)
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 64 - 1   # what msgpack carries
_SCALARS = (bool, type(None), bytes, bytearray)


class Uncarriable(ValueError):
    """A value the bus cannot carry; `path` names where it is (`sampling.stop[1]`)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def check_request(prompt: tuple[int, ...], sampling: SamplingParams, session_id: str) -> None:
    """The prompt's ids checked in C (min/max), not one by one; then the rest of the body."""
    check_routing_key(session_id, "session_id")
    if prompt and not (min(prompt) >= INT_MIN and max(prompt) <= INT_MAX):
        index = next(i for i, t in enumerate(prompt) if not INT_MIN <= t <= INT_MAX)
        raise Uncarriable(f"prompt_token_ids[{index}]", "an integer outside -2**63..2**64-1")
    check_carriable(to_wire(DecodeRequestBody((), sampling, session_id)), "")


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
