"""Settings of an engine node process: the config file's sections, then CLI flags, as one value.

Contract: `node_settings(args, role) -> NodeSettings`, reading `[broker]`, `[heartbeat]`, `[engine]`,
`[prefill]`, `[decode]`, `[kv]`, `[scheduler]`, `[security]`, `[node]` through `nodes.config_file` (file < env < flags).
`NodeSettings.engine_config()` is the `EngineConfig` the engine is built with. No torch here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import overload

from bus import constants as c
from bus.liveness import HeartbeatConfig
from bus.security import SecurityConfig, SecurityError, is_loopback
from nodes.bus_config import heartbeat_config, security_config
from nodes.config_file import SettingsError, load_settings, section, whole_number
from nodes.engines.base import ENGINE_KINDS, LOADER_SETTINGS, EngineConfig
from nodes.engines.engine_types import DEVICE_KV_MODES
from nodes.lending import LendSettings

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class NodeSettings:
    role: str
    broker: str
    node_id: str | None
    heartbeat: HeartbeatConfig
    model: str
    model_dir: str | None
    engine: dict = field(default_factory=dict)     # [engine] values for EngineConfig
    engine_kind: str = "torch"                     # [engine] kind / --engine: "torch" (built-in) or "vllm"
    kv_quant: str = "int8"
    kv_compression: str = "auto"
    kv_bind: str = "tcp://127.0.0.1:0"
    kv_advertise: str = ""                         # what prefill nodes dial, when not the bound address
    kv_compile: bool = True
    kv_device_codec: bool = False                  # [kv] device_codec: encode / decode KV where the engine's KV is
    kv_timeout_s: float = 30.0                     # a decode node waits this long for admitted KV
    kv_link_gbit: float = 10.0                     # network speed to the decode nodes (what `auto` compression weighs)
    kv_chunk_mib: float | None = None              # KV per chunk; None: bus.kv.layout.DEFAULT_CHUNK_BYTES
    local_suffix_tokens: int = 64
    local_prefill_max_running: int = 4             # ...prefilled on the decode node only below this many requests
    lend: LendSettings = field(default_factory=lambda: LendSettings())   # [decode] lend_*: prefill here when light
    prefill_delay_s: float = 0.0                   # test-only: sleep before each prefill pass
    step_delay_s: float = 0.0                      # test-only: sleep before each decode step
    kv_faults: int = 0                             # test-only: corrupt the first N KV chunks sent
    security: SecurityConfig | None = None         # CURVE on the bus and the KV plane ([security])
    switchable: bool = False                       # [node] switchable / --switchable: may flip prefill <-> decode
    drain_timeout_s: float = 30.0                  # [node] drain_timeout_s: running work past it is handed over

    def engine_config(self) -> EngineConfig:
        """The engine's settings; a prefill node whose KV is encoded on the device asks its engine to
        export in the wire's mode (nodes/engines/kv_export.py)."""
        export = self.kv_device_codec and self.role == "prefill" and self.kv_quant in DEVICE_KV_MODES
        return EngineConfig.from_dict(self.engine | ({"kv_export": self.kv_quant} if export else {}))


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", help="stable node id (default: ROLE-<random>)")
    parser.add_argument("--broker", help="broker endpoint (default: [broker] endpoint)")
    parser.add_argument("--model", help="model spec: the packaged default, 'tiny', an HF folder or a .gguf")
    parser.add_argument("--model-dir", help="model cache directory")
    parser.add_argument("--engine", choices=ENGINE_KINDS,
                        help="engine: the built-in torch one, or vLLM in-process (make install-vllm; docs/VLLM.md)")
    parser.add_argument("--dtype", help="engine dtype (default: [engine] dtype)")
    parser.add_argument("--device", help="engine device: cpu, cuda or cuda:N (default: [engine] device)")
    parser.add_argument("--threads", type=int, help="torch threads (default: [engine] num_threads)")
    parser.add_argument("--kv-quant", choices=["raw", "bf16", "int8", "int8_sym"], help="KV mode on the wire")
    parser.add_argument("--kv-compression", choices=["auto", "lz4", "zstd", "none"])
    parser.add_argument("--kv-bind", help="KV data endpoint to bind (decode side)")
    parser.add_argument("--kv-advertise", help="KV data endpoint prefill nodes dial (default: the bound one)")
    parser.add_argument("--key", help="CURVE key pair name in [security] key_dir (default: the role)")
    parser.add_argument("--heartbeat-ms", type=int, help="heartbeat interval in milliseconds")
    parser.add_argument("--heartbeat-idle-ms", type=int,
                        help="heartbeat interval of a serving node's link with no request (default 1000)")
    parser.add_argument("--liveness", type=int, help="missed heartbeats before the broker is dead")
    parser.add_argument("--switchable", action="store_true", default=None,
                        help="load both works so a CONTROL can switch prefill <-> decode (default: [node] switchable)")
    parser.add_argument("--drain-timeout-s", type=float,
                        help="a drain hands running requests over after this long (default: [node] drain_timeout_s, 30)")
    parser.add_argument("--test-prefill-delay-ms", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--test-step-delay-ms", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--test-kv-faults", type=int, default=0, help=argparse.SUPPRESS)


