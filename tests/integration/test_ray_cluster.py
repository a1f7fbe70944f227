"""`pdbus ray` on a real multi-raylet Ray cluster on this machine (ray.cluster_utils: a head and two
worker raylets, all on 127.0.0.1, a few fake CPUs each), the tiny model, the real CLI.

In order, on one pool (each test starts from where the previous one left it):
1. `up` places the broker on the head (pinned by a custom resource), spreads the nodes over the
   raylets, and a request streams end to end (bus client and gateway), equal to the fault-free output;
2. a SIGKILLed node process is started again by its actor under the same id and rejoins;
3. `status` shows pools, roles, raylets, restarts and load;
4. chaos: a whole worker raylet is killed while streams run: every request completes with the
   fault-free tokens, and the lost raylet's nodes come back on the others;
5. the planner's `RayActuator` adds a decode node, then drains it (SIGTERM) while it streams:
   every request completes, and the drained node's actor is reaped;
6. a role switch (CONTROL) survives a restart of the switched node's process, and a reconstruction
   of its actor (the role kept in the GCS's KV store);
7. `down` drains and stops everything, and leaves no process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.cluster_procs import free_port
from nodes.cluster import ClusterClient
from tests.integration.cluster_helpers import greedy, load, reference, wait_until

ray = pytest.importorskip("ray", reason="the optional Ray extra is not installed (make install-ray)")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
NUM_TOKENS = 48
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
               "health_check_initial_delay_ms": 0}


def _config(broker_port: int, gateway_port: int) -> str:
    return f"""
[broker]
endpoint = "tcp://127.0.0.1:{broker_port}"
[heartbeat]
interval_ms = 250
liveness = 4
[engine]
model = "tiny"
dtype = "float32"
num_threads = 1
[prefill]
max_batch_tokens = 2048
max_wait_ms = 5
[decode]
num_kv_blocks = 512
max_num_seqs = 16
[kv]
quant = "raw"
compression = "none"
compile = false
[failover]
max_retries = 4
[node]
switchable = true
drain_timeout_s = 10
[gateway]
host = "127.0.0.1"
port = {gateway_port}
[ray]
broker_cpus = 0.5
gateway_cpus = 0.5
node_cpus = 1
broker_resources = {{pdbus_broker = 1}}
node_args = ["--test-step-delay-ms", "40"]
env = {{OMP_NUM_THREADS = "1", OMP_WAIT_POLICY = "PASSIVE"}}
start_timeout_s = 150
drain_timeout_s = 20
"""


class Pool:
    """The Ray cluster, the pool's config, and the `pdbus ray` CLI against them."""

    def __init__(self, tmp: Path) -> None:
        from ray.cluster_utils import Cluster

        self.gateway_port = free_port()
        self.broker = f"tcp://127.0.0.1:{free_port()}"
        self.config = tmp / "pool.toml"
        self.config.write_text(_config(int(self.broker.rsplit(":", 1)[1]), self.gateway_port))
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 3, "resources": {"pdbus_broker": 1}, "node_ip_address": "127.0.0.1",
            "include_dashboard": False, "_system_config": FAST_HEALTH})
        self.workers = [self.cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1") for _ in range(2)]
        self.address = self.cluster.address
        self.pids: set[int] = set()   # every component process seen: none may outlive `down`

    def cli(self, *args: str, timeout: float = 170) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "nodes.cli", "ray", *args, "--address", self.address,
                "--config", str(self.config)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})

    def status(self) -> dict:
        done = self.cli("status", "--json", timeout=60)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        self.pids |= {row["pid"] for row in report["components"] if row["pid"]}
        return report

    def rows(self) -> dict[str, dict]:
        return {row["name"]: row for row in self.status()["components"]}

    def all_ready(self) -> dict[str, dict] | None:
        rows = self.rows()
        return rows if rows and all(row["ready"] for row in rows.values()) else None

    def close(self) -> None:
        self.cli("down", "--grace-s", "5", timeout=120)
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    # Ray's one-machine mode: it otherwise swaps 127.0.0.1 for the host's outward IP (see
    # pool_plan.ray_environment); set for this process (Ray is imported) and the raylets it starts.
    os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"})
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    pool = Pool(tmp_path_factory.mktemp("ray-pool"))
    try:
        yield pool
    finally:
        pool.close()
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True,
                       timeout=120)


@pytest.fixture(scope="module")
def expected():
    model = load("tiny")
    prompts = [tuple(range(3 + i, 40 + 7 * i)) for i in range(4)]
    return {prompt: reference(model, prompt, greedy(NUM_TOKENS)) for prompt in prompts}


