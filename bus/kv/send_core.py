"""Sans-I/O sender of one KV transfer: credits, acknowledgements, resends, timeouts.

Contract: `SendTransfer(encoder, config, now)`; the shell repeatedly calls `next_frames(now)` and
puts each returned frame list on the wire until it returns None, feeds every reply to
`on_message(message, now)`, and calls `poll(now)` at `next_deadline()`. Chunks are encoded lazily,
one at a time, when a credit is free, so encoding chunk k+1 overlaps the socket sending chunk k.
At most `window` chunks are unacknowledged (credit-based flow control); their encoded buffers stay
untouched until acknowledged so a NACK or a timeout resends them without re-encoding.
A chunk whose KV is still being computed (`ChunkEncoder.ready`) is not encoded yet: `next_frames`
returns None and `waiting_for` names it, so the shell waits for it (`when_ready`) without blocking
its loop; ACKs, resends and timeouts go on meanwhile, and the transfer timeout covers the wait.
Each chunk is sent at most `max_attempts` times; past that, or past `transfer_timeout`, or on a
DONE(ok=False), the transfer fails closed (`failed` / `reason`). DONE(ok=True) completes it.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bus.kv.chunk_codec import ChunkEncoder
from bus.kv.frames import Abort, Ack, Chunk, Done, End, Message, Nack, encode_message
from bus.kv.stats import TransferStats


@dataclass(frozen=True, slots=True)
class SendConfig:
    window: int = 4                  # unacknowledged chunks in flight (credits)
    ack_timeout: float = 2.0         # no ACK for this long: resend what is in flight
    max_attempts: int = 4            # sends per chunk (and per END) before failing closed
    transfer_timeout: float = 30.0   # the whole transfer, from its first chunk


class BufferPool:
    """Reuses encode buffers across transfers: writing into reused pages is ~3x faster than fresh."""

    def __init__(self, max_sets: int = 16) -> None:
        self._free: dict[tuple[int, ...], list[list[np.ndarray]]] = {}
        self.max_sets = max_sets

    def take(self, sizes: tuple[int, ...], count: int) -> list[list[np.ndarray]]:
        free = self._free.setdefault(sizes, [])
        return [free.pop() if free else [np.empty(n, np.uint8) for n in sizes] for _ in range(count)]

    def give(self, sizes: tuple[int, ...], buffers: list[list[np.ndarray]]) -> None:
        free = self._free.setdefault(sizes, [])
        free.extend(buffers[: max(0, self.max_sets - len(free))])


class SendState(enum.Enum):
    SENDING = "sending"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class _InFlight:
    header: Chunk
    wire: list[Any]
    slot: int
    sent_at: float
    attempts: int
    nacked: bool = False


class SendTransfer:
    def __init__(self, encoder: ChunkEncoder, config: SendConfig, now: float,
                 pool: BufferPool | None = None) -> None:
        self.encoder, self.config = encoder, config
        self.state = SendState.SENDING
        self.reason = ""
        self.stats = TransferStats(encoder.transfer_id, encoder.request_id, encoder.mode, encoder.compression,
                                   encoder.num_chunks, encoder.info.nbytes, started_at=now)
        self._pool = pool or BufferPool()
        self._sizes = tuple(encoder.buffer_sizes())
        self._buffers = self._pool.take(self._sizes, config.window)
        self._free_slots = deque(range(config.window))
        self._in_flight: dict[int, _InFlight] = {}
        self._resend: deque[int] = deque()
        self._next_index = 0
        self._acked = 0
        self._end_sent_at: float | None = None
        self._end_attempts = 0
        self._end_due = False

    @property
    def transfer_id(self) -> str:
        return self.encoder.transfer_id

    @property
    def finished(self) -> bool:
        return self.state is not SendState.SENDING

    @property
    def waiting_for(self) -> int | None:
        """The chunk the transfer would send next but whose KV is not computed yet, or None."""
        index = self._next_index
        if (self.finished or self._resend or not self._free_slots or index >= self.encoder.num_chunks
                or self.encoder.ready(index)):
            return None
        return index

    def next_frames(self, now: float) -> list[Any] | None:
        """The next message to send now, or None until a reply or a timer frees something."""
        if self.finished:
            return None
        if self._resend:
            return self._send_again(self._resend.popleft(), now)
        if self._free_slots and self._next_index < self.encoder.num_chunks:
            if not self.encoder.ready(self._next_index):
                return None   # its KV is still being computed: `waiting_for`
            return self._send_new(now)
        if self._next_index == self.encoder.num_chunks and (self._end_sent_at is None or self._end_due):
            return self._send_end(now)
        return None

    def _send_new(self, now: float) -> list[Any]:
        index, slot = self._next_index, self._free_slots.popleft()
        self._next_index += 1
        header, wire = self.encoder.encode(index, self._buffers[slot])
        self._in_flight[index] = _InFlight(header, wire, slot, now, 1)
        self.stats.wire_bytes += sum(f.wire_len for f in header.frames)
        self.stats.compressed_frames += sum(f.codec != "none" for f in header.frames)
        self.stats.stored_frames += sum(f.codec == "none" for f in header.frames)
        return encode_message(header, wire)

    def _send_again(self, index: int, now: float) -> list[Any] | None:
        flight = self._in_flight.get(index)
        if flight is None:  # acknowledged meanwhile
            return self.next_frames(now)
        if flight.attempts >= self.config.max_attempts:
            if not flight.nacked:  # never answered at all: the receiver is gone or unreachable
                self._fail(f"timed out: chunk {index} unacknowledged after {flight.attempts} attempts")
            else:
                self._fail(f"chunk {index} not accepted after {flight.attempts} attempts")
            return None
        flight.attempts += 1
        flight.sent_at = now
        self.stats.resends += 1
        return encode_message(replace(flight.header, attempt=flight.attempts - 1), flight.wire)

    def _send_end(self, now: float) -> list[Any] | None:
        if self._end_attempts >= self.config.max_attempts:
            self._fail(f"timed out: no DONE after {self._end_attempts} ENDs")
            return None
        if self._end_attempts:
            self.stats.resends += 1
        self._end_attempts += 1
        self._end_sent_at, self._end_due = now, False
        end = End(self.transfer_id, self.encoder.request_id, self.encoder.num_chunks,
                  self.encoder.info.nbytes, self.encoder.digest())
        return encode_message(end)

    def on_message(self, message: Message, now: float) -> None:
        if self.finished or getattr(message, "transfer_id", None) != self.transfer_id:
            return
        if isinstance(message, Ack):
            self._on_ack(message.index, now)
        elif isinstance(message, Nack):
            self._on_nack(message, now)
        elif isinstance(message, Done):
            self._on_done(message, now)

    def _on_ack(self, index: int, now: float) -> None:
        flight = self._in_flight.pop(index, None)
        if flight is not None:
            self._free_slots.append(flight.slot)
            self._acked += 1

    def _on_nack(self, message: Nack, now: float) -> None:
        self.stats.nacks += 1
        if message.index == -1:
            self._end_due = True
        elif message.index in self._in_flight:
            self._in_flight[message.index].nacked = True
            if message.index not in self._resend:
                self._resend.append(message.index)

    def _on_done(self, message: Done, now: float) -> None:
        self.stats.checksum_failures = message.checksum_failures
        self.stats.rejected = message.rejected
        self.stats.finished_at = now
        if message.ok:
            self.state = SendState.DONE
            self._pool.give(self._sizes, self._buffers)  # the receiver has every byte: safe to reuse
            self._release()
        else:
            self._fail(f"receiver failed the transfer: {message.reason}")

    def poll(self, now: float) -> None:
        """Timers: resend what waited too long for an ACK/DONE; fail past the transfer timeout."""
        if self.finished:
            return
        if now - self.stats.started_at > self.config.transfer_timeout:
            self._fail(f"timed out after {self.config.transfer_timeout:.1f} s")
            return
        for index, flight in self._in_flight.items():
            if now - flight.sent_at >= self.config.ack_timeout and index not in self._resend:
                self._resend.append(index)
        if (not self._in_flight and self._end_sent_at is not None
                and now - self._end_sent_at >= self.config.ack_timeout):
            self._end_due = True

    def next_deadline(self) -> float | None:
        if self.finished:
            return None
        times = [f.sent_at for f in self._in_flight.values()]
        if self._end_sent_at is not None:
            times.append(self._end_sent_at)
        timer = min(times) + self.config.ack_timeout if times else float("inf")
        return min(timer, self.stats.started_at + self.config.transfer_timeout)

    def abort(self, reason: str, now: float) -> list[Any]:
        """Cancel: fail locally and return the ABORT message that tells the receiver to drop it."""
        self._fail(f"aborted: {reason}")
        self.stats.finished_at = now
        return encode_message(Abort(self.transfer_id, reason[:200]))

    @property
    def timed_out(self) -> bool:
        return self.state is SendState.FAILED and self.reason.startswith("timed out")

    def _fail(self, reason: str) -> None:
        if not self.finished:
            self.state, self.reason = SendState.FAILED, reason
            self._release()

    def _release(self) -> None:
        self._in_flight.clear()
        self._resend.clear()
        self._buffers = []
