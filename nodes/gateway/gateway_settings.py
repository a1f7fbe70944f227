"""The `[gateway]` section: where to listen, what the model is called, keys, limits, timeouts.

Contract: `GatewayConfig.from_settings(settings, **overrides)` reads `[gateway]` (and
`[engine] max_model_len`, `[kv]` for the KV mode it reports); unknown keys raise
`SettingsError`, so a typo in the config never silently disables a limit. 0 turns a limit off.
`tls_cert` + `tls_key` (PEM paths, both or neither) serve HTTPS/WSS; `max_header_bytes` bounds the
request line and each header (aiohttp answers 400 past it), `max_headers` their number.
`workers` (1..MAX_WORKERS): processes serving the port (`pdbus gateway --workers N`, nodes/gateway/workers.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nodes.config_file import SettingsError, section, whole_number

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
MAX_WORKERS = 64   # gateway processes on one port; also what one shared limits table is laid out for


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = DEFAULT_MODEL_NAME
    api_keys: tuple[str, ...] = ()          # empty: no authentication
    rate_limit_rps: float = 0.0             # requests/s per API key (or client address without keys)
    rate_limit_burst: int = 20
    max_streams_per_key: int = 0            # requests in flight per key
    max_tokens_limit: int = 4096            # largest max_tokens a request may ask for
    default_max_tokens: int = 256           # when a request gives none (clipped to the context left)
    max_model_len: int = 0                  # 0: the model's own context length
    max_body_bytes: int = 1024 * 1024
    stream_buffer_tokens: int = 256         # per-stream buffer between the cluster and the socket
    stall_timeout_s: float = 30.0           # a consumer that takes nothing for this long is cut off
    send_buffer_bytes: int = 0              # kernel send buffer per connection (0: the OS autotunes it)
    ready_cache_s: float = 1.0              # /ready probes the cluster at most this often
    tls_cert: str = ""                      # PEM certificate chain: serve HTTPS/WSS (with tls_key)
    tls_key: str = ""                       # PEM private key
    max_header_bytes: int = 8190            # request line and each header field (400 past it)
    max_headers: int = 64                   # header fields per request (400 past it)
    share_prefix_cache: bool = False        # let API keys share cached prompt prefixes (else per key)
    workers: int = 1                        # processes on host:port (SO_REUSEPORT), one bus client each
    kv_mode: str = ""                       # what `X-Pdbus-KV-Mode` says for a remote plan (from [kv])

    @classmethod
    def from_settings(cls, settings: dict, **overrides: Any) -> GatewayConfig:
        values = dict(section(settings, "gateway"))
        names = {f.name for f in dataclasses.fields(cls)} - {"kv_mode"}
        unknown = sorted(set(values) - names)
        if unknown:
            raise SettingsError(f"unknown [gateway] settings: {', '.join(unknown)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "api_keys" in values:
            keys = values["api_keys"]
            if isinstance(keys, str):
                keys = [k for k in keys.split(",") if k]
            values["api_keys"] = tuple(str(k) for k in keys)
        if not values.get("max_model_len"):
            values["max_model_len"] = int(section(settings, "engine").get("max_model_len") or 0)
        values["kv_mode"] = kv_mode_name(section(settings, "kv"))
        try:
            config = cls(**values)
        except TypeError as exc:
            raise SettingsError(f"[gateway]: {exc}") from exc
        config.check()
        return config

    def check(self) -> None:
        for name in ("port", "rate_limit_burst", "max_streams_per_key", "max_tokens_limit", "default_max_tokens",
                     "max_model_len", "max_body_bytes", "stream_buffer_tokens", "send_buffer_bytes",
                     "max_header_bytes", "max_headers"):
            whole_number(getattr(self, name), f"[gateway] {name}")
        for name in ("rate_limit_rps", "stall_timeout_s", "ready_cache_s"):
            if not isinstance(getattr(self, name), int | float) or getattr(self, name) < 0:
                raise SettingsError(f"[gateway] {name} must be a number >= 0")
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or not 1 <= self.workers <= MAX_WORKERS:
            raise SettingsError(f"[gateway] workers must be a whole number in 1..{MAX_WORKERS}, got {self.workers!r}")
        if not isinstance(self.share_prefix_cache, bool):
            raise SettingsError(f"[gateway] share_prefix_cache must be true or false, got {self.share_prefix_cache!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("[gateway] tls_cert and tls_key go together: give both or neither")
        if self.max_header_bytes < 256 or self.max_headers < 8:
            raise SettingsError("[gateway] max_header_bytes must be >= 256 and max_headers >= 8")
        if self.stream_buffer_tokens < 1 or self.max_tokens_limit < 1 or self.stall_timeout_s <= 0:
            raise SettingsError("[gateway] stream_buffer_tokens, max_tokens_limit and stall_timeout_s must be > 0")


def kv_mode_name(kv: dict) -> str:
    """`int8+auto`, `raw`: the cluster's KV wire mode, as the nodes are configured."""
    quant = str(kv.get("quant", "int8"))
    compression = str(kv.get("compression", "auto"))
    return quant if compression in ("none", "") else f"{quant}+{compression}"
