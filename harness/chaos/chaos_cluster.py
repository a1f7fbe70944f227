"""The chaos harness's cluster: `ClusterProcs` whose nodes run with the data-plane hooks
(`harness.chaos.hooked_node`), one decode node optionally behind `PartitionProxy`s (its bus
links to the brokers, and its KV data endpoint, which it advertises at the proxy's port so prefill
nodes dial through it), and the gateway as one more process.

Contract:
    with ChaosCluster(num_prefill=2, num_decode=2, model="tiny", kv_quant="raw",
                      proxied="decode-1", gateway=True) as cluster:
        cluster.gateway_url                       # "http://127.0.0.1:PORT" (None without a gateway)
        cluster.control(flip=4) / control(drop=2)  # the next N KV chunks sent by the prefill nodes
        cluster.kv_idle()                          # {decode node: bool}: every KV block free again
        cluster.revive(node_id)                    # restart a killed node under the same id
        cluster.cut() / cluster.heal()             # partition the proxied node: bus and KV links
        cluster.count(event, role=None, **fields)  # log events summed over live and dead processes
Every process is started by PID and stopped by PID (`stop()`, also on errors in `start()`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from harness.cluster_procs import (
    ClusterProcs,
    Proc,
    free_port,
    gateway_ready,
    pdbus,
    poll_until,
    render_config,
)

if TYPE_CHECKING:
    from harness.chaos.proxy import PartitionProxy

GATEWAY_SETTINGS = {"stall_timeout_s": 3.0, "stream_buffer_tokens": 16, "send_buffer_bytes": 4096,
                    "max_streams_per_key": 0, "rate_limit_rps": 0.0}


class ChaosCluster(ClusterProcs):
    def __init__(self, *, proxied: str | None = None, gateway: bool = True, **options: Any) -> None:
        super().__init__(**options)
        self.proxied = proxied
        self.proxies: list[PartitionProxy] = []   # the proxied node's bus links (one per broker)
        self.kv_proxy: PartitionProxy | None = None   # and its KV data endpoint (decode nodes)
        self.with_gateway = gateway
        self.gateway: Proc | None = None
        self.gateway_url: str | None = None
        self.control_path = Path(self._dir.name) / "kv-faults.json"
        self.dead: list[tuple[str, Proc]] = []     # (node id, process) killed and revived: kept for their logs

    # -- processes ------------------------------------------------------------------------
    def start_node(self, role: str, node_id: str) -> Proc:
        command = [role] if role in ("prefill", "decode") else ["node", "--role", "both"]
        broker = []
        if node_id == self.proxied:
            from harness.chaos.proxy import PartitionProxy
            self.proxies = self.proxies or [PartitionProxy(port).start() for port in self.ports]
            broker = ["--broker", ",".join(f"tcp://127.0.0.1:{proxy.port}" for proxy in self.proxies)]
            if role != "prefill":   # it receives KV: prefill nodes reach it only through the proxy too
                self.kv_proxy = self.kv_proxy or PartitionProxy(free_port()).start()
                broker += ["--kv-bind", f"tcp://127.0.0.1:{self.kv_proxy.target_port}",
                           "--kv-advertise", f"tcp://127.0.0.1:{self.kv_proxy.port}"]
        faults = ["--test-kv-faults", "1"] if role != "decode" else []   # builds the (unarmed) injector
        args = pdbus(*command, "--node-id", node_id, *self._common(), *broker, *faults, *self.extra_args.get(role, []))
        hooked = [sys.executable, "-m", "harness.chaos.hooked_node", "--control", str(self.control_path), "--", *args[3:]]
        node = Proc(hooked)
        self.nodes[node_id] = node
        return node

    def start(self, timeout: float = 120.0) -> Self:
        super().start(timeout)
        if self.with_gateway:
            self.start_gateway()
        return self

    def start_gateway(self, timeout: float = 60.0) -> None:
        port = free_port()
        path = self.config_path.with_name("gateway.toml")
        path.write_text(render_config({**self.settings, "gateway": {"port": port, **GATEWAY_SETTINGS}}))
        self.gateway = Proc(pdbus("gateway", "--config", str(path), "--broker", self.broker_endpoint))
        self.gateway_url = f"http://127.0.0.1:{port}"
        if not gateway_ready(self.gateway, self.gateway_url, timeout):
            raise RuntimeError("the gateway never became ready:\n" + "".join(self.gateway.raw[-20:]))

    def revive(self, node_id: str, timeout: float = 60.0) -> None:
        """Restart a dead node under its id (kept logs: `dead`) and wait until it joined."""
        old = self.nodes[node_id]
        if old.alive:
            return
        self.dead.append((node_id, old))
        role = node_id.rsplit("-", 1)[0]
        broker = self.broker
        assert broker is not None, "the cluster was never started"
        joined = len(broker.find("node_joined", node_id=node_id))
        self.start_node(role, node_id)
        broker.wait_for("node_joined", timeout=timeout, node_id=node_id, count=joined + 1)

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        try:
            super().stop()
        finally:
            for proxy in self.partition_proxies():
                proxy.stop()

    # -- the partition ----------------------------------------------------------------------
    def partition_proxies(self) -> list[PartitionProxy]:
        return [p for p in (*self.proxies, self.kv_proxy) if p is not None]

    def cut(self) -> None:
        """Swallow every byte between the proxied node and the rest (broker and KV senders)."""
        for proxy in self.partition_proxies():
            proxy.cut()

    def heal(self) -> None:
        for proxy in self.partition_proxies():
            proxy.heal()

    def bytes_swallowed(self) -> dict[str, int]:
        return {"bus": sum(proxy.num_bytes_swallowed for proxy in self.proxies),
                "kv": self.kv_proxy.num_bytes_swallowed if self.kv_proxy else 0}

    def num_kv_connections(self) -> int:
        """Connections prefill nodes opened to the proxied node's KV endpoint (through its proxy)."""
        return self.kv_proxy.num_connections if self.kv_proxy else 0

    # -- faults and observations ----------------------------------------------------------
    def control(self, **order: Any) -> None:
        """Orders for the hooked nodes (`harness.chaos.hooked_node`): `flip=N` / `drop=N` (each prefill
        node corrupts / drops its next N KV chunks), `prefill_delay_ms=X` (slow prefills); {} = calm.
        Written to a temporary file and renamed, so a node never reads it half-written."""
        partial = self.control_path.with_suffix(".tmp")
        partial.write_text(json.dumps(order))
        os.replace(partial, self.control_path)

    def processes(self, role: str | None = None) -> list[Proc]:
        return [p for node_id, p in [*self.dead, *self.nodes.items()] if role is None or node_id.startswith(role)]

    def count(self, event: str, role: str | None = None, **fields: Any) -> int:
        return sum(len(p.find(event, **fields)) for p in self.processes(role))

    def decode_ids(self) -> list[str]:
        return [n for n in self.nodes if not n.startswith("prefill")]

    def kv_capacity(self, node_id: str) -> dict | None:
        updates = self.nodes[node_id].find("capacity_updated")
        return updates[-1]["capacity"] if updates else None

    def kv_idle(self) -> dict[str, bool]:
        """Per live decode node: its last published capacity shows every KV block free (finished
        sessions' blocks count as free: they are evictable) and nothing running."""
        state = {}
        for node_id in self.decode_ids():
            capacity = self.kv_capacity(node_id) or {}
            state[node_id] = (self.nodes[node_id].alive and capacity.get("kv_blocks_free") == capacity.get("kv_blocks_total")
                              and not capacity.get("num_running"))
        return state

    def wait_kv_idle(self, timeout: float = 20.0) -> dict[str, bool]:
        """Every decode node's KV state once all are idle, or the last state seen after `timeout`."""
        def all_idle() -> dict[str, bool] | None:
            state = self.kv_idle()
            return state if all(state.values()) else None
        return poll_until(all_idle, timeout, interval=0.1) or self.kv_idle()

    def rss_mib(self) -> dict[str, float]:
        """Resident memory per live node process (from /proc), in MiB."""
        sizes = {}
        for node_id, proc in self.nodes.items():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{proc.process.pid}/status").read_text()
                kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
                sizes[node_id] = round(kib / 1024, 1)
        return sizes

    def node_pids(self) -> dict[str, int]:
        """Per live node, its process id (a revived node has a new one)."""
        return {node_id: proc.process.pid for node_id, proc in self.nodes.items() if proc.alive}

    def thaw_all(self) -> None:
        for proc in self.nodes.values():
            proc.signal(signal.SIGCONT)
