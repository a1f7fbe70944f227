"""Ray's side of the pools: connecting (on loopback when the cluster is local), a local head, one
detached actor per component, finding them again from another process, and the pool's record.

Contract:
- (`pool_plan.ray_environment(address)` goes into the environment before this module is imported:
  for a local cluster the driver, the raylets and the workers then all use 127.0.0.1.)
- `connect(address, namespace)` / `disconnect()`; `start_local_head(options, num_cpus) ->
  address` (`ray start --head` on 127.0.0.1, no dashboard) and `stop_local_head()`.
- `launch(spec, config_text, namespace) -> handle`: the `ComponentActor` for `spec`
  (`pool_plan.actor_options`). `components() -> {name: handle}`: every live one in the namespace.
- `call(handle, method, *args, timeout) -> value | None`: None when the actor is restarting or gone.
- `actor_facts(handle) -> dict`: Ray's view — `ray_state`, `ray_restarts` — from the GCS (no
  dashboard needed). `ray_nodes() -> {node_id: ip}` of the live raylets.
- `KvRoleBook(namespace)`: each node's last switched role, for a reconstructed actor.
- `save_record(namespace, record)` / `load_record(namespace) -> dict | None` / `drop_record(namespace)`: what `up` started
  (config text, shape, broker addresses, options, whether it started the head), kept in the GCS's
  KV store so `status`, `down` and the planner's actuator read it from any process.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import ray
from ray.experimental import internal_kv

from nodes.ray_pools.component_runner import ComponentRunner
from nodes.ray_pools.pool_plan import ComponentSpec, RayOptions, actor_options, is_local, local_head_argv

KV_NAMESPACE = "pdbus"


def connect(address: str, namespace: str) -> None:
    ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING,
             _node_ip_address="127.0.0.1" if is_local(address) else None)


def disconnect() -> None:
    ray.shutdown()


def _ray_executable() -> str:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


def start_local_head(options: RayOptions, num_cpus: int) -> str:
    argv = local_head_argv(_ray_executable(), options, num_cpus)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"`ray start --head` failed: {done.stderr.strip()[-500:]}")
    return f"127.0.0.1:{options.head_port}"


def stop_local_head() -> None:
    subprocess.run([_ray_executable(), "stop", "--force"], capture_output=True, timeout=120)


class ComponentActor(ComponentRunner):
    """The runner as a Ray actor: it also says which raylet it is on, and keeps its node's role in
    the GCS's KV store so that a reconstructed actor starts the node in its switched role."""

    def __init__(self, spec: ComponentSpec, config_text: str) -> None:
        context = ray.get_runtime_context()
        roles = KvRoleBook(context.namespace)
        if not context.was_current_actor_reconstructed:
            roles.forget(spec.name)   # a fresh start: the planned role, whatever an old pool left
        super().__init__(spec, config_text, where=_where, roles=roles)


class KvRoleBook:
    """`component_runner.RoleBook` on the GCS's KV store: outlives any raylet but the head's."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def _key(self, name: str) -> str:
        return f"roles/{self.namespace}/{name}"

    def recall(self, name: str) -> str | None:
        raw = internal_kv._internal_kv_get(self._key(name), namespace=KV_NAMESPACE)
        return raw.decode() if raw else None

    def remember(self, name: str, role: str) -> None:
        internal_kv._internal_kv_put(self._key(name), role, overwrite=True, namespace=KV_NAMESPACE)

    def forget(self, name: str) -> None:
        internal_kv._internal_kv_del(self._key(name), namespace=KV_NAMESPACE)


def _where() -> dict:
    context = ray.get_runtime_context()
    return {"ray_node": context.get_node_id(), "ip": ray.util.get_node_ip_address(),
            "reconstructed": context.was_current_actor_reconstructed}


def launch(spec: ComponentSpec, config_text: str, namespace: str) -> Any:
    return ray.remote(ComponentActor).options(**actor_options(spec, namespace)).remote(spec, config_text)


def components() -> dict[str, Any]:
    handles = {}
    for name in ray.util.list_named_actors():
        try:
            handles[name] = ray.get_actor(name)
        except ValueError:   # it died between the listing and the lookup
            continue
    return handles


def call(handle: Any, method: str, *args: Any, timeout: float = 10.0) -> Any:
    try:
        return ray.get(getattr(handle, method).remote(*args), timeout=timeout)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError):
        return None


def kill(handle: Any) -> None:
    ray.kill(handle, no_restart=True)


def actor_facts(handle: Any) -> dict:
    # `ray.util.state` would need the dashboard, which a local pool does not run; the GCS's
    # actor table answers the same (a developer API, read in this one place). A Ray that moved
    # it leaves these columns unknown: the actor's own answer still fills the row.
    try:
        table = ray._private.state.actors(handle._actor_id.hex())
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}
    return {"ray_state": table.get("State"), "ray_restarts": table.get("NumRestarts", 0),
            "ray_node": table.get("Address", {}).get("NodeID")}


def ray_nodes() -> dict[str, str]:
    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}


def save_record(namespace: str, record: dict) -> None:
    internal_kv._internal_kv_put(f"pools/{namespace}", json.dumps(record), overwrite=True, namespace=KV_NAMESPACE)


def load_record(namespace: str) -> dict | None:
    raw = internal_kv._internal_kv_get(f"pools/{namespace}", namespace=KV_NAMESPACE)
    return json.loads(raw) if raw else None


def drop_record(namespace: str) -> None:
    internal_kv._internal_kv_del(f"pools/{namespace}", namespace=KV_NAMESPACE)
    internal_kv._internal_kv_del(f"roles/{namespace}/", del_by_prefix=True, namespace=KV_NAMESPACE)
