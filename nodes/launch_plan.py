"""What a local cluster starts, in order (pure data: nodes/launcher.py's Supervisor runs it).

Contract:
- `cluster_plan(...) -> list[ChildSpec]` (pure): the broker first, then `pdbus prefill` x N and
  `pdbus decode` x M (or `pdbus node --role both` x K when colocated; `pdbus node --idle --role R`
  for nodes without an engine), then `pdbus gateway --node-id gateway --workers N` when the shape
  asks for it (its bus id is its name, or `gateway-w0`..`gateway-w<N-1>` for N workers: its
  `bus_ids`, so `cluster_ready` waits for every worker too). Node ids are stable
  (`prefill-0`, `decode-1`, `both-0`), so the scheduler's hash ring places sessions the same way
  on every start.
- `node_spec(role, node_id, shape)`: one node's child, as the plan and a planner that adds nodes
  start it; `broker_endpoints(first, k)`: each broker's name and endpoint.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChildSpec:
    name: str                 # the node id (or "broker")
    argv: tuple[str, ...]     # without --broker: the supervisor adds it once the broker is up
    is_broker: bool = False
    bus_ids: tuple[str, ...] = ()   # the node ids it registers with the broker, when not just `name`


@dataclass(frozen=True)
class ClusterShape:
    num_prefill: int = 1
    num_decode: int = 1
    num_colocated: int = 0    # > 0: that many `both` nodes instead of prefill/decode ones
    idle: bool = False        # nodes without an engine (`pdbus node --idle`)
    model: str | None = None
    node_args: tuple[str, ...] = field(default_factory=tuple)   # passed to every node
    gateway: bool = False     # also run the OpenAI gateway ([gateway] host:port)
    gateway_workers: int = 1  # its processes (`pdbus gateway --workers N`)
    num_brokers: int = 1      # brokers of the one cluster (docs/CLUSTER.md "Several brokers")


def _pdbus(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "nodes.cli", *args, "--log-format", "json")


def cluster_plan(shape: ClusterShape, broker_endpoint: str, common: tuple[str, ...] = ()) -> list[ChildSpec]:
    """What to start, in order; `common` (e.g. --config, --log-level) goes to every child."""
    plan = [ChildSpec(name, _pdbus("broker", "--endpoint", endpoint, *common), True)
            for name, endpoint in broker_endpoints(broker_endpoint, shape.num_brokers)]
    roles = ([("both", shape.num_colocated)] if shape.num_colocated > 0
             else [("prefill", shape.num_prefill), ("decode", shape.num_decode)])
    plan += [node_spec(role, f"{role}-{index}", shape, common) for role, count in roles for index in range(count)]
    if shape.gateway:
        model = ("--model", shape.model) if shape.model else ()
        workers = shape.gateway_workers
        bus_ids = tuple(f"gateway-w{i}" for i in range(workers)) if workers > 1 else ()
        plan.append(ChildSpec("gateway", _pdbus("gateway", *model, "--node-id", "gateway", "--workers", str(workers),
                                                *common), bus_ids=bus_ids))
    return plan


def node_spec(role: str, node_id: str, shape: ClusterShape, common: tuple[str, ...] = ()) -> ChildSpec:
    return ChildSpec(node_id, _pdbus(*_node_command(role, shape), "--node-id", node_id, *common, *shape.node_args))


def broker_endpoints(first: str, num_brokers: int) -> list[tuple[str, str]]:
    """(name, endpoint) of each broker: `broker` alone, else `broker-i` on the port after the
    previous one (port 0: each picks its own)."""
    if num_brokers == 1:
        return [("broker", first)]
    base, _, port = first.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"several brokers need a tcp://host:port endpoint, got {first!r}")
    return [(f"broker-{i}", f"{base}:{int(port) + i if int(port) else 0}") for i in range(num_brokers)]


def _node_command(role: str, shape: ClusterShape) -> tuple[str, ...]:
    if shape.idle:
        return ("node", "--idle", "--role", role)
    command = ("node", "--role", "both") if role == "both" else (role,)
    return (*command, "--model", shape.model) if shape.model else command
