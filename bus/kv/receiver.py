"""The asyncio shell of the KV receiver (decode side): a ROUTER that prefill nodes connect to.

Contract:
    receiver = KVReceiver(allocate=None, release=None, quantizer=None, config=ReceiveConfig(),
                          bind="tcp://127.0.0.1:0", advertise="")
    endpoint = await receiver.start()        # advertise this in READY: `advertise`, or the bound address
    result = await receiver.result(transfer_id, timeout=None)  -> TransferResult (ok or failed)
    async for result in receiver.results():  # or: every result, in completion order
    receiver.cancel(transfer_id)             # the request was aborted: drop it, free its buffer
    await receiver.close()
`allocate(transfer_id, request_id, info, mode) -> dst | None` returns the engine's preallocated
buffer for the KV (numpy, or torch through the torch quantizer), or for a `raw` transfer a
`bus.kv.pieces.RawPieces(info)` that keeps the verified frames without copying them; None when it
has no room (the transfer is refused). A result is ok only when the whole transfer verified;
failed results were released via `release(transfer_id, dst)` and carry the reason (timeout,
retries exhausted, refused, aborted). `on_result(result)` (optional) is called for every result
as well; with it, a result nobody awaits through `result()` or `results()` is not kept for a later
`result()` call (it would hold its KV). All protocol logic lives in recv_core.ReceiverCore.
`advertise` is the address senders must dial when it is not the bound one (NAT, containers, a
proxy in front of the node, a 0.0.0.0 bind); the port of a `:0` bind is only known after binding,
so an advertised endpoint names its own port.
`security=SecurityConfig` (optional): the ROUTER is a CURVE server on its own context with a ZAP
`Gatekeeper` admitting only keys admitted as `prefill`/`both` (the only roles that send KV); the
advertised endpoint carries this node's public key (`...;curve=<hex>`) for senders to check.
`metrics` counts refusals: `refused.no_destination` (KV for a transfer nobody planned: forged,
late or cancelled) and the Gatekeeper's `zap.denied`; and `errors.message` / `errors.tick`:
messages (or timer rounds) whose handling raised something unexpected. Such an error is logged
with the message's transfer id and the loop goes on: no message, however malformed, ends the read
loop. The ROUTER's MAXMSGSIZE is the largest frame a legitimate CHUNK carries
(`header_checks.max_message_bytes(config.max_chunk_bytes)`): ZeroMQ drops a peer that sends more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

import numpy as np
import zmq
import zmq.asyncio

from bus.kv.faults import FaultInjector
from bus.kv.frames import peek_transfer_id
from bus.kv.header_checks import max_message_bytes
from bus.kv.kv_errors import KVTransferTimeout
from bus.kv.layout import DTYPES, KVInfo
from bus.kv.quant import NumpyQuantizer, Quantizer
from bus.kv.recv_core import NO_DESTINATION, Allocate, ReceiveConfig, ReceiverCore, Release, Reply
from bus.kv.stats import TransferResult
from bus.log import get_logger
from bus.reactor import queued_messages
from bus.security import Gatekeeper, Principal, SecurityConfig, apply_server, with_server_key

log = get_logger("kv.receiver")
POLL_INTERVAL = 0.1
MAX_DRAIN = 64   # messages taken in one go before the read loop yields to the event loop


def numpy_allocator(dtype: str | None = None) -> Allocate:
    """An allocator of fresh numpy arrays in `dtype` (default: the sender's dtype), whatever the mode."""
    def allocate(transfer_id: str, request_id: str, info: KVInfo, mode: str) -> np.ndarray:
        return np.empty(info.shape, DTYPES[dtype or info.dtype])
    return allocate


def _senders_only(security: SecurityConfig | None) -> SecurityConfig | None:
    """The same keys, narrowed to those that may send KV (prefill and colocated nodes)."""
    if security is None:
        return None
    senders = {key: Principal(p.name, p.roles) for key, p in security.admitted.items()
               if p.roles & {"prefill", "both"}}
    return SecurityConfig(security.public_key, security.secret_key, security.server_key, senders)


class KVReceiver:
    def __init__(self, allocate: Allocate | None = None, release: Release | None = None, *,
                 quantizer: Quantizer | None = None, config: ReceiveConfig | None = None,
                 bind: str = "tcp://127.0.0.1:0", advertise: str = "", faults: FaultInjector | None = None,
                 on_result: Callable[[TransferResult], None] | None = None,
                 context: zmq.asyncio.Context | None = None, security: SecurityConfig | None = None) -> None:
        self.security = _senders_only(security)
        self.core = ReceiverCore(quantizer or NumpyQuantizer(), allocate or numpy_allocator(), release, config)
        self.bind, self.advertise, self.faults, self.on_result = bind, advertise, faults, on_result
        # ZAP is per context: a CURVE receiver owns its context, so its Gatekeeper is the only one.
        self._context = zmq.asyncio.Context() if security else (context or zmq.asyncio.Context.instance())
        self.gatekeeper: Gatekeeper | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._polled: zmq.Socket | None = None
        self._tasks: list[asyncio.Task] = []
        self._waiters: dict[str, asyncio.Future] = {}
        self._unclaimed: OrderedDict[str, TransferResult] = OrderedDict()
        self._stream: asyncio.Queue[TransferResult] | None = None
        self.endpoint = ""
        self.num_refused = 0
        self.num_errors = {"message": 0, "tick": 0}

    async def start(self) -> str:
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes(self.core.config.max_chunk_bytes))
        if self.security is not None:
            self.gatekeeper = Gatekeeper.started(self._context, self.security)
            apply_server(self._socket, self.security)
        self._socket.bind(self.bind)
        self._polled = zmq.Socket.shadow(self._socket.underlying)   # the same socket, synchronous
        self.endpoint = self.advertise or self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.security is not None:
            self.endpoint = with_server_key(self.endpoint, self.security.public_key)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read()), loop.create_task(self._tick())]
        return self.endpoint

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        socket, polled = self._socket, self._polled
        assert socket is not None and polled is not None   # start() opened them before this task
        while True:
            self._handle(await socket.recv_multipart(copy=False), loop.time())
            # Take what is already queued without a future per message. Bounded, then a yield:
            # an await on a socket with a message waiting completes without yielding, so a sender
            # that never pauses would otherwise starve this loop's other tasks (timers, results).
            num_taken = 0
            for frames in queued_messages(polled, MAX_DRAIN, copy=False):
                self._handle(frames, loop.time())
                num_taken += 1
            if num_taken == MAX_DRAIN:
                await asyncio.sleep(0)

    def _handle(self, frames: list[zmq.Frame], now: float) -> None:
        # The one guard of the read loop: the core raises nothing by contract, and this keeps a
        # breach of it (or of the allocator's, the quantizer's) to the message that caused it.
        try:
            self._on_message(frames, now)
        except Exception as exc:
            self._count_error("message", exc, peek_transfer_id(frames[1]) if len(frames) > 1 else "")

    def _count_error(self, where: str, exc: Exception, transfer_id: str = "") -> None:
        self.num_errors[where] += 1
        log.error(f"kv_{where}_failed", transfer_id=transfer_id, error=f"{type(exc).__name__}: {exc}"[:300],
                  count=self.num_errors[where], exc_info=True)

    def _on_message(self, frames: list[zmq.Frame], now: float) -> None:
        if len(frames) < 2:
            return
        undecodable = self.core.undecodable
        # ACK a verified chunk before decoding it: the sender's credit comes back a decode sooner.
        replies = self.core.on_frames(frames[0].bytes, frames[1:], now, defer_decode=True)
        if self.core.undecodable > undecodable:   # too broken to name its transfer: its timer resends
            log.warning("kv_undecodable", count=self.core.undecodable)
        self._dispatch(replies)
        self._dispatch(self.core.run_decodes(now))

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            try:   # a failing release callback must not stop every later timeout
                self._dispatch(self.core.poll(loop.time()))
            except Exception as exc:
                self._count_error("tick", exc)

    def _dispatch(self, replies: list[Reply]) -> None:
        # Synchronous sends: a ROUTER never blocks on send (it drops a message for a peer whose
        # pipe is full, and the sender's timer resends), and a reply is a header frame.
        for peer, reply in replies:
            frames = reply if self.faults is None else self.faults.apply(reply)
            if frames is not None:   # else dropped by the fault injector
                self._started_socket().send_multipart([peer, *frames])
        for result in self.core.pop_results():
            self._deliver(result)

    @property
    def metrics(self) -> dict[str, int]:
        counts = dict(self.gatekeeper.metrics) if self.gatekeeper else {}
        counts["refused.no_destination"] = self.num_refused
        counts.update({f"errors.{where}": count for where, count in self.num_errors.items()})
        return counts

    def _deliver(self, result: TransferResult) -> None:
        if result.reason == NO_DESTINATION:
            self.num_refused += 1
        log.log(20 if result.ok else 30, "kv_received" if result.ok else "kv_receive_failed",
                transfer_id=result.transfer_id, request_id=result.request_id, ok=result.ok, reason=result.reason,
                raw_bytes=result.stats.raw_bytes, wire_bytes=result.stats.wire_bytes,
                checksum_failures=result.stats.checksum_failures, rejected=result.stats.rejected,
                nacks=result.stats.nacks)
        if self.on_result is not None:
            self.on_result(result)
        if self._stream is not None:
            self._stream.put_nowait(result)
            return
        waiter = self._waiters.pop(result.transfer_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)
            return
        if self.on_result is not None:   # the callback owns the results: keeping them would hold their KV
            return
        self._unclaimed[result.transfer_id] = result
        while len(self._unclaimed) > self.core.config.remember_finished:
            self._unclaimed.popitem(last=False)

    async def results(self) -> AsyncIterator[TransferResult]:
        """Every result from now on (ok or failed), in completion order; use this or `result()`."""
        self._stream = asyncio.Queue()
        while True:
            yield await self._stream.get()

    async def result(self, transfer_id: str, timeout: float | None = None) -> TransferResult:
        """Wait for one transfer's result; KVTransferTimeout (and the transfer dropped) on timeout."""
        if transfer_id in self._unclaimed:
            return self._unclaimed.pop(transfer_id)
        waiter = self._waiters.setdefault(transfer_id, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            self._waiters.pop(transfer_id, None)
            self.cancel(transfer_id, "timed out waiting for the KV")
            raise KVTransferTimeout(transfer_id, f"no KV within {timeout} s") from None

    def cancel(self, transfer_id: str, reason: str = "cancelled") -> None:
        """Drop an in-flight transfer (idempotent); the sender is told with DONE(ok=False)."""
        replies = self.core.cancel(transfer_id, asyncio.get_running_loop().time(), reason)
        for peer, frames in replies:
            self._started_socket().send_multipart([peer, *frames])  # a ROUTER never blocks on send
        for result in self.core.pop_results():
            self._unclaimed.pop(result.transfer_id, None)
            if self.on_result is not None:
                self.on_result(result)

    def _started_socket(self) -> zmq.Socket:
        """The synchronous shadow of the data socket, for replies (a ROUTER never blocks on send)."""
        if self._polled is None:
            raise RuntimeError("the KV receiver is not started")
        return self._polled

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._socket is not None:
            self._socket.close(linger=0)
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
