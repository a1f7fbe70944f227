"""A client that stops reading: an SSE request over a raw socket with a tiny receive window, so
the gateway's writes block soon; it then reads nothing until the gateway reports it cut the
client off (`cut_off()` turns true: its `access` log line says `stalled`) or `hold_s` passes.

Contract: `await stalled_sse_stream(gateway_url, spec, progress, cut_off, hold_s) -> StreamRecord`
with `stalled=True`; `ok=True` means the gateway cut the client off within `hold_s`. The socket
work runs in a thread; everything is bounded; the socket is always closed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from harness.chaos.chaos_workload import RequestSpec
from harness.chaos.drivers import StreamRecord, request_body


def _hold(url: str, spec: RequestSpec, record: StreamRecord, hold_s: float, cut_off: Callable[[], bool]) -> None:
    address = urlsplit(url)
    body = json.dumps(request_body(spec)).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # before connect: the window stays small
        sock.settimeout(10)
        sock.connect((address.hostname, address.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: chaos\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        record.stalled = True
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            if cut_off():
                record.ok = True
                return
            time.sleep(0.1)
        record.error = f"not cut off within {hold_s:g}s"


async def stalled_sse_stream(gateway_url: str, spec: RequestSpec, progress, cut_off: Callable[[], bool],
                             hold_s: float = 45.0) -> StreamRecord:
    record = StreamRecord(f"stalled-{spec.name}", time.monotonic())
    progress.records.append(record)
    try:
        await asyncio.to_thread(_hold, gateway_url, spec, record, hold_s, cut_off)
    except OSError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        record.finished_at = time.monotonic()
    return record
