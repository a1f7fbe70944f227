"""The sender's checks on the messages node code originates (REQUEST, DIRECT, CONTROL): what a
broker would refuse fails in the caller, before anything is queued or sent.

Contract: `encode_checked(message) -> list` returns `bus.codec.encode(message)` after checking the
routing frames the broker reads (service, request id, peer: 1..MAX_ID_BYTES UTF-8 bytes; the
routing key: 0..MAX_ID_BYTES) and, for CONTROL, the body against MAX_CONTROL_BYTES; otherwise
it raises `ProtocolError` (`malformed`), as `encode` itself does for a body no peer would accept.
"""

from __future__ import annotations

from typing import Any

from bus import constants as c
from bus.codec import encode
from bus.messages import Control, Direct, Request
from bus.wire_checks import ProtocolError


def encode_checked(message: Request | Direct | Control) -> list[Any]:
    """`encode`, after checking the routing frames a broker would refuse (ids, service, key,
    peer of 1..MAX_ID_BYTES UTF-8 bytes; key may be empty): a message that cannot travel fails
    here, in the sender, with ProtocolError, instead of on the bus."""
    routing = ((message.service, "service"), (message.request_id, "request_id")) if isinstance(
        message, Request) else ((message.peer, "peer"),)
    for value, what in routing:
        _check_routing(value, what, allow_empty=False)
    if isinstance(message, Request):
        _check_routing(message.key, "key", allow_empty=True)
    frames = encode(message)
    if isinstance(message, Control) and len(frames[2]) > c.MAX_CONTROL_BYTES:
        raise ProtocolError(c.DropReason.MALFORMED, f"CONTROL body over {c.MAX_CONTROL_BYTES} bytes")
    return frames


def _check_routing(value: str, what: str, *, allow_empty: bool) -> None:
    try:
        size = len(value.encode())
    except (AttributeError, UnicodeEncodeError):
        raise ProtocolError(c.DropReason.MALFORMED, f"{what} must be UTF-8 text") from None
    if size > c.MAX_ID_BYTES or (size == 0 and not allow_empty):
        raise ProtocolError(c.DropReason.MALFORMED, f"{what} must be {int(not allow_empty)}..{c.MAX_ID_BYTES} bytes")
