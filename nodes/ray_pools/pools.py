"""`pdbus ray up | status | down`: the pools' lifecycle on a Ray cluster (Ray connected by the caller).

Contract:
- `up(pool, out) -> exit code`: refuses (1) when the namespace already holds components; else
  records the pool (`placement.save_record`), starts the brokers and waits until each logged
  `broker_started`, then the nodes and the gateway until each registered / serves, within
  `[ray] start_timeout_s`. A component that is not ready by then is named with its last log lines
  (exit 1; the pool stays, for `status` and `down`). `pool` is a `Pool`: the plan and what
  `status`, `down` and the planner need later.
- `status(namespace, timeout_s) -> report` (`status_table.status_report`): every component's
  actor answer and Ray facts, the live raylets, one broker's stats.
- `down(namespace, grace_s, out) -> bool`: SIGTERM the nodes (a node drains: takes no new
  work, finishes or hands over its streams, exits 0), then the gateway, then the brokers, each
  group waited for up to `grace_s` then SIGKILLed; then the actors are killed (their processes die
  with them) and the record dropped. True when the record says `up` started the head (the
  caller then stops it).
"""

from __future__ import annotations

import time
import tomllib
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from nodes.ray_pools import placement
from nodes.ray_pools.broker_probe import broker_stats
from nodes.ray_pools.pool_plan import ComponentSpec, kind_of
from nodes.ray_pools.status_table import component_row, status_report

POLL_S = 0.5
CALL_TIMEOUT_S = 10.0
DOWN_ORDER = (("prefill", "decode", "both"), ("gateway",), ("broker",))


@dataclass
class Pool:
    namespace: str
    config_text: str
    specs: list[ComponentSpec]
    start_timeout_s: float
    record: dict[str, Any] = field(default_factory=dict)   # shape, addresses, options, local_head


def up(pool: Pool, out: TextIO) -> int:
    existing = sorted(placement.components())
    if existing:
        print(f"pdbus ray up: namespace {pool.namespace!r} already runs {', '.join(existing)}; "
              "`pdbus ray down` first", file=out)
        return 1
    placement.save_record(pool.namespace, {**pool.record, "config_text": pool.config_text})
    for stage in (0, 1):
        specs = [spec for spec in pool.specs if spec.stage == stage]
        handles = {spec.name: placement.launch(spec, pool.config_text, pool.namespace) for spec in specs}
        late = wait_ready(handles, pool.start_timeout_s)
        if late:
            _report_late(late, handles, out)
            return 1
        print(f"ready: {', '.join(handles)}", file=out)
    return 0


def wait_ready(handles: dict[str, Any], timeout_s: float) -> list[str]:
    """The names not ready within `timeout_s` (empty: all are)."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(handles)
    while waiting and time.monotonic() < deadline:
        for name, handle in list(waiting.items()):
            info = placement.call(handle, "info", timeout=CALL_TIMEOUT_S)
            if info is not None and info["ready"]:
                del waiting[name]
        if waiting:
            time.sleep(POLL_S)
    return sorted(waiting)


def _report_late(late: list[str], handles: dict[str, Any], out: TextIO) -> None:
    for name in late:
        info = placement.call(handles[name], "info", timeout=CALL_TIMEOUT_S) or {}
        tail = placement.call(handles[name], "tail", 10, timeout=CALL_TIMEOUT_S) or []
        print(f"pdbus ray up: {name} not ready (state {info.get('state', 'unknown')}, "
              f"exit {info.get('last_exit')}); its last log lines:", file=out)
        for line in tail:
            print(f"  {line}", file=out)
    print("the pool stays as it is: `pdbus ray status`, `pdbus ray down`", file=out)


def status(namespace: str, timeout_s: float = 5.0) -> dict:
    handles = placement.components()
    infos = {name: placement.call(handle, "info", timeout=timeout_s) for name, handle in handles.items()}
    facts = {name: placement.actor_facts(handle) for name, handle in handles.items()}
    record = placement.load_record(namespace) or {}
    stats = _stats(record, timeout_s) if handles else None
    rows = [component_row(name, infos[name], facts[name], stats) for name in handles]
    return status_report(rows, placement.ray_nodes(), stats)


def _stats(record: dict, timeout_s: float) -> dict | None:
    endpoints = [address for _, address in record.get("addresses", [])]
    if not endpoints:
        return None
    return broker_stats(tomllib.loads(record.get("config_text", "")), endpoints, timeout_s)


def down(namespace: str, grace_s: float, out: TextIO) -> bool:
    handles = placement.components()
    for kinds in DOWN_ORDER:
        group = {name: handle for name, handle in handles.items() if kind_of(name) in kinds}
        stop_group(group, grace_s, out)
    for handle in handles.values():
        placement.call(handle, "close", timeout=CALL_TIMEOUT_S)
        placement.kill(handle)
    record = placement.load_record(namespace) or {}
    placement.drop_record(namespace)
    print(f"stopped: {', '.join(sorted(handles)) or 'nothing was running'}", file=out)
    return bool(record.get("local_head"))


def stop_group(group: dict[str, Any], grace_s: float, out: TextIO) -> None:
    """SIGTERM each (a node drains), wait up to `grace_s` for all, SIGKILL the rest."""
    for handle in group.values():
        placement.call(handle, "drain", timeout=CALL_TIMEOUT_S)
    deadline = time.monotonic() + grace_s
    for name, handle in group.items():
        left = max(0.0, deadline - time.monotonic())
        if not placement.call(handle, "wait_exited", left, timeout=left + CALL_TIMEOUT_S):
            print(f"{name} did not stop within {grace_s:g} s: killed", file=out)
            placement.call(handle, "drain", True, timeout=CALL_TIMEOUT_S)


def pool_record(shape: Any, addresses: list[tuple[str, str]], options: Any, log_level: str | None,
                env: dict[str, str], local_head: bool) -> dict[str, Any]:
    """What the actuator and `status` need to know about the pool later, as JSON."""
    return {"shape": asdict(shape), "addresses": [list(pair) for pair in addresses], "options": asdict(options),
            "log_level": log_level, "env": env, "local_head": local_head}
