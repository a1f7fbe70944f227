"""A stand-in for `BusClient` under a real `ClusterClient`: real `ReplyStream`s fed by a scripted
colocated decode node (plan `local`, then tokens, then FINAL), so the gateway and the cluster
client run their real code paths with no broker. It keeps the bookkeeping the real endpoint keeps
(`open`: request id -> stream, dropped on FINAL, ERROR or cancel) so tests can check that no
request leaves state behind.

`FakeBus.mode`: "ok"; "slow" (50 ms per token); "error" (ERROR `bad_request` after two tokens);
"refuse_encoding" (`stream()` raises `ProtocolError` synchronously, as `Endpoint.request` does
for a body it cannot encode). In the other modes a request the bus cannot carry (a body msgpack
cannot encode, a routing key over MAX_ID_BYTES or not UTF-8) is dropped without an answer, as an
encoding error on the endpoint's I/O thread or the broker's frame check drops it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from bus.codec import ProtocolError, pack
from bus.constants import MAX_ID_BYTES
from bus.mailbox import ReplyStream
from bus.messages import Error, Final, Partial


def _carriable(body: Any, key: str) -> bool:
    try:
        pack(body)
        return len(key.encode()) <= MAX_ID_BYTES
    except (ValueError, TypeError, OverflowError):
        return False


class FakeEndpoint:
    registered = True


class OpenStreams:
    """The endpoint's bookkeeping the fakes share: `open` streams until FINAL, ERROR or cancel,
    and the tasks that answer them."""

    def __init__(self) -> None:
        self.open: dict[str, ReplyStream] = {}
        self.tasks: set[asyncio.Task] = set()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _cancel(self, request_id: str) -> None:
        self.open.pop(request_id, None)

    def _put(self, stream: ReplyStream, message: Any) -> None:
        if stream.request_id in self.open:
            if not isinstance(message, Partial):
                self.open.pop(stream.request_id)
            stream.mailbox.put(message)


class FakeBus(OpenStreams):
    def __init__(self, mode: str = "ok") -> None:
        super().__init__()
        self.mode = mode
        self.endpoint = FakeEndpoint()
        self.sent: list[tuple[str, Any, str]] = []

    def stream(self, service: str, body: Any = None, payload: tuple = (), *, key: str = "",
               request_id: str | None = None, timeout: float | None = None) -> ReplyStream:
        if self.mode == "refuse_encoding":
            raise ProtocolError("malformed", "the body cannot be encoded")
        request_id = request_id or uuid.uuid4().hex
        stream = ReplyStream(request_id, self._cancel, timeout)
        self.open[request_id] = stream
        if not _carriable(body, key):
            return stream   # dropped: no answer ever comes
        self.sent.append((service, body, key))
        self._spawn(self._serve(stream, body))
        return stream

    async def _serve(self, stream: ReplyStream, body: dict) -> None:
        rid = stream.request_id
        self._put(stream, Partial(rid, 0, {"type": "plan", "plan": "local", "node_id": "decode-0"}))
        num_tokens = body["sampling"]["max_tokens"]
        for index in range(num_tokens):
            if self.mode == "error" and index == 2:
                self._put(stream, Error(rid, "bad_request", "the node refused it"))
                return
            await asyncio.sleep(0.05 if self.mode == "slow" else 0)
            self._put(stream, Partial(rid, index + 1, {"type": "token", "index": index, "token_id": 65,
                                                       "text": "A"}))
        self._put(stream, Final(rid, num_tokens + 1, {"type": "done", "finish_reason": "length",
                                                      "tokens": [], "timings": {}}))
