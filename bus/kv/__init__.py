"""KV transfer: the codec and data plane that move a prompt's KV cache from prefill to decode.

The seam, by side (docs/PROTOCOL.md part 2 is the wire contract):

Prefill side (sender)
    KVSender(quantizer=None, config=SendConfig(), chunk_bytes=4 MiB, link_bytes_per_s=10 Gbit/s,
             max_peers=128, peer_idle_s=60.0)     # idle data endpoints are closed (bus/kv/peers.py)
    await sender.send(endpoint, transfer_id, request_id, kv, mode="int8", compression="auto",
                      token_offset=0, dtype=None) -> TransferReport    # raises KVTransferFailed
    await sender.abort(transfer_id, reason) -> bool
    await sender.close()

Decode side (receiver)
    KVReceiver(allocate=None, release=None, quantizer=None, config=ReceiveConfig(), bind=...)
        ReceiveConfig bounds what a peer may send: max_transfer_bytes, max_chunk_bytes (and MAXMSGSIZE)
        allocate(transfer_id, request_id, info, mode) -> a buffer, or RawPieces(info) for raw
    await receiver.start() -> endpoint            # advertise it in READY
    await receiver.result(transfer_id, timeout) -> TransferResult (ok, kv, stats | reason)
    async for result in receiver.results(): ...   # or every result in completion order
    receiver.cancel(transfer_id, reason)
    await receiver.close()

Compute seam: a `Quantizer` (numpy `NumpyQuantizer` here; `TorchQuantizer` in
nodes/engines/kv_quant.py) encodes/decodes one chunk. Pure parts, usable without sockets:
`ChunkEncoder` / `verify_and_decode` (chunk_codec), `SendTransfer` (send_core), `ReceiverCore`
(recv_core), `encode_message` / `decode_message` (frames; field checks in header_checks), `Peers`
(peers). Modes: raw | bf16 | int8 | int8_sym; compression: auto | none | lz4 | zstd. Every error
is a `KVError`.
"""

from bus.kv.faults import FaultInjector
from bus.kv.kv_errors import (
    KVChecksumError,
    KVError,
    KVFrameError,
    KVTransferFailed,
    KVTransferTimeout,
    KVValueError,
)
from bus.kv.layout import KVInfo
from bus.kv.pieces import RawPieces
from bus.kv.quant import MODES, EncodedPayload, NumpyQuantizer, Quantizer
from bus.kv.receiver import KVReceiver, numpy_allocator
from bus.kv.recv_core import ReceiveConfig, ReceiverCore
from bus.kv.send_core import SendConfig, SendTransfer
from bus.kv.sender import KVSender
from bus.kv.stats import TransferReport, TransferResult, TransferStats

__all__ = [
    "MODES", "EncodedPayload", "FaultInjector", "KVChecksumError", "KVError", "KVFrameError", "KVInfo",
    "KVReceiver", "KVSender", "KVTransferFailed", "KVTransferTimeout", "KVValueError", "NumpyQuantizer",
    "Quantizer", "RawPieces", "ReceiveConfig", "ReceiverCore", "SendConfig", "SendTransfer", "TransferReport",
    "TransferResult", "TransferStats", "numpy_allocator",
]
