"""Where the vLLM engine adapter and `PdbusConnector` hand KV to each other, inside one process.

vLLM builds its KV connector itself (from `--kv-transfer-config`), so the adapter cannot pass it
objects; both sides meet here instead, keyed by a pdbus KV key that travels inside the request's
`kv_transfer_params` (vLLM rewrites request ids, the params survive). This is why pdbus runs vLLM
in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one worker): the connector's worker half runs in the
node's process and the mailbox is a plain object. No torch or vLLM here.

Contract (all methods thread-safe):
- consumer side: `offer(key, kv)` before the request is added; the connector's scheduler half asks
  `num_offered_tokens(key)`; its worker half `take_offer(key)` when it injects, or reports
  `fail(key, reason)` when the KV does not fit (vLLM then recomputes those tokens).
  `withdraw(key)` drops an offer that was never taken (abort).
- producer side: the worker half `capture(key, kv)` once a prompt's prefill is complete; the adapter
  `take_capture(key)` after the request finishes.
- `stats` counts offers, injections, failures and captures (tests and logs read it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

KV_KEY_PARAM = "pdbus_kv_key"          # in vLLM's kv_transfer_params: the mailbox key
CAPTURE_PARAM = "pdbus_capture"        # in vLLM's kv_transfer_params: producer should capture


@dataclass(slots=True)
class MailboxStats:
    num_offered: int = 0
    num_injected: int = 0
    num_injected_tokens: int = 0
    num_load_failures: int = 0
    num_captured: int = 0
    num_captured_tokens: int = 0


class KvMailbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offers: dict[str, Any] = {}
        self._captures: dict[str, Any] = {}
        self._failures: dict[str, str] = {}
        self.stats = MailboxStats()

    # ---- consumer (decode) side ------------------------------------------------------------------
    def offer(self, key: str, kv: Any) -> None:
        with self._lock:
            self._offers[key] = kv
            self._failures.pop(key, None)
            self.stats.num_offered += 1

    def num_offered_tokens(self, key: str | None) -> int:
        with self._lock:
            kv = self._offers.get(key) if key else None
            return 0 if kv is None else int(kv.shape[3])

    def take_offer(self, key: str) -> Any | None:
        with self._lock:
            kv = self._offers.pop(key, None)
            if kv is not None:
                self.stats.num_injected += 1
                self.stats.num_injected_tokens += int(kv.shape[3])
            return kv

    def fail(self, key: str, reason: str) -> None:
        with self._lock:
            self._offers.pop(key, None)
            self._failures[key] = reason
            self.stats.num_load_failures += 1

    def failure(self, key: str) -> str | None:
        with self._lock:
            return self._failures.get(key)

    def withdraw(self, key: str) -> None:
        with self._lock:
            self._offers.pop(key, None)
            self._captures.pop(key, None)
            self._failures.pop(key, None)

    # ---- producer (prefill) side -----------------------------------------------------------------
    def capture(self, key: str, kv: Any) -> None:
        with self._lock:
            self._captures[key] = kv
            self.stats.num_captured += 1
            self.stats.num_captured_tokens += int(kv.shape[3])

    def take_capture(self, key: str) -> Any | None:
        with self._lock:
            return self._captures.pop(key, None)

    def num_pending(self) -> int:
        with self._lock:
            return len(self._offers) + len(self._captures)


MAILBOX = KvMailbox()   # the process's one mailbox: vLLM's connector and the adapter both use it
