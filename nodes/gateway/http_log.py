"""What the gateway logs about HTTP requests that aiohttp itself refuses, before any handler runs.

aiohttp answers a request its parser refuses (a malformed request line or header, a line over
`max_line_size`, a bad Content-Length or chunk) with 400 and logs "Error handling request" with a
full traceback: any client could fill the log with them. Contract:
- `server_logger() -> logging.Logger`: the logger the gateway hands aiohttp (`AppRunner(logger=)`).
  A record it gets for a parser refusal (an `HttpProcessingError` with a 4xx code) becomes one
  short `malformed_http` line (client address, error class, aiohttp's message cut to
  MAX_ERROR_CHARS; no traceback), at most BURST of them and then RATE per second; the ones left
  out are counted into the next line's `num_suppressed`. Every other record (a real server error
  and its traceback) passes unchanged.
- `Throttle(rate, burst)`: a token bucket; `allow(now) -> bool`, `take_suppressed() -> int`.
"""

from __future__ import annotations

import logging
import time

from aiohttp.http_exceptions import HttpProcessingError

from bus.log import get_logger

RATE, BURST = 1.0, 10
MAX_ERROR_CHARS = 200
LOGGER_NAME = "aiohttp.server.pdbus"   # below aiohttp's own, so handlers configured for it still apply
log = get_logger("gateway")


class Throttle:
    def __init__(self, rate: float = RATE, burst: int = BURST) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.updated: float | None = None
        self.num_suppressed = 0

    def allow(self, now: float) -> bool:
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens < 1.0:
            self.num_suppressed += 1
            return False
        self.tokens -= 1.0
        return True

    def take_suppressed(self) -> int:
        num, self.num_suppressed = self.num_suppressed, 0
        return num


class ClientFaults(logging.Filter):
    """Turns aiohttp's record of a request its parser refused into one throttled short line."""

    def __init__(self, throttle: Throttle) -> None:
        super().__init__()
        self.throttle = throttle

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not (isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500):
            return True   # not the client's fault: keep the record and its traceback
        if self.throttle.allow(time.monotonic()):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
            log.info("malformed_http", remote=str(remote)[:64], status=exc.code, kind=type(exc).__name__,
                     error=str(exc.message)[:MAX_ERROR_CHARS], num_suppressed=self.throttle.take_suppressed())
        return False


def server_logger() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, ClientFaults) for f in logger.filters):
        logger.addFilter(ClientFaults(Throttle()))
    return logger
