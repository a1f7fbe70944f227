"""What `pdbus ray up` places on a Ray cluster, as plain data (no Ray import here).

Contract:
- `RayOptions.from_settings(settings)`: the `[ray]` table, checked (SettingsError): `namespace`
  ("pdbus"), `broker_cpus` (0.5), `node_cpus` (1.0), `gateway_cpus` (0.5), `node_gpus` (1 when
  `[engine] device` is CUDA, else 0), `spread` (true: nodes go to raylets in turn, so one lost
  raylet takes a share of each pool), `broker_resources` / `node_resources` (custom Ray
  resources each asks for: pin brokers where their address lives), `env` (extra environment for
  every process), `node_args` (extra flags for every node, e.g. `["--switchable"]`), `start_timeout_s` (180), `drain_timeout_s` (60), and for a local head
  `head_port` (6379) and `head_cpus` (0: the machine's count).
- `broker_addresses(endpoint, num_brokers) -> [(name, endpoint)]`: a comma-separated list is
  taken as is (its length must match), one address is spread over consecutive ports (as
  `pdbus cluster --brokers`); port 0 is refused: a broker restarted by Ray must bind its address
  again, and every node and client must find it there.
- `pool_plan(shape, addresses, options, log_level) -> [ComponentSpec]`: brokers first (stage 0),
  then the nodes and the gateway (stage 1), argv from `nodes.launch_plan.cluster_plan` with the
  config file as `CONFIG_SLOT` (each actor writes the config text on its own host) and every
  broker's address. `node_component(role, node_id, ...)` is one node more (the planner's).
- `actor_options(spec, namespace) -> dict`: the `.options(...)` of its Ray actor: named,
  detached, restarted for ever, its CPUs/GPUs/resources, SPREAD for nodes when `spread`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nodes.config_file import SettingsError, section
from nodes.launch_plan import ChildSpec, ClusterShape, cluster_plan, node_spec

CONFIG_SLOT = "{pdbus-config}"   # replaced by the path of the config file the actor wrote
NODE_KINDS = ("prefill", "decode", "both")
READY_EVENTS = {"broker": "broker_started", "gateway": "gateway_started"}   # nodes: "registered"
FORWARDED_PREFIXES = ("PDBUS__",)   # config overrides reach every process, wherever it runs


@dataclass(frozen=True)
class RayOptions:
    namespace: str = "pdbus"
    broker_cpus: float = 0.5
    node_cpus: float = 1.0
    gateway_cpus: float = 0.5
    node_gpus: float = 0.0
    spread: bool = True
    broker_resources: Mapping[str, float] = field(default_factory=dict)
    node_resources: Mapping[str, float] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    node_args: tuple[str, ...] = ()
    start_timeout_s: float = 180.0
    drain_timeout_s: float = 60.0
    head_port: int = 6379
    head_cpus: int = 0

    @classmethod
    def from_settings(cls, settings: dict) -> RayOptions:
        table = dict(section(settings, "ray"))
        unknown = set(table) - set(cls.__dataclass_fields__)
        if unknown:
            raise SettingsError(f"[ray] has unknown keys: {sorted(unknown)}")
        device = str(section(settings, "engine").get("device", "cpu"))
        table.setdefault("node_gpus", 1.0 if device.startswith("cuda") else 0.0)
        try:
            return replace(cls(), **{key: _checked(key, value) for key, value in table.items()})
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"[ray] {exc}") from exc


def _checked(key: str, value: Any) -> Any:
    default = getattr(RayOptions(), key)
    if isinstance(default, bool | str):
        if type(value) is not type(default) or (isinstance(value, str) and not value):
            raise ValueError(f"{key} must be a {type(default).__name__}, got {value!r}")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(arg, str) for arg in value):
            raise ValueError(f"{key} must be a list of strings, got {value!r}")
        return tuple(value)
    if isinstance(default, Mapping):
        if not isinstance(value, Mapping):
            raise ValueError(f"{key} must be a table, got {value!r}")
        return {str(k): (str(v) if key == "env" else _number(f"{key}.{k}", v)) for k, v in value.items()}
    number = _number(key, value)
    return int(number) if isinstance(default, int) else number


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{key} must be a number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ComponentSpec:
    name: str                        # the actor's name and the process's bus id (`decode-1`, `broker-0`)
    kind: str                        # broker | prefill | decode | both | gateway
    argv: tuple[str, ...]            # CONFIG_SLOT where the config path goes
    num_cpus: float
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    spread: bool = False
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def stage(self) -> int:
        return 0 if self.kind == "broker" else 1

    @property
    def ready_event(self) -> str:
        return READY_EVENTS.get(self.kind, "registered")

    @property
    def is_node(self) -> bool:
        return self.kind in NODE_KINDS


def kind_of(name: str) -> str:
    """A component's pool from its name: `broker`, `broker-1`, `decode-0`, `gateway`."""
    base, _, index = name.rpartition("-")
    return base if base and index.isdigit() else name


