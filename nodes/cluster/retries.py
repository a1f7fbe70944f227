"""Why an attempt ended without finishing, and how long to wait before the next one (docs/CLUSTER.md,
"Failure handling"). Pure: no bus, no clock.

Contract:
- `Retry(code, message, node_id, local=, counts=, delay_s=, details=)`: raised by an attempt; the
  generation decides. `local`: ask the next attempt for `prefill: "local"`; `counts`: spends one of
  `max_retries`; `delay_s`: its own pause (None: the client's `retry_delay_s`).
- `retry_from(error, node_id)`: the `Retry` for a bus ERROR. After a node loss the broker has
  already dropped the lost node, so it goes out at once (`IMMEDIATE`, delay 0); `no_node` waits
  at least 0.5 s (a broker restart may be mid re-registration); a node's `retry_after_s` is read
  through `wire.error_details` (capped, a malformed `node_id` ignored).
- `retry_delay(retry, default_s)`: its own delay when it has one, else the default.
- `draining` (a node leaving or switching role handed the request back, or refused it before the
  broker saw its drain) goes out again after DRAIN_RETRY_S without spending a retry: the broker
  routes nothing new to a draining node, and the generation bounds the bounces (MAX_DRAIN_BOUNCES).
- `FATAL_CODES` end the request at once; `NODE_LOSS` codes count as a decode failover.
"""

from __future__ import annotations

from bus.mailbox import BusError
from nodes import wire
from nodes.wire import Code

FATAL_CODES = {Code.OVERLOADED, Code.REJECTED, Code.BAD_REQUEST, Code.MALFORMED, Code.OVERSIZED}
NODE_LOSS = {Code.NODE_LOST, Code.REQUEST_LOST, Code.KV_TIMEOUT, Code.STALLED, Code.GAP, Code.DRAINING}
NO_PREFILL_NODE_MEMORY_S = 1.0   # after `no_node` for a prefill, the client's next requests go local this long
DRAIN_RETRY_S = 0.05     # the drain's CAPACITY reaches every broker within about a message's time
MAX_DRAIN_BOUNCES = 16   # past these, a `draining` spends a retry like any failure
# The broker reports these once the node is out of its registry: nothing to wait for.
IMMEDIATE = {Code.NODE_LOST, Code.REQUEST_LOST}


class Retry(Exception):
    def __init__(self, code: str, message: str = "", node_id: str = "", *, local: bool = False,
                 counts: bool = True, delay_s: float | None = None, details: dict | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.node_id = code, message, node_id
        self.local, self.counts, self.delay_s, self.details = local, counts, delay_s, details or {}


def retry_from(error: BusError, node_id: str = "") -> Retry:
    node_id, retry_after = wire.error_details(error.details, node_id)
    delay = retry_after or None
    if error.code == Code.NO_NODE:
        delay = max(delay or 0.0, 0.5)   # maybe mid re-registration after a broker restart
    elif error.code in IMMEDIATE:
        delay = 0.0
    elif error.code == Code.DRAINING:
        delay = DRAIN_RETRY_S
    details = {} if retry_after is None else {"retry_after_s": retry_after}
    return Retry(error.code, error.message, node_id, counts=error.code != Code.DRAINING, delay_s=delay,
                 details=details)


def retry_delay(retry: Retry, default_s: float) -> float:
    """How long to wait before the retry: its own delay when it has one, else the default."""
    return default_s if retry.delay_s is None else retry.delay_s
