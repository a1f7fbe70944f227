"""Bounds on decoded control-plane bodies: nesting depth, capacity maps, id lists, short texts.

Contract: pure functions over values msgpack produced (or is about to encode); each returns the
value it checked (possibly cut, for free text) or raises `ProtocolError` (defined here, used
as `bus.codec.ProtocolError`) with reason `malformed`, never another exception. The limits are `bus.constants.MAX_*` and docs/PROTOCOL.md
§1.7 lists them. `bus.codec` calls these while decoding, so node code and the broker only ever
see bodies within them; `check_depth` also runs before encoding, so no peer is sent a body it
would refuse.
"""

from __future__ import annotations

import math
from typing import Any

from bus import constants as c

_CONTAINERS = (list, tuple, dict)


class ProtocolError(ValueError):
    """Input we refuse. `reason` is a DropReason value; `request_id` is set when the message
    could be tied to a request, so the sender can get a request-scoped ERROR."""

    def __init__(self, reason: str, detail: str, request_id: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.request_id = request_id


def _malformed(detail: str) -> ProtocolError:
    return ProtocolError(c.DropReason.MALFORMED, detail)


def check_depth(value: Any, limit: int = c.MAX_BODY_DEPTH) -> Any:
    """`value` unless lists/maps nest deeper than `limit` levels (a scalar is depth 0).
    Iterative, so a hostile depth never reaches Python's recursion limit here."""
    stack = [(value, 1)] if isinstance(value, _CONTAINERS) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise _malformed(f"body nests deeper than {limit} levels")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, _CONTAINERS))
    return value


def capacity_map(value: Any) -> dict[str, float]:
    """A capacity mapping: at most MAX_CAPACITY_KEYS short str names, finite int/float values."""
    if not isinstance(value, dict) or len(value) > c.MAX_CAPACITY_KEYS:
        raise _malformed(f"capacity must map at most {c.MAX_CAPACITY_KEYS} names to numbers")
    for name, number in value.items():
        if not isinstance(name, str) or len(name.encode(errors="replace")) > c.MAX_CAPACITY_KEY_BYTES:
            raise _malformed(f"capacity names are str of at most {c.MAX_CAPACITY_KEY_BYTES} bytes")
        if not isinstance(number, int | float) or isinstance(number, bool) or not math.isfinite(number):
            raise _malformed(f"capacity {name!r} must be a finite number")
    return value


def id_list(value: Any, what: str) -> tuple[str, ...]:
    """READY's inflight / pending: at most MAX_ANNOUNCED_IDS request ids of 1..MAX_ID_BYTES bytes."""
    if not isinstance(value, list) or len(value) > c.MAX_ANNOUNCED_IDS:
        raise _malformed(f"{what} must be a list of at most {c.MAX_ANNOUNCED_IDS} request ids")
    if not all(isinstance(v, str) and 0 < len(v.encode(errors="replace")) <= c.MAX_ID_BYTES for v in value):
        raise _malformed(f"{what} must be a list of request ids")
    return tuple(value)


def short_str(value: Any, what: str, max_bytes: int) -> str:
    """A code or a reason: a str of at most `max_bytes` UTF-8 bytes."""
    if not isinstance(value, str) or len(value.encode(errors="replace")) > max_bytes:
        raise _malformed(f"{what} must be a str of at most {max_bytes} bytes")
    return value


def free_text(value: Any, what: str) -> str:
    """A human-readable message: a str, cut to MAX_TEXT_CHARS (a long text is no reason to lose
    the ERROR that ends a stream)."""
    if not isinstance(value, str):
        raise _malformed(f"{what} must be a str")
    return value if len(value) <= c.MAX_TEXT_CHARS else value[:c.MAX_TEXT_CHARS] + "…"
