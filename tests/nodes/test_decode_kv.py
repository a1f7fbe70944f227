"""nodes.decode_kv: the decode node bounds what one KV chunk may carry by its own `[kv]
chunk_mib` (4x, at least 64 MiB), which also sets its data socket's MAXMSGSIZE, instead of the
protocol's 1 GiB."""

from __future__ import annotations

from types import SimpleNamespace

from bus.kv.header_checks import MAX_CHUNK_BYTES
from nodes.decode_kv import MIN_CHUNK_BOUND, receive_config


def test_a_decode_node_bounds_chunks_by_its_own_chunk_size():
    assert receive_config(SimpleNamespace(kv_chunk_mib=None)).max_chunk_bytes == MIN_CHUNK_BOUND
    assert receive_config(SimpleNamespace(kv_chunk_mib=32)).max_chunk_bytes == 128 << 20
    assert MIN_CHUNK_BOUND < MAX_CHUNK_BYTES