def _engine_values(settings: dict, args: argparse.Namespace, role: str) -> dict:
    values = {k: v for k, v in section(settings, "engine").items() if k not in LOADER_SETTINGS}
    prefill, decode = section(settings, "prefill"), section(settings, "decode")
    if "max_batch_tokens" in prefill and role != "decode":
        values["max_batch_tokens"] = prefill["max_batch_tokens"]
    if "max_wait_ms" in prefill:
        values["prefill_max_wait_s"] = float(prefill["max_wait_ms"]) / 1000
    if "prefix_cache_mib" in prefill and role != "decode":
        values["prefix_cache_bytes"] = whole_number(prefill["prefix_cache_mib"], "[prefill] prefix_cache_mib") << 20
    for key in ("num_kv_blocks", "max_num_seqs", "prefill_chunk_tokens", "preallocate_kv"):
        if key in decode and role != "prefill":
            values[key] = decode[key]
    if role == "decode":   # its streams wait for one chunk a step, not one per prompt it prefills
        values["step_prefill_tokens"] = _step_prefill_tokens(decode, values)
    # A role's own thread count wins over [engine]'s (e.g. a prefill node that may use the decode
    # node's idle core: docs/CLUSTER.md "Lending"); a --threads flag wins over both.
    if role in ("prefill", "decode") and "num_threads" in (own := prefill if role == "prefill" else decode):
        values["num_threads"] = own["num_threads"]
    return values | engine_flag_values(args)


def _step_prefill_tokens(decode: dict, values: dict) -> int:
    """`[decode] step_prefill_tokens`, else `[engine]`'s, else one chunk (`prefill_chunk_tokens`)."""
    default = values.get("step_prefill_tokens", values.get("prefill_chunk_tokens", EngineConfig().prefill_chunk_tokens))
    return whole_number(decode.get("step_prefill_tokens", default), "[decode] step_prefill_tokens")


ENGINE_FLAGS = (("dtype", "dtype"), ("device", "device"), ("threads", "num_threads"))   # flag -> [engine] key


def engine_flag_values(args: argparse.Namespace) -> dict:
    """The [engine] settings given as flags (`--dtype`, `--device`, `--threads`), which win over the config."""
    return {key: getattr(args, flag) for flag, key in ENGINE_FLAGS if getattr(args, flag, None)}


def _engine_kind(engine: dict, args: argparse.Namespace) -> str:
    kind = getattr(args, "engine", None) or engine.get("kind", "torch")
    if kind not in ENGINE_KINDS:
        raise SettingsError(f"[engine] kind must be one of {', '.join(ENGINE_KINDS)}, got {kind!r}")
    return kind


def node_security(settings: dict, args: argparse.Namespace, role: str, broker: str, *kv_endpoints: str
                  ) -> SecurityConfig | None:
    """CURVE when the broker or the KV data endpoint (bound or advertised) is reachable from other
    machines (or forced)."""
    exposed = next((e for e in (broker, *kv_endpoints) if e and not is_loopback(e)), broker)
    try:
        return security_config(settings, getattr(args, "key", None) or role, exposed)
    except SecurityError as exc:
        raise SettingsError(f"[security]: {exc}") from exc


