"""A TCP proxy the harness controls, placed between one node and the broker to partition them.

Contract: `proxy = PartitionProxy(target_port).start()` listens on `proxy.port` (loopback) and
forwards every connection to 127.0.0.1:target_port, on its own asyncio thread.
`proxy.cut()`: a silent partition — bytes in both directions are swallowed, connections stay
open (like a network that drops packets: no RST, so only the heartbeats can tell).
`proxy.heal()`: closes the connections that saw the cut (their byte streams have holes, so
ZeroMQ must reconnect from scratch) and forwards again. `proxy.stop()` closes everything.
A broker restarted on its port is reached again through the same proxy (new connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class PartitionProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut_active = False
        self.num_connections = 0
        self.num_bytes_swallowed = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="chaos-proxy")
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def start(self) -> PartitionProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, family=socket.AF_INET)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        for each in (writer, up_writer):
            self._writers.discard(each)
            each.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.cut_active:
                self.num_bytes_swallowed += len(data)
                continue
            writer.write(data)
            await writer.drain()
        writer.close()

    def cut(self) -> None:
        self.cut_active = True

    def heal(self) -> None:
        async def reset() -> None:
            for writer in list(self._writers):
                writer.close()
            self._writers.clear()
            self.cut_active = False
        self._call(reset())

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
        with contextlib.suppress(Exception):
            self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
