"""bus.stream_index: a STREAMS index frame that is not a flat list pairing 1..MAX_STREAM_ENTRIES
request ids (bin, 1..MAX_ID_BYTES bytes) with seqs (uint) is refused as malformed."""

from __future__ import annotations

import msgpack
import pytest

from bus import constants as c
from bus.stream_index import stream_index
from bus.wire_checks import ProtocolError


@pytest.mark.parametrize("index", [
    [], [b"a"], [b"a", -1], [b"a", 1.5], [b"a", True], ["a", 0], [b"", 0], [b"x" * 129, 0],
    {"a": 0}, [b"a", 0] * (c.MAX_STREAM_ENTRIES + 1),
])
def test_bad_index_frames_are_malformed(index):
    with pytest.raises(ProtocolError, match="STREAMS index"):
        stream_index(msgpack.packb(index, use_bin_type=True))
