"""The asyncio shell of the KV sender (prefill side): one DEALER per decode node's data endpoint.

Contract:
    sender = KVSender(quantizer=None, config=SendConfig(), chunk_bytes=4 MiB, link_bytes_per_s=...)
    report = await sender.send(endpoint, transfer_id, request_id, kv, mode="int8", compression="auto")
        -> TransferReport once the receiver verified every chunk; raises KVTransferFailed (or
           KVTransferTimeout) when the transfer failed closed; KVValueError for KV it cannot encode.
    await sender.abort(transfer_id, reason)   # cancel an in-flight send (the receiver frees its KV)
    await sender.close()
`link_bytes_per_s` is the speed of the network to the decode nodes (`[kv] link_gbit` on a node):
`auto` compression weighs each chunk's compression against it.
`kv` is whatever the quantizer reads: numpy (NumpyQuantizer, the default) or torch tensors
(nodes/engines/kv_quant.TorchQuantizer). Concurrent sends share the DEALER of their endpoint; replies
are routed to transfers by transfer id. All protocol logic lives in send_core.SendTransfer.
`security=SecurityConfig` (optional): an endpoint advertised with a CURVE key (`...;curve=<hex>`,
see bus.security) is spoken to over CURVE, and only when that key is admitted as a decode node
(so KV never goes to an unknown server); with security on, an endpoint without an admitted key
is refused (KVTransferFailed) before a byte is sent.
`max_peers` / `peer_idle_s`: how many data endpoints the sender keeps connected and how long an
idle one stays (bus/kv/peers.py: a transfer in flight is never cut; with every peer busy a send to
a new endpoint fails closed). Replies are header frames: the DEALER's MAXMSGSIZE is
MAX_HEADER_BYTES, and a reply that is malformed or whose handling raises is logged, counted
(`num_bad_replies`, `num_errors`) and dropped; the reader never stops on one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import zmq
import zmq.asyncio

from bus.kv.chunk_codec import ChunkEncoder
from bus.kv.compress import AutoCompression
from bus.kv.faults import FaultInjector
from bus.kv.frames import decode_message, peek_transfer_id
from bus.kv.header_checks import MAX_HEADER_BYTES
from bus.kv.kv_errors import KVFrameError, KVTransferFailed, KVTransferTimeout
from bus.kv.layout import DEFAULT_CHUNK_BYTES
from bus.kv.link import LinkShaper, gbit
from bus.kv.peers import Connection, Peers
from bus.kv.quant import NumpyQuantizer, Quantizer
from bus.kv.send_core import BufferPool, SendConfig, SendState, SendTransfer
from bus.kv.stats import TransferReport
from bus.log import get_logger
from bus.reactor import queued_messages
from bus.security import SecurityConfig, apply_client, split_server_key

log = get_logger("kv.sender")


class KVSender:
    def __init__(self, *, quantizer: Quantizer | None = None, config: SendConfig | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, link_bytes_per_s: float = gbit(10),
                 shaper: LinkShaper | None = None, faults: FaultInjector | None = None,
                 context: zmq.asyncio.Context | None = None, security: SecurityConfig | None = None,
                 max_peers: int = 128, peer_idle_s: float = 60.0) -> None:
        self.security = security
        self.quantizer = quantizer or NumpyQuantizer()
        self.config = config or SendConfig()
        self.chunk_bytes = chunk_bytes
        self.auto = AutoCompression(link_bytes_per_s)
        self.shaper, self.faults = shaper, faults
        self._context = context or zmq.asyncio.Context.instance()
        self.peers = Peers(self._connect, max_peers, peer_idle_s)
        self._pool = BufferPool()
        self.num_bad_replies = self.num_errors = 0

    async def send(self, endpoint: str, transfer_id: str, request_id: str, kv: Any, *, mode: str = "int8",
                   compression: str = "auto", token_offset: int = 0, dtype: str | None = None) -> TransferReport:
        encoder = ChunkEncoder(kv, self.quantizer, transfer_id=transfer_id, request_id=request_id, mode=mode,
                               compression=compression, chunk_bytes=self.chunk_bytes, auto=self.auto,
                               token_offset=token_offset, dtype=dtype)
        loop = asyncio.get_running_loop()
        try:
            connection = self.peers.take(endpoint)
        except KVTransferFailed as exc:
            raise KVTransferFailed(transfer_id, exc.reason) from None
        try:   # _send_on registers the transfer before its first suspension: Peers.take's rule
            transfer = await self._send_on(connection, encoder, loop)
        finally:
            self.peers.put(endpoint, connection)   # idle from now on if it was the last transfer
        return TransferReport(transfer_id, request_id, True, "", transfer.stats)

    async def _send_on(self, connection: Connection, encoder: ChunkEncoder,
                       loop: asyncio.AbstractEventLoop) -> SendTransfer:
        transfer_id, request_id = encoder.transfer_id, encoder.request_id
        if transfer_id in connection.transfers:
            raise KVTransferFailed(transfer_id, "a transfer with this id is already in flight")
        transfer = SendTransfer(encoder, self.config, loop.time(), self._pool)
        wakeup = asyncio.Event()
        connection.transfers[transfer_id] = (transfer, wakeup)
        try:
            await self._run(connection, transfer, wakeup, loop)
        except KVTransferFailed as exc:
            log.warning("kv_send_failed", transfer_id=transfer_id, request_id=request_id, reason=exc.reason)
            raise type(exc)(transfer_id, exc.reason) from None
        finally:
            connection.transfers.pop(transfer_id, None)
        transfer.stats.finished_at = transfer.stats.finished_at or loop.time()
        if transfer.state is not SendState.DONE:
            error = KVTransferTimeout if transfer.timed_out else KVTransferFailed
            log.warning("kv_send_failed", transfer_id=transfer_id, request_id=request_id, reason=transfer.reason)
            raise error(transfer_id, transfer.reason)
        return transfer

    async def _run(self, connection: Connection, transfer: SendTransfer, wakeup: asyncio.Event,
                   loop: asyncio.AbstractEventLoop) -> None:
        asked_for = None   # the chunk whose KV the engine's thread will tell us of
        while not transfer.finished:
            while (frames := transfer.next_frames(loop.time())) is not None:
                await self._put(connection, frames, loop)
            if transfer.finished:
                return
            wakeup.clear()
            waiting_for = transfer.waiting_for
            if waiting_for is not None and waiting_for != asked_for:   # its KV is being computed
                asked_for = waiting_for
                transfer.encoder.when_ready(waiting_for, functools.partial(_wake_from_any_thread, loop, wakeup))
            # A timer handle rather than asyncio.wait_for: no task and no timeout context per wait,
            # and a transfer of a few chunks waits for credits several times.
            timer = loop.call_at(transfer.next_deadline() or loop.time(), wakeup.set)
            try:
                await wakeup.wait()
            finally:
                timer.cancel()
            transfer.poll(loop.time())

    async def _put(self, connection: Connection, message: list[Any], loop: asyncio.AbstractEventLoop) -> None:
        frames = message if self.faults is None else self.faults.apply(message)
        if frames is None:   # dropped by the fault injector
            return
        if self.shaper is None:
            try:   # the common case, without a future and a timeout for each chunk
                connection.polled.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                await self._send_waiting(connection, frames)
        else:
            # Shaped link: schedule the message on the virtual wire and go on encoding. Whatever
            # is due goes out now, between two encodes; the link task sends what falls due while
            # the loop is idle. Release times are absolute, so a late send delays one message
            # instead of shifting the whole schedule.
            nbytes = sum(len(memoryview(f).cast("B")) for f in frames)
            connection.outbox.append((self.shaper.release_time(nbytes, loop.time()), frames))
            connection.queued.set()
            if connection.link is None:
                connection.link = loop.create_task(self._drive_link(connection))
            self._send_due(connection, loop.time())
        # Take the ACKs that arrived while this chunk encoded: encoding the next chunk first would
        # hold them back a whole encode and stall the credit window.
        self._read_ready(connection, loop.time())
        await asyncio.sleep(0)

    async def _send_waiting(self, connection: Connection, frames: list[Any]) -> None:
        # A DEALER with no live pipe (the peer refused our CURVE key, or is gone) blocks a send
        # for ever: bound it by the transfer's own timeout so the transfer fails closed.
        try:
            await asyncio.wait_for(connection.socket.send_multipart(frames, copy=False), self.config.transfer_timeout)
        except TimeoutError:
            raise KVTransferTimeout("", "the data endpoint accepts nothing (unreachable, or "
                                        "it refused our key)") from None

    @staticmethod
    def _send_due(connection: Connection, now: float) -> None:
        while connection.outbox and connection.outbox[0][0] <= now:
            connection.socket.send_multipart(connection.outbox.popleft()[1], copy=False)

    async def _drive_link(self, connection: Connection) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not connection.outbox:
                connection.queued.clear()
                await connection.queued.wait()
                continue
            delay = connection.outbox[0][0] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._send_due(connection, loop.time())
            self._read_ready(connection, loop.time())   # a send can hide the ACKs' edge from the reader

    def _connect(self, endpoint: str) -> Connection:
        """A new connection to `endpoint` (Peers opens it through this)."""
        address, server_key = split_server_key(endpoint)
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES)   # replies are header frames only
        if self.security is not None:
            self._secure(socket, self.security, address, server_key)
        socket.connect(address)
        connection = Connection(socket, zmq.Socket.shadow(socket.underlying))
        connection.reader = asyncio.get_running_loop().create_task(self._read(connection))
        return connection

    def _secure(self, socket: zmq.Socket, security: SecurityConfig, address: str,
                server_key: bytes | None) -> None:
        principal = security.principal(server_key) if server_key else None
        if principal is None or not principal.roles & {"decode", "both"}:
            socket.close(linger=0)
            why = "no CURVE key" if server_key is None else "a key not admitted as a decode node"
            raise KVTransferFailed("", f"data endpoint {address} has {why}: KV not sent")
        apply_client(socket, security, server_key)

    async def _read(self, connection: Connection) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._on_reply(connection, await connection.socket.recv_multipart(), loop.time())

    def _read_ready(self, connection: Connection, now: float) -> None:
        """Take the replies already here. A send on the socket can consume the edge of its
        (edge-triggered) descriptor, so the reader task saw ACKs only every few chunks."""
        for frames in queued_messages(connection.polled):
            self._on_reply(connection, frames, now)

    def _on_reply(self, connection: Connection, frames: list[bytes], now: float) -> None:
        # The one guard of the reader: whatever a receiver sends, its fault stays with its message.
        try:
            message, _ = decode_message(frames)
            entry = connection.transfers.get(getattr(message, "transfer_id", ""))
            if entry is not None:
                entry[0].on_message(message, now)
                entry[1].set()
        except KVFrameError:
            self.num_bad_replies += 1
            log.warning("kv_bad_reply", count=self.num_bad_replies)
        except Exception as exc:
            self.num_errors += 1
            log.error("kv_reply_failed", transfer_id=peek_transfer_id(frames[0]) if frames else "",
                      error=f"{type(exc).__name__}: {exc}"[:300], count=self.num_errors, exc_info=True)

    async def abort(self, transfer_id: str, reason: str = "cancelled") -> bool:
        """Cancel an in-flight send; its `send` raises KVTransferFailed. False if none was in flight."""
        loop = asyncio.get_running_loop()
        for connection in self.peers.connections():
            entry = connection.transfers.get(transfer_id)
            if entry is not None:
                await connection.socket.send_multipart(entry[0].abort(reason, loop.time()))
                entry[1].set()
                return True
        return False

    async def close(self) -> None:
        await self.peers.close_all()


def _wake_from_any_thread(loop: asyncio.AbstractEventLoop, wakeup: asyncio.Event) -> None:
    """Set `wakeup` on `loop` from the thread that computed a chunk's KV; a loop already closed
    (the sender shut down meanwhile) has nobody to wake, and must not fail that thread."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(wakeup.set)