def _device_codec(kv: dict, engine_kind: str, device: str) -> bool:
    """`[kv] device_codec`: "auto" (the default) encodes on the device where the built-in engine runs
    on a GPU; "on" everywhere the built-in engine runs (on a CPU only the path differs: tests), "off"
    keeps the CPU codec."""
    value = kv.get("device_codec", "auto")
    if value not in ("auto", "on", "off"):
        raise SettingsError(f'[kv] device_codec must be "auto", "on" or "off", got {value!r}')
    return engine_kind == "torch" and (value == "on" or (value == "auto" and device != "cpu"))


@overload
def _kv_size(kv: dict, key: str, unit: str, default: float) -> float: ...
@overload
def _kv_size(kv: dict, key: str, unit: str, default: None) -> float | None: ...
def _kv_size(kv: dict, key: str, unit: str, default: float | None) -> float | None:
    """A positive [kv] number of `unit`; where `default` is None, "auto" (or nothing) gives None."""
    value = kv.get(key, default)
    if value is None or (value == "auto" and default is None):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1024:
        auto = ' or "auto"' if default is None else ""
        raise SettingsError(f"[kv] {key} must be a number of {unit} in (0, 1024]{auto}, got {value!r}")
    return float(value)


def _lifecycle_values(settings: dict, args: argparse.Namespace, role: str, engine_kind: str) -> dict:
    """`switchable` and `drain_timeout_s` ([node], then flags), checked."""
    node = section(settings, "node")
    switchable = bool(getattr(args, "switchable", None) or node.get("switchable", False))
    timeout = getattr(args, "drain_timeout_s", None) or node.get("drain_timeout_s", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout <= 86_400:
        raise SettingsError(f"[node] drain_timeout_s must be a number of seconds in [0, 86400], got {timeout!r}")
    if switchable and role not in ("prefill", "decode"):
        raise SettingsError(f"only a prefill or decode node can be switchable, not {role!r}")
    if switchable and engine_kind != "torch":
        raise SettingsError("a switchable node needs the built-in engine ([engine] kind = \"torch\")")
    return {"switchable": switchable, "drain_timeout_s": float(timeout)}


def node_settings(args: argparse.Namespace, role: str) -> NodeSettings:
    settings = load_settings(args.config)
    engine, kv = section(settings, "engine"), section(settings, "kv")
    engine_kind = _engine_kind(engine, args)
    lifecycle = _lifecycle_values(settings, args, role, engine_kind)
    # A switchable node's engine is sized for both roles: it may serve either.
    engine_values = _engine_values(settings, args, "both" if lifecycle["switchable"] else role)
    broker = args.broker or section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT)
    kv_bind = args.kv_bind or kv.get("data_bind", "tcp://127.0.0.1:0")
    kv_advertise = args.kv_advertise or kv.get("data_advertise", "")
    return NodeSettings(
        role=role,
        broker=broker,
        node_id=args.node_id,
        heartbeat=heartbeat_config(settings, args),
        model=args.model or engine.get("model", DEFAULT_MODEL),
        model_dir=args.model_dir or engine.get("model_dir"),
        engine=engine_values,
        engine_kind=engine_kind,
        kv_quant=args.kv_quant or kv.get("quant", "int8"),
        kv_compression=args.kv_compression or kv.get("compression", "auto"),
        kv_bind=kv_bind,
        kv_advertise=kv_advertise,
        kv_compile=bool(kv.get("compile", True)),
        kv_device_codec=_device_codec(kv, engine_kind, engine_values.get("device", "cpu")),
        kv_timeout_s=float(kv.get("timeout_s", 30.0)),
        kv_link_gbit=_kv_size(kv, "link_gbit", "Gbit/s", 10.0),
        kv_chunk_mib=_kv_size(kv, "chunk_mib", "MiB", None),
        local_suffix_tokens=int(section(settings, "scheduler").get("local_suffix_tokens", 64)),
        local_prefill_max_running=int(section(settings, "scheduler").get("local_prefill_max_running", 4)),
        lend=LendSettings.from_section(section(settings, "decode")),
        prefill_delay_s=args.test_prefill_delay_ms / 1000,
        step_delay_s=args.test_step_delay_ms / 1000,
        kv_faults=args.test_kv_faults,
        security=node_security(settings, args, role, broker, kv_bind, kv_advertise),
        **lifecycle,
    )