async def _generate(endpoint: str, prompts, session_prefix: str = "s") -> list[list[int]]:
    return [tokens for tokens, _ in await _runs(endpoint, prompts, session_prefix)]


async def _runs(endpoint: str, prompts, session_prefix: str, streaming: asyncio.Event | None = None) -> list:
    """(token ids, trace) per prompt, run at once; `streaming` is set once every stream has a token."""
    started: set[int] = set()

    async def run(client: ClusterClient, index: int, prompt) -> tuple[list[int], object]:
        generation = client.generate(list(prompt), greedy(NUM_TOKENS), session_id=f"{session_prefix}-{index}")
        tokens = []
        async for token in generation:
            tokens.append(token.token_id)
            started.add(index)
            if streaming is not None and len(started) == len(prompts):
                streaming.set()
        return tokens, generation.result.trace

    async with ClusterClient(endpoint, max_retries=4, stall_timeout_s=20) as client:
        return await asyncio.gather(*(run(client, i, p) for i, p in enumerate(prompts)))


def test_up_places_each_component_and_a_request_streams_end_to_end(pool, expected):
    done = pool.cli("up", "--prefill", "1", "--decode", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = pool.rows()
    assert sorted(rows) == ["broker", "decode-0", "decode-1", "gateway", "prefill-0"]
    assert all(row["ready"] and row["state"] == "ready" for row in rows.values())
    assert rows["broker"]["ray_node"] == pool.cluster.head_node.node_id   # pinned by its resource
    assert len({rows[name]["ray_node"] for name in ("prefill-0", "decode-0", "decode-1")}) >= 2   # SPREAD
    assert asyncio.run(_generate(pool.broker, list(expected))) == list(expected.values())
    response = httpx.post(f"http://127.0.0.1:{pool.gateway_port}/v1/completions", timeout=60,
                          json={"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 3})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3


def test_a_killed_node_process_is_started_again_and_rejoins(pool, expected):
    before = pool.rows()["decode-0"]
    os.kill(before["pid"], signal.SIGKILL)
    after = wait_until(lambda: (row := pool.rows()["decode-0"])["ready"] and row["pid"] != before["pid"] and row,
                       timeout=60, message="decode-0 back")
    assert after["restarts"]["process"] == before["restarts"]["process"] + 1
    assert after["ray_node"] == before["ray_node"] and after["restarts"]["actor"] == before["restarts"]["actor"]
    wait_until(lambda: "decode-0" in (pool.status()["broker_stats"] or {}).get("capacity_by_node", {}),
               timeout=30, message="decode-0 registered again")
    assert asyncio.run(_generate(pool.broker, list(expected)[:2], "after-kill")) == list(expected.values())[:2]


def test_status_shows_pools_roles_raylets_restarts_and_load(pool):
    done = pool.cli("status", timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("pools: broker 1/1 ready, prefill 1/1 ready, decode 2/2 ready, gateway 1/1 ready;")
    assert lines[1].split()[:4] == ["NAME", "POOL", "ROLE", "STATE"]
    decode = next(line for line in lines if line.startswith("decode-0"))
    assert "ready" in decode and "running 0/16" in decode and "kv free" in decode and " 0/1 " in decode
    assert pool.status()["broker_stats"]["role_by_node"]["prefill-0"] == "prefill"


def _victim(pool) -> tuple[object, list[str]]:
    """A worker raylet (never the head: it holds the GCS) that runs a decode node, else any node."""
    rows = pool.rows()
    hosted = {worker: [name for name, row in rows.items() if row["ray_node"] == worker.node_id and name != "gateway"]
              for worker in pool.workers}
    ranked = sorted(hosted.items(), key=lambda item: not any(n.startswith("decode") for n in item[1]))
    worker, names = ranked[0]
    assert names, f"no worker raylet runs a node: {rows}"
    return worker, names


def test_chaos_a_killed_raylet_loses_no_request_and_its_nodes_come_back_elsewhere(pool, expected):
    victim, lost = _victim(pool)
    prompts = list(expected) * 2

    async def streams_and_kill() -> list:
        streaming = asyncio.Event()
        task = asyncio.create_task(_runs(pool.broker, prompts, "chaos", streaming))
        await asyncio.wait_for(streaming.wait(), 60)   # every stream has tokens, none is done (40 ms a step)
        await asyncio.to_thread(pool.cluster.remove_node, victim, False)
        return await task

    runs = asyncio.run(streams_and_kill())
    assert [tokens for tokens, _ in runs] == [expected[p] for p in prompts]
    if any(name.startswith("decode") for name in lost):
        assert any(trace.failed_over for _, trace in runs), [trace.failures for _, trace in runs]
    rows = wait_until(pool.all_ready, timeout=90, message="every component ready again")
    assert all(rows[name]["ray_node"] != victim.node_id for name in rows)
    assert all(rows[name]["restarts"]["actor"] >= 1 for name in lost)
    assert asyncio.run(_generate(pool.broker, list(expected)[:2], "after-chaos")) == list(expected.values())[:2]


def test_the_actuator_adds_a_node_and_drains_it_away_mid_stream(pool, expected):
    from nodes.ray_pools.ray_actuator import RayActuator

    ray.init(address=pool.address, namespace="pdbus", _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        actuator = RayActuator.from_cluster("pdbus")
        assert actuator is not None and actuator.can_start()
        assert actuator.start_node("decode") == "decode-2"
        added = wait_until(lambda: (row := pool.rows().get("decode-2")) and row["ready"] and row,
                           timeout=90, message="decode-2 ready")
        wait_until(lambda: "decode-2" in (pool.status()["broker_stats"] or {}).get("capacity_by_node", {}),
                   timeout=30, message="decode-2 on the ring")
        prompts = list(expected) * 3
        first = asyncio.run(_runs(pool.broker, prompts, "drain"))   # sessions stick to their node
        on_added = [i for i, (_, trace) in enumerate(first) if trace.decode_node_ids == ["decode-2"]]
        assert on_added, [trace.decode_node_ids for _, trace in first]

        async def streams_and_drain() -> list:
            streaming = asyncio.Event()
            task = asyncio.create_task(_runs(pool.broker, prompts, "drain", streaming))
            await asyncio.wait_for(streaming.wait(), 60)
            await asyncio.to_thread(actuator.stop_node, "decode-2")   # SIGTERM: it drains
            return await task

        runs = asyncio.run(streams_and_drain())
        assert [tokens for tokens, _ in runs] == [expected[p] for p in prompts]
        assert all(runs[i][1].decode_node_ids[0] == "decode-2" for i in on_added)   # it was serving them
        wait_until(lambda: actuator.reap() == ["decode-2"], timeout=40, message="decode-2 drained and reaped")
    finally:
        ray.shutdown()
    assert "decode-2" not in pool.rows()
    wait_until(lambda: not os.path.exists(f"/proc/{added['pid']}"), timeout=10, message="its process gone")


def test_a_role_switch_survives_a_restart_of_the_node_process_and_of_its_actor(pool):
    from bus.endpoint import Endpoint

    control = Endpoint(pool.broker, "control", "ray-test-control").start()
    try:
        assert control.wait_registered(10)
        control.send_control("decode-1", {"action": "role", "role": "prefill"})
        wait_until(lambda: pool.rows()["decode-1"]["role"] == "prefill", timeout=40, message="decode-1 switched")
    finally:
        control.stop()
    before = pool.rows()["decode-1"]
    os.kill(before["pid"], signal.SIGKILL)
    wait_until(lambda: (row := pool.rows()["decode-1"])["ready"] and row["pid"] != before["pid"], timeout=60,
               message="decode-1 back")
    stats = wait_until(lambda: (s := pool.status()["broker_stats"]) and "decode-1" in s["role_by_node"] and s,
                       timeout=30, message="decode-1 registered again")
    assert stats["role_by_node"]["decode-1"] == "prefill"   # it came back in the role it had switched to
    # Its actor's worker dies (as with its raylet): Ray reconstructs the actor from the planned
    # spec (decode), and the role book in the GCS brings the node back as prefill.
    before = pool.rows()["decode-1"]
    os.kill(before["actor_pid"], signal.SIGKILL)
    row = wait_until(lambda: (r := pool.rows().get("decode-1")) and r["ready"] and r["actor_pid"] != before["actor_pid"]
                     and r, timeout=90, message="decode-1's actor reconstructed")
    assert row["role"] == "prefill"
    stats = wait_until(lambda: (s := pool.status()["broker_stats"]) and s["role_by_node"].get("decode-1") == "prefill"
                       and s, timeout=30, message="decode-1 registered again as prefill")


def test_down_drains_and_stops_everything(pool):
    pool.status()   # the latest pids
    done = pool.cli("down", "--grace-s", "20")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("stopped: broker, decode-0, decode-1, gateway")
    assert pool.status()["components"] == []
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pool.pids), timeout=15,
               message="no component process left")
