"""The fuzz strategies and their driver, without a cluster: every message kind is generated, KV
headers carry trailers that pass the checksum whatever their fields, a forged transfer passes every
check a receiver can make without knowing its sender, and generation is bounded and reproducible."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import xxhash

from bus import codec
from bus.constants import Command
from bus.kv import frames as kvf
from bus.kv.chunk_codec import verify
from bus.kv.kv_errors import KVFrameError
from bus.kv.quant import NumpyQuantizer
from bus.kv.recv_core import ReceiverCore
from harness.fuzz import forged_frames
from harness.fuzz import http_strategies as hs
from harness.fuzz import strategies as s
from harness.fuzz.sampler import Sampler

KNOWN = forged_frames.Known(node_ids=["decode-0"], request_ids=["r-live"], transfer_ids=["t-live"],
                data_endpoints=["tcp://127.0.0.1:9"])


@pytest.fixture(scope="module")
def control_examples():
    return Sampler(11).draw(s.control(KNOWN), 400)


def test_every_control_command_is_generated_as_frames_of_bytes(control_examples):
    kinds = Counter(kind for kind, _ in control_examples)
    assert set(kinds) >= {cmd.name for cmd in Command} | {"garbage"}
    assert all(frames and all(isinstance(f, bytes) for f in frames) for _, frames in control_examples)


def test_most_control_headers_are_well_formed_so_fields_get_checked(control_examples):
    valid = sum(1 for kind, frames in control_examples if kind != "garbage" and frames[0] == codec.HEADERS[Command[kind]])
    assert valid > len(control_examples) / 2


def test_kv_headers_carry_a_valid_trailer_over_any_fields():
    for fields in ([1, 2], {"x": [None, 2**64 - 1]}, ["t", "r", [2**31 - 1] * 5], b"\xc1"):
        header = forged_frames.kv_header(kvf.CHUNK, fields)
        assert xxhash.xxh3_64_intdigest(header[:-8]) == int.from_bytes(header[-8:], "little")
        try:
            kvf.decode_header(header)
        except KVFrameError as exc:
            assert "checksum" not in str(exc)
    with pytest.raises(KVFrameError, match="checksum"):
        kvf.decode_header(forged_frames.kv_header(kvf.END, ["t", "r", 1, 4, 0], trailer_ok=False))


def test_kv_examples_cover_every_kind_and_mostly_pass_the_trailer():
    examples = Sampler(5).draw(s.kv(KNOWN), 300)
    kinds = Counter(kind for kind, _ in examples)
    assert {"CHUNK", "CHUNK.forged", "END", "ABORT", "ACK", "NACK", "DONE", "kv.garbage"} <= set(kinds)
    reasons = Counter()
    for _, frames in examples:
        try:
            kvf.decode_message(frames)
            reasons["decoded"] += 1
        except KVFrameError as exc:
            reasons["checksum" if "checksum" in str(exc) else "fields"] += 1
    assert reasons["decoded"] > 0 and reasons["checksum"] < reasons["fields"]


def test_a_forged_transfer_passes_every_check_a_receiver_can_make():
    shape, nan = (2, 2, 2, 5, 16), b"\x00\x00\xc0\x7f"
    messages = forged_frames.forged_transfer("t-forged", "r-forged", shape, nan, chunk_bytes=256)
    for frames in messages[:-1]:
        chunk, payload = kvf.decode_message(frames)
        verify(chunk, payload)   # the payload checksum holds
    core = ReceiverCore(NumpyQuantizer(), lambda *_: np.zeros(shape, np.float32))
    for frames in messages:
        core.on_frames(b"peer", frames, 0.0)
    [result] = core.pop_results()
    assert result.ok and np.isnan(result.kv).all() and len(messages) > 2


def test_http_and_ws_examples_are_requests_of_bytes_and_messages():
    requests = Sampler(2).draw(hs.http_request(), 60)
    assert all(isinstance(raw, bytes) and b"\r\n\r\n" in raw for _, raw in requests)
    assert any(raw.startswith(b"POST /v1/completions ") for _, raw in requests)
    sessions = Sampler(2).draw(hs.ws_messages, 30)
    assert all(1 <= len(m) <= 4 and all(isinstance(x, str | bytes) for x in m) for m in sessions)


def test_generation_is_reproducible_per_seed_and_bounded_in_count():
    first, again, other = Sampler(3), Sampler(3), Sampler(4)
    drawn = first.draw(s.control(KNOWN), 40)
    assert drawn == again.draw(s.control(KNOWN), 40) and len(drawn) <= 40
    assert drawn != other.draw(s.control(KNOWN), 40) and first.rounds == 1


def test_known_ids_are_read_when_drawn_not_when_built():
    known = forged_frames.Known(request_ids=[])
    strategy = s.known_id(known, "request_ids", s.hex_ids.filter(lambda _: False))
    known.request_ids.append("r-late")
    assert set(Sampler(0).draw(strategy, 10)) == {"r-late"}
