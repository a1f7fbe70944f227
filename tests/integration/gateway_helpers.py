"""A real gateway process in front of a `ClusterProcs` cluster, for the gateway tests.

Contract: `with gateway_cluster(settings=..., gateway={...}) as (cluster, gateway):` starts a tiny
model cluster (1 prefill + 1 decode, raw KV) and `pdbus gateway` on a free port with the
`[gateway]` keys given; `gateway.url` is its base URL, `gateway.proc` its `Proc` (JSON log events).
`GatewayProc(cluster, gateway, *args)` alone: one more gateway, `args` added to its command line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from harness.cluster_procs import ClusterProcs, Proc, free_port, gateway_ready, pdbus, render_config

TINY_NAME = "SmolLM2-135M-Instruct"


class GatewayProc:
    def __init__(self, cluster: ClusterProcs, gateway: dict[str, Any] | None = None, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        sections = {**cluster.settings, "gateway": {"port": self.port, **(gateway or {})}}
        self.config_path = cluster.config_path.with_name("gateway.toml")
        self.config_path.write_text(render_config(sections))
        self.proc = Proc(pdbus("gateway", "--config", str(self.config_path), "--broker", cluster.broker_endpoint,
                               *args))

    def wait_ready(self, timeout: float = 60.0) -> None:
        if not gateway_ready(self.proc, self.url, timeout):
            raise AssertionError("the gateway never became ready:\n" + "".join(self.proc.raw[-20:]))

    def stop(self) -> None:
        self.proc.stop()


@contextlib.contextmanager
def gateway_cluster(*, settings: dict | None = None, gateway: dict | None = None, model: str = "tiny",
                    **cluster_options: Any) -> Iterator[tuple[ClusterProcs, GatewayProc]]:
    with ClusterProcs(model=model, settings=settings, **cluster_options) as cluster:
        proc = GatewayProc(cluster, gateway)
        try:
            proc.wait_ready()
            yield cluster, proc
        finally:
            proc.stop()
