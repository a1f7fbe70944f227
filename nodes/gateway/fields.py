"""Field validators for request bodies (pure): each returns the field's value or raises the
gateway's 400 (`ApiError`) naming the field. Used by nodes/gateway/schema.py.

Contract: the bounds are what the cluster's bus carries (nodes/wire/carriable.py), so a value
accepted here can be sent: text is UTF-8 encodable (JSON's `\\ud800` escapes decode to lone
surrogates, which are not), integers fit their field's range (at most 64 bits), numbers are
finite, the body nests at most `MAX_DEPTH` levels. A session id (`session_id` or the
`X-Session-Id` header) is 1..MAX_SESSION_ID_CHARS visible ASCII characters: it is echoed in a
header and, prefixed with the tenant's tag, is the cluster's routing key (MAX_ID_BYTES).
`shown(value)` is how an error message quotes client input: ASCII, bounded.
"""

from __future__ import annotations

import math
import re
from typing import Any

from bus import wire_checks
from nodes import wire
from nodes.gateway.api_errors import bad_request

MAX_DEPTH = wire.MAX_DEPTH
MAX_SESSION_ID_CHARS = 96
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_TOKEN_ID = 2 ** 31 - 1
_SESSION_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_SESSION_ID_CHARS}}}")


def shown(value: Any, limit: int = 40) -> str:
    text = ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."


def text(value: str, name: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise bad_request(f"'{name}' is not valid UTF-8 text (a lone surrogate at {exc.start})", name) from None
    return value


def number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"'{name}' must be a number", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"'{name}' must be a finite number", name)
    if not low <= value <= high:   # exact for ints of any size: no float conversion yet
        raise bad_request(f"'{name}' must be between {low} and {high}, got {shown(value)}", name)
    return float(value)


def integer(body: dict, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer", name)
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be between {low} and {high}, got {shown(value)}", name)
    return value


def boolean(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", name)
    return value


def string(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", name)
    return value if value is None else text(value, name)


def session_id(body: dict, header: str | None) -> str | None:
    """The body's `session_id`, else the `X-Session-Id` header; None when neither (or empty)."""
    value = string(body, "session_id") or header or None
    if value is not None and not _SESSION_ID.fullmatch(value):
        raise bad_request(f"a session id (the 'session_id' field or the X-Session-Id header) is 1 to "
                          f"{MAX_SESSION_ID_CHARS} visible ASCII characters, got {shown(value)}", "session_id")
    return value


def token_ids(value: list) -> tuple[int, ...]:
    if not min(value) >= 0 or not max(value) <= MAX_TOKEN_ID:
        raise bad_request(f"token ids must be in [0, {MAX_TOKEN_ID}]", "prompt")
    return tuple(value)


def check_depth(body: Any) -> None:
    """400 when lists/maps nest deeper than MAX_DEPTH (the body itself is level 1): the bus's own
    bound (`bus.wire_checks.check_depth`, iterative), said as the API says it."""
    try:
        wire_checks.check_depth(body, MAX_DEPTH)
    except wire_checks.ProtocolError:
        raise bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels") from None


def field_names(names: Any, limit: int = 32) -> tuple[str, ...]:
    """Names of ignored fields as they can be logged: printable ASCII, bounded in length and number."""
    return tuple(sorted(ascii(name)[1:-1][:64] for name in names)[:limit])