def broker_addresses(endpoint: str, num_brokers: int) -> list[tuple[str, str]]:
    listed = [part.strip() for part in endpoint.split(",") if part.strip()]
    if len(listed) > 1:
        if num_brokers not in (1, len(listed)):
            raise SettingsError(f"[broker] endpoint lists {len(listed)} brokers, --brokers asks for {num_brokers}")
        addresses = [(f"broker-{i}", address) for i, address in enumerate(listed)]
    else:
        base, _, port = endpoint.rpartition(":")
        if not port.isdigit():
            raise SettingsError(f"under Ray a broker needs a tcp://host:port endpoint, got {endpoint!r}")
        addresses = ([("broker", endpoint)] if num_brokers == 1 else
                     [(f"broker-{i}", f"{base}:{int(port) + i}") for i in range(num_brokers)])
    if any(address.rsplit(":", 1)[-1] == "0" for _, address in addresses):
        raise SettingsError("under Ray every broker needs a fixed port (a restarted broker binds it again), not 0")
    return addresses


def is_local(address: str | None) -> bool:
    """No address (a head `up` starts), `auto` (the one `ray start` left on this machine), or loopback."""
    return address in (None, "auto") or str(address).rsplit(":", 1)[0] in ("127.0.0.1", "localhost")


def ray_environment(address: str | None) -> dict[str, str]:
    """Set before Ray is imported. For a cluster on this machine, Ray's single-machine mode: it
    otherwise swaps a loopback address for the host's outward IP, which a GCS bound to 127.0.0.1
    does not answer on, and nothing of ours should listen beyond loopback here."""
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    if is_local(address):
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return env


def common_args(log_level: str | None) -> tuple[str, ...]:
    return ("--config", CONFIG_SLOT, *(("--log-level", log_level) if log_level else ()))


def forwarded_env(options: RayOptions, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if environ is None else environ
    return {**{k: v for k, v in source.items() if k.startswith(FORWARDED_PREFIXES)}, **options.env}


def pool_plan(shape: ClusterShape, addresses: list[tuple[str, str]], options: RayOptions,
              log_level: str | None = None, env: Mapping[str, str] | None = None) -> list[ComponentSpec]:
    common = common_args(log_level)
    shape = replace(shape, num_brokers=1, node_args=(*shape.node_args, *options.node_args))
    children = cluster_plan(shape, addresses[0][1], common)
    broker_argv = children[0].argv
    env = dict(env or {})
    specs = [ComponentSpec(name, "broker", _with_flag(broker_argv, "--endpoint", address), options.broker_cpus,
                           resources=dict(options.broker_resources), env=env) for name, address in addresses]
    everyone = ",".join(address for _, address in addresses)
    return specs + [_component(child, everyone, options, env) for child in children[1:]]


def node_component(role: str, node_id: str, shape: ClusterShape, addresses: list[tuple[str, str]],
                   options: RayOptions, log_level: str | None = None,
                   env: Mapping[str, str] | None = None) -> ComponentSpec:
    shape = replace(shape, node_args=(*shape.node_args, *options.node_args))
    child = node_spec(role, node_id, shape, common_args(log_level))
    return _component(child, ",".join(address for _, address in addresses), options, dict(env or {}))


def _component(child: ChildSpec, brokers: str, options: RayOptions, env: dict[str, str]) -> ComponentSpec:
    argv = (*child.argv, "--broker", brokers)
    if child.name == "gateway":
        return ComponentSpec("gateway", "gateway", argv, options.gateway_cpus, env=env)
    kind = kind_of(child.name)
    return ComponentSpec(child.name, kind, argv, options.node_cpus, options.node_gpus,
                         dict(options.node_resources), options.spread, env)


def _with_flag(argv: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    at = argv.index(flag)
    return (*argv[:at + 1], value, *argv[at + 2:])


def actor_options(spec: ComponentSpec, namespace: str) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": spec.name, "namespace": namespace, "lifetime": "detached",
        # Ray restarts the actor (on another raylet if its own is gone) for ever; calls made
        # while it restarts are not retried (status must not hang on a restarting actor).
        "max_restarts": -1, "max_task_retries": 0,
        "num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus,
        "max_concurrency": 4,   # `info` answers while `wait_exited` waits
    }
    if spec.resources:
        options["resources"] = dict(spec.resources)
    if spec.spread:
        options["scheduling_strategy"] = "SPREAD"
    return options


def local_head_argv(ray_executable: str, options: RayOptions, num_cpus: int) -> list[str]:
    """`ray start --head` for a one-machine cluster: loopback only, no dashboard, no usage stats."""
    return [ray_executable, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={options.head_port}",
            "--include-dashboard=false", "--disable-usage-stats", f"--num-cpus={num_cpus}"]


def cpus_needed(specs: list[ComponentSpec]) -> int:
    """A local head's CPUs: the plan's requests, rounded up, and never fewer than the machine has."""
    return max(os.cpu_count() or 1, -int(-sum(spec.num_cpus for spec in specs) // 1))
