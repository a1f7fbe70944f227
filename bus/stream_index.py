"""The index frame of a STREAMS message (docs/PROTOCOL.md §1.2): the flat msgpack list that pairs
each request id with the seq of its next PARTIAL, read at two depths.

Contract:
- `stream_index_shape(frame) -> list`: the broker's cheap read on its fast path, a flat list of
  2..2*MAX_STREAM_ENTRIES items (an even count); the items themselves are not checked.
- `stream_index(frame) -> list`: the same list, every id bytes of 1..MAX_ID_BYTES and every seq
  a uint (not bool); what the client (through `bus.codec.decode`) and the broker's split path read.
Both raise `ProtocolError` (`malformed`) on anything else, never another exception. With
`bus.codec`, the only control-plane module that imports msgpack.
"""

from __future__ import annotations

from typing import Any

import msgpack

from bus import constants as c
from bus.wire_checks import ProtocolError


def stream_index_shape(frame: Any) -> list[Any]:
    """The broker's cheap read of a STREAMS index: a flat list of 2..2*MAX_STREAM_ENTRIES items, or
    ProtocolError. Its items are not checked here: the broker routes only entries whose id is a
    routed request id (bytes found in its table) and splits the message otherwise, where
    `stream_index` checks everything; the client decodes every entry in full."""
    try:
        index = msgpack.unpackb(frame, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ProtocolError(c.DropReason.MALFORMED, f"STREAMS index is not msgpack: {type(exc).__name__}") from None
    if type(index) is not list or not 2 <= len(index) <= 2 * c.MAX_STREAM_ENTRIES or len(index) % 2:
        raise ProtocolError(c.DropReason.MALFORMED, f"STREAMS index must pair 1..{c.MAX_STREAM_ENTRIES} "
                                                    "request ids with seqs")
    return index


def stream_index(frame: Any) -> list[Any]:
    """A STREAMS index frame, validated in full: `stream_index_shape`, and each id 1..MAX_ID_BYTES
    bytes (msgpack bin), each seq a uint (not bool). What the client and the broker's split path read."""
    index = stream_index_shape(frame)
    if (not all(type(r) is bytes and 0 < len(r) <= c.MAX_ID_BYTES for r in index[::2])
            or not all(type(s) is int and s >= 0 for s in index[1::2])):
        raise ProtocolError(c.DropReason.MALFORMED, f"STREAMS index must pair request ids (bin, "
                                                    f"1..{c.MAX_ID_BYTES} bytes) with seqs (uint)")
    return index
