"""Sans-I/O receiver of KV transfers: verify, decode into the engine's buffer, ACK/NACK, fail closed.

Contract: `ReceiverCore(quantizer, allocate, release, config)`; the shell feeds every inbound message
as `on_frames(peer, frames, now)` and sends the returned `(peer, frames)` replies, calls `poll(now)`
periodically, and drains `pop_results()`: one `TransferResult` per transfer, ok (verified, every
chunk written into the destination `allocate(transfer_id, request_id, info, mode)` returned: a
buffer, or for a `raw` transfer a bus.kv.pieces.RawPieces that keeps the verified frames) or
failed (the destination was handed back to `release(...)` and must not be used). Nothing
undecodable or unverified is ever written into a destination; a result is ok only once every
chunk verified, the chunks cover the KV exactly once and the whole-transfer digest matches.

`on_frames(..., defer_decode=True)` acknowledges a chunk once it verified (checksum, decompression,
header) and queues its decode: the shell sends the ACK first, then calls `run_decodes(now)` and
sends what that returns, so the sender's credit comes back a decode earlier. A transfer completes
only after every queued decode ran; a decode that fails after its ACK fails the transfer closed.

Rejections: a corrupt chunk (checksum), a malformed or mismatched header, or an overlapping chunk
is counted and NACKed so the sender resends it; missing chunks are NACKed when END arrives, at
most `max_nacks_per_end` of them. A chunk NACKed more than `max_nacks_per_chunk` times, a transfer
older than `transfer_timeout`, a bad digest or no destination fails the transfer closed (DONE
ok=False to the sender, a failed result to the caller). Duplicates of accepted chunks are counted
and re-ACKed (the sender resends after an ACK timeout, so NACKing them would loop). A chunk of a
transfer from a peer other than the one that opened it is NACKed to that peer and spends nothing
of the owner's. Bounds: a KV over `max_transfer_bytes` is refused before `allocate` is asked, and a
chunk over `max_chunk_bytes` of raw payload before it is decompressed (refusing or failing its
transfer); decode_message has already refused anything over the protocol's bounds
(bus/kv/header_checks.py). `on_frames` raises nothing, whatever the frames.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bus.kv.chunk_codec import decode, transfer_digest, verify
from bus.kv.frames import Abort, Ack, Chunk, Done, End, Nack, decode_message, encode_message
from bus.kv.header_checks import MAX_CHUNK_BYTES
from bus.kv.kv_errors import KVChecksumError, KVError, KVFrameError
from bus.kv.layout import KVInfo
from bus.kv.quant import Quantizer
from bus.kv.stats import TransferResult, TransferStats

Allocate = Callable[[str, str, KVInfo, str], Any]   # (transfer_id, request_id, source info, mode) -> dst | None
Release = Callable[[str, Any], None]           # (transfer_id, dst) -> None
Reply = tuple[bytes, list[Any]]
NO_DESTINATION = "no destination for this KV"   # the reason when `allocate` returned None


@dataclass(frozen=True, slots=True)
class ReceiveConfig:
    max_nacks_per_chunk: int = 3
    transfer_timeout: float = 30.0
    remember_finished: int = 4096    # finished transfer ids kept to answer late duplicates
    # One request's KV: 64 GiB is above a 128k-token cache of a 70B model in bf16 (40 GiB); the
    # allocator, the coverage grid and the chunk table are sized from a header before any byte came.
    max_transfer_bytes: int = 2**36
    max_chunk_bytes: int = MAX_CHUNK_BYTES   # raw payload of one chunk; also sizes the socket's MAXMSGSIZE
    # A sender has at most `window` chunks unacknowledged when it sends END, so that many are
    # missing at most; a larger gap is recovered by its ACK timer, not by one END's NACK burst.
    max_nacks_per_end: int = 64


@dataclass(slots=True)
class _Inbound:
    peer: bytes
    key: tuple
    info: KVInfo
    dst: Any
    token_offset: int
    received: np.ndarray
    checksums: np.ndarray
    coverage: np.ndarray
    stats: TransferStats
    nacks: dict[int, int] = field(default_factory=dict)
    end: End | None = None
    num_queued: int = 0      # verified and acknowledged, decode not yet run


class ReceiverCore:
    def __init__(self, quantizer: Quantizer, allocate: Allocate, release: Release | None = None,
                 config: ReceiveConfig | None = None) -> None:
        self.quantizer, self.allocate = quantizer, allocate
        self.release = release or (lambda transfer_id, dst: None)
        self.config = config or ReceiveConfig()
        self._transfers: dict[str, _Inbound] = {}
        self._finished: OrderedDict[str, bool] = OrderedDict()
        self._results: deque[TransferResult] = deque()
        self._decodes: deque[tuple[_Inbound, Chunk, list[np.ndarray]]] = deque()   # verified, ACKed
        self.undecodable = 0   # messages too broken to name their transfer (the sender's timer resends)

    def pop_results(self) -> list[TransferResult]:
        results, self._results = list(self._results), deque()
        return results

    @property
    def num_active(self) -> int:
        return len(self._transfers)

    def on_frames(self, peer: bytes, frames: list[Any], now: float, *, defer_decode: bool = False) -> list[Reply]:
        replies = self._on_frames(peer, frames, now)
        return replies if defer_decode else replies + self.run_decodes(now)

    def run_decodes(self, now: float) -> list[Reply]:
        """Decode the verified chunks queued by on_frames; the replies of the transfers that completed."""
        replies: list[Reply] = []
        while self._decodes:
            inbound, chunk, arrays = self._decodes.popleft()
            transfer_id = chunk.transfer_id
            if self._transfers.get(transfer_id) is not inbound:   # failed or cancelled meanwhile
                continue
            inbound.num_queued -= 1
            try:
                inbound.stats.wire_bytes += decode(chunk, arrays, self.quantizer, inbound.dst)
            except KVError as exc:   # already acknowledged: the sender cannot resend it
                replies += self._fail(transfer_id, f"chunk {chunk.index} failed to decode: {str(exc)[:160]}", now)
                continue
            replies += self._maybe_complete(transfer_id, inbound, now)
        return replies

    def _on_frames(self, peer: bytes, frames: list[Any], now: float) -> list[Reply]:
        try:
            message, payload = decode_message(frames)
        except KVFrameError:
            self.undecodable += 1
            return []
        if isinstance(message, Chunk):
            return self._on_chunk(peer, message, payload, now)
        if isinstance(message, End):
            return self._on_end(peer, message, now)
        if isinstance(message, Abort):
            return self._on_abort(peer, message, now)
        self.undecodable += 1  # replies are not for a receiver
        return []

    def _on_chunk(self, peer: bytes, chunk: Chunk, payload: list[Any], now: float) -> list[Reply]:
        if chunk.transfer_id in self._finished:
            return [self._late_reply(peer, chunk.transfer_id, chunk.index)]
        known = self._transfers.get(chunk.transfer_id)
        inbound = known if known is not None else self._open(peer, chunk, now)
        if isinstance(inbound, str):   # refused: the reason
            return [self._done_reply(peer, chunk.transfer_id, False, inbound, None)]
        if inbound.peer != peer:   # answered to that peer: the owner's NACK budget is not its to spend
            inbound.stats.rejected += 1
            return [(peer, encode_message(Nack(chunk.transfer_id, chunk.index, "chunk from another peer")))]
        if reason := self._over_bounds(chunk):
            return self._fail(chunk.transfer_id, reason, now)
        if chunk.transfer_key() != inbound.key:
            inbound.stats.rejected += 1
            return self._nack(chunk.transfer_id, inbound, chunk.index, "header does not match the transfer", now)
        if inbound.received[chunk.index]:
            inbound.stats.duplicates += 1
            return [(peer, encode_message(Ack(chunk.transfer_id, chunk.index)))]
        spec = chunk.spec
        if inbound.coverage[spec.planes, spec.tokens].any():
            inbound.stats.rejected += 1
            return self._nack(chunk.transfer_id, inbound, chunk.index, "chunk overlaps another", now)
        try:
            arrays = verify(chunk, payload)
        except KVChecksumError:
            inbound.stats.checksum_failures += 1
            return self._nack(chunk.transfer_id, inbound, chunk.index, "checksum mismatch", now)
        except KVError as exc:
            inbound.stats.rejected += 1
            return self._nack(chunk.transfer_id, inbound, chunk.index, str(exc)[:200], now)
        inbound.received[chunk.index] = True
        inbound.checksums[chunk.index] = chunk.checksum
        inbound.coverage[spec.planes, spec.tokens] = True
        inbound.num_queued += 1
        self._decodes.append((inbound, chunk, arrays))
        return [(peer, encode_message(Ack(chunk.transfer_id, chunk.index)))]

    def _open(self, peer: bytes, chunk: Chunk, now: float) -> _Inbound | str:
        """The new transfer's state, or why it has no destination (its failed result is out)."""
        info = chunk.info
        reason = self._over_bounds(chunk)
        dst, reason = (None, reason) if reason else self._allocate(chunk)
        stats = TransferStats(chunk.transfer_id, chunk.request_id, chunk.mode, "", chunk.num_chunks,
                              info.nbytes, started_at=now)
        if dst is None:
            self._finish(chunk.transfer_id, None, False, reason, stats, now, 0)
            return reason
        inbound = _Inbound(peer, chunk.transfer_key(), info, dst, chunk.token_offset,
                           np.zeros(chunk.num_chunks, bool), np.zeros(chunk.num_chunks, np.uint64),
                           np.zeros((info.num_planes, info.num_tokens), bool), stats)
        self._transfers[chunk.transfer_id] = inbound
        return inbound

    def _allocate(self, chunk: Chunk) -> tuple[Any, str]:
        """(the destination, "") or (None, why there is none)."""
        try:
            dst = self.allocate(chunk.transfer_id, chunk.request_id, chunk.info, chunk.mode)
        except Exception as exc:  # the engine's allocator failing must not kill the data plane
            return None, f"the allocator failed: {type(exc).__name__}: {exc}"[:200]
        return dst, "" if dst is not None else NO_DESTINATION

    def _over_bounds(self, chunk: Chunk) -> str:
        """Why this chunk's transfer is too large for this receiver ("" when it is not)."""
        if chunk.info.nbytes > self.config.max_transfer_bytes:
            return f"KV too large: {chunk.info.nbytes} bytes, max_transfer_bytes is {self.config.max_transfer_bytes}"
        raw_bytes = sum(f.raw_len for f in chunk.frames)
        if raw_bytes > self.config.max_chunk_bytes:
            return f"chunk too large: {raw_bytes} bytes, max_chunk_bytes is {self.config.max_chunk_bytes}"
        return ""

    def _nack(self, transfer_id: str, inbound: _Inbound, index: int, reason: str, now: float) -> list[Reply]:
        count = inbound.nacks.get(index, 0) + 1
        inbound.nacks[index] = count
        if count > self.config.max_nacks_per_chunk:
            return self._fail(transfer_id, f"chunk {index} rejected {count} times: {reason}", now)
        inbound.stats.nacks += 1
        return [(inbound.peer, encode_message(Nack(transfer_id, index, reason)))]

    def _on_end(self, peer: bytes, end: End, now: float) -> list[Reply]:
        if end.transfer_id in self._finished:
            return [self._late_reply(peer, end.transfer_id, None)]
        inbound = self._transfers.get(end.transfer_id)
        if inbound is None or inbound.peer != peer:
            return []  # no chunk arrived yet: the sender's ACK timer resends them
        if (end.request_id, end.num_chunks, end.raw_bytes) != (inbound.key[0], inbound.key[5], inbound.info.nbytes):
            inbound.stats.rejected += 1
            return self._fail(end.transfer_id, "END does not match the transfer", now)
        inbound.end = end
        missing = np.flatnonzero(~inbound.received)[: self.config.max_nacks_per_end]
        replies: list[Reply] = []
        for index in missing.tolist():
            replies += self._nack(end.transfer_id, inbound, index, "missing", now)
            if end.transfer_id not in self._transfers:
                return replies
        return replies + self._maybe_complete(end.transfer_id, inbound, now)

    def _maybe_complete(self, transfer_id: str, inbound: _Inbound, now: float) -> list[Reply]:
        if inbound.end is None or inbound.num_queued or not inbound.received.all():
            return []
        if not inbound.coverage.all():
            return self._fail(transfer_id, "chunks do not cover the KV", now)
        if transfer_digest(inbound.checksums) != inbound.end.digest:
            inbound.stats.checksum_failures += 1
            return self._fail(transfer_id, "transfer digest mismatch", now)
        del self._transfers[transfer_id]
        self._finish(transfer_id, inbound.dst, True, "", inbound.stats, now, inbound.token_offset)
        return [self._done_reply(inbound.peer, transfer_id, True, "", inbound.stats)]

    def _on_abort(self, peer: bytes, abort: Abort, now: float) -> list[Reply]:
        inbound = self._transfers.get(abort.transfer_id)
        if inbound is None or inbound.peer != peer:
            return []
        self._fail(abort.transfer_id, f"aborted by sender: {abort.reason}", now, reply=False)
        return []

    def cancel(self, transfer_id: str, now: float, reason: str = "cancelled") -> list[Reply]:
        """The local caller gave up on a transfer (request aborted): drop it, free its buffer."""
        if transfer_id not in self._transfers:
            return []
        return self._fail(transfer_id, reason, now)

    def poll(self, now: float) -> list[Reply]:
        replies: list[Reply] = []
        for transfer_id, inbound in list(self._transfers.items()):
            if now - inbound.stats.started_at > self.config.transfer_timeout:
                replies += self._fail(transfer_id, f"timed out after {self.config.transfer_timeout:.1f} s", now)
        return replies

    def _fail(self, transfer_id: str, reason: str, now: float, reply: bool = True) -> list[Reply]:
        inbound = self._transfers.pop(transfer_id)
        self.release(transfer_id, inbound.dst)
        self._finish(transfer_id, None, False, reason, inbound.stats, now, inbound.token_offset)
        return [self._done_reply(inbound.peer, transfer_id, False, reason, inbound.stats)] if reply else []

    def _finish(self, transfer_id: str, dst: Any, ok: bool, reason: str, stats: TransferStats,
                now: float, token_offset: int) -> None:
        stats.finished_at = now
        self._finished[transfer_id] = ok
        while len(self._finished) > self.config.remember_finished:
            self._finished.popitem(last=False)
        self._results.append(TransferResult(transfer_id, stats.request_id, ok, dst if ok else None,
                                            token_offset, reason, stats))

    def _late_reply(self, peer: bytes, transfer_id: str, index: int | None) -> Reply:
        if self._finished[transfer_id] and index is not None:
            return (peer, encode_message(Ack(transfer_id, index)))
        ok = self._finished[transfer_id]
        return self._done_reply(peer, transfer_id, ok, "" if ok else "transfer already failed", None)

    @staticmethod
    def _done_reply(peer: bytes, transfer_id: str, ok: bool, reason: str, stats: TransferStats | None) -> Reply:
        failures, rejected = (stats.checksum_failures, stats.rejected) if stats else (0, 0)
        return (peer, encode_message(Done(transfer_id, ok, reason[:200], failures, rejected)))
