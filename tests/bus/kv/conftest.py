"""Fixtures for the KV codec tests: small synthetic KV and an in-memory sender/receiver pair."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import xxhash

from bus.kv.chunk_codec import ChunkEncoder
from bus.kv.compress import AutoCompression
from bus.kv.frames import MAGIC, VERSION, decode_message
from bus.kv.layout import DTYPES
from bus.kv.quant import NumpyQuantizer
from bus.kv.recv_core import ReceiveConfig, ReceiverCore
from bus.kv.send_core import SendConfig, SendTransfer

PEER = b"prefill-1"


def synthetic_kv(layers=3, heads=2, tokens=40, head_dim=16, dtype=np.float32, seed=0) -> np.ndarray:
    """KV-like values: per-row offsets and scales, as real K/V rows have."""
    rng = np.random.default_rng(seed)
    shape = (layers, 2, heads, tokens, head_dim)
    offsets = rng.normal(0, 2, size=shape[:-1] + (1,))
    scales = rng.uniform(0.1, 3, size=shape[:-1] + (1,))
    return (rng.normal(size=shape) * scales + offsets).astype(dtype)


def seal(kind: int, fields) -> bytes:
    """A header frame of any fields with a valid trailer: it gets past the checksum to the field checks."""
    body = MAGIC + bytes((VERSION, kind)) + msgpack.packb(fields, use_bin_type=True)
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


@pytest.fixture
def kv() -> np.ndarray:
    return synthetic_kv()


class Pair:
    """A SendTransfer and a ReceiverCore joined by an in-memory network the test can tamper with."""

    def __init__(self, kv, clock, *, mode="int8", compression="none", chunk_bytes=2048, window=3,
                 send_config=None, receive_config=None, allocate=None, transfer_id="t1", request_id="r1",
                 dtype=None):
        self.clock = clock
        self.released = []
        self.quantizer = NumpyQuantizer()
        self.allocate_calls = 0
        self.dst_dtype = None

        def default_allocate(transfer_id, request_id, info, mode):
            self.allocate_calls += 1
            return np.full(info.shape, np.nan if info.dtype != "bfloat16" else 0, DTYPES[self.dst_dtype or info.dtype])

        self.receiver = ReceiverCore(self.quantizer, allocate or default_allocate,
                                     lambda tid, dst: self.released.append(tid),
                                     receive_config or ReceiveConfig(transfer_timeout=5.0))
        encoder = ChunkEncoder(kv, self.quantizer, transfer_id=transfer_id, request_id=request_id, mode=mode,
                               compression=compression, chunk_bytes=chunk_bytes,
                               auto=AutoCompression(1.25e9), dtype=dtype)
        self.sender = SendTransfer(encoder, send_config or SendConfig(window=window, ack_timeout=0.5), clock())
        self.wire: list[list] = []      # sent by the sender, not yet delivered
        self.replies: list[list] = []   # sent by the receiver, not yet delivered
        self.results = []
        self.max_in_flight = 0

    def pump_sender(self) -> None:
        while (frames := self.sender.next_frames(self.clock())) is not None:
            self.wire.append(frames)
        self.max_in_flight = max(self.max_in_flight, len(self.sender._in_flight))

    def deliver_to_receiver(self, tamper=None) -> None:
        wire, self.wire = self.wire, []
        for frames in wire:
            frames = tamper(frames) if tamper else frames
            if frames is None:
                continue
            for peer, reply in self.receiver.on_frames(PEER, [bytes(memoryview(f).cast("B")) for f in frames], self.clock()):
                assert peer == PEER
                self.replies.append(reply)
        self.results += self.receiver.pop_results()

    def deliver_to_sender(self) -> None:
        replies, self.replies = self.replies, []
        for reply in replies:
            message, _ = decode_message(reply)
            self.sender.on_message(message, self.clock())

    def run(self, tamper=None, steps=200, advance=0.0) -> None:
        for _ in range(steps):
            self.pump_sender()
            moved = len(self.wire)
            self.deliver_to_receiver(tamper)
            moved += len(self.replies)
            self.deliver_to_sender()
            if self.sender.finished and not self.wire and not self.replies:
                return
            if advance and not moved:  # idle: let time pass so the timers fire
                self.clock.advance(advance)
                self.sender.poll(self.clock())
                for _, reply in self.receiver.poll(self.clock()):
                    self.replies.append(reply)
                self.results += self.receiver.pop_results()


@pytest.fixture
def make_pair(clock):
    def make(kv, **kwargs) -> Pair:
        return Pair(kv, clock, **kwargs)
    return make
